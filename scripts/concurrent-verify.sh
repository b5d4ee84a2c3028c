#!/usr/bin/env bash
# Verification under contention: PROCS processes share the GPU at once, ROUNDS times over, each verifying the router
# against the CPU reference (`bench route --verify-only`: the decode, token-mask and grid instances). Work that is
# not ordered against a caller's non-blocking stream (a plain cudaMemset or cudaMemcpy) tends to show only when the
# GPU is shared like this: with the bench's unordered poison (before 23c2cf0), 57 of 64 such runs on an H100 reported
# a wrong plan, while every test run alone passed.
#   scripts/concurrent-verify.sh BIN OUT_DIR [PROCS] [ROUNDS]
#   e.g. scripts/concurrent-verify.sh build/tools/moekit /tmp/cv 16 4
# Exit status 0 when every process verified; otherwise 1, with the count and the first mismatches printed.
set -uo pipefail
if [[ $# -lt 2 ]]; then
  sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
bin="$1" out="$2" procs="${3:-16}" rounds="${4:-4}"
mkdir -p "$out"
rm -f "$out"/cv_*.log "$out"/cv_*.rc

one() {  # one LOG: the router's small calls on E = 512 and the DeepSeek-V3 fixtures, verified
  local log="$1" rc=0
  "$bin" bench route --verify-only --experts 512 --top-k 8 --block 16 --tokens 1,2,4,8,16,32,64,1000 >"$log" 2>&1 ||
    rc=$?
  "$bin" bench route --verify-only --fixtures dsv3 >>"$log" 2>&1 || rc=$?
  echo "$rc" >"${log%.log}.rc"
}

for ((r = 1; r <= rounds; ++r)); do
  for ((i = 1; i <= procs; ++i)); do
    one "$out/cv_r${r}_p${i}.log" &
  done
  wait
done

runs=0 bad=0
for rc in "$out"/cv_*.rc; do
  runs=$((runs + 1))
  [[ "$(cat "$rc")" == 0 ]] || bad=$((bad + 1))
done
echo "| concurrent verify | $runs processes ($procs at once) | $bad failed |"
if ((bad > 0)); then
  grep -h -o 'NO: [^|]*\|error: .*' "$out"/cv_*.log | sort | uniq -c | sort -rn | head -5
  exit 1
fi

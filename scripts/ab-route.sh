#!/usr/bin/env bash
# Paired comparison of two or more moekit binaries on `bench route`, in one session on one GPU: rounds alternate the
# binaries (A, B, [C, ...], A, B, ...) over the DESIGN §11 fixtures and any custom cases, each run writes JSON, and
# the table below gives per case the medians over rounds of each binary's kernel time (cold L2, CUPTI) and graph
# replay time, and the ratio to A.
#   scripts/ab-route.sh "BIN_A BIN_B [BIN_C ...]" OUT_DIR [ROUNDS] [FIXTURES]
#   A side may add `bench route` arguments after a colon, commas for spaces: the same binary twice, e.g.
#     "build/tools/moekit:--instances,general build/tools/moekit" (the general instance against the default ones).
#   CASES: custom cases, ';'-separated `bench route` arguments, e.g.
#     CASES="--experts 128 --top-k 8 --method topk_softmax --block 64 --tokens 1,16" scripts/ab-route.sh ...
#   e.g. scripts/ab-route.sh "build-old/tools/moekit build/tools/moekit" /tmp/ab 2 "seed6 dsv3"
set -uo pipefail
if [[ $# -lt 2 ]]; then
  sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
read -r -a bins <<<"$1"
out="$2" rounds="${3:-2}" fixtures="${4:-seed6 dsv3}"
IFS=';' read -r -a cases <<<"${CASES:-}"
mkdir -p "$out"
failed=0
run() {  # side name args...
  local side="$1" name="$2" spec="${bins[$1]}" extra=()
  local bin="${spec%%:*}"
  [[ "$spec" == *:* ]] && IFS=',' read -r -a extra <<<"${spec#*:}"
  shift 2
  if ! "$bin" bench route "$@" "${extra[@]}" --json "$out/${side}_${name}.json" >"$out/${side}_${name}.log" 2>&1; then
    echo "FAILED: binary $side $name ($out/${side}_${name}.log)"
    failed=1
  fi
}
for ((r = 1; r <= rounds; ++r)); do
  for f in $fixtures; do
    for side in "${!bins[@]}"; do run "$side" "${f}_r${r}" --fixtures "$f"; done
  done
  for c in "${!cases[@]}"; do
    [[ -z "${cases[$c]// /}" ]] && continue
    read -r -a args <<<"${cases[$c]}"
    for side in "${!bins[@]}"; do run "$side" "case${c}_r${r}" "${args[@]}"; done
  done
done
python3 - "$out" "${#bins[@]}" <<'PY' || failed=1
import glob, json, os, statistics, sys
out, n = sys.argv[1], int(sys.argv[2])
runs = {}
for path in sorted(glob.glob(os.path.join(out, "*.json"))):
    side = int(os.path.basename(path).split("_")[0])
    for r in json.load(open(path))["results"]:
        key = (r["fixture"] or "-", r["method"], r["dtype"], r["experts"], r["top_k"], r["shared"], r["block"], r["tokens"])
        d = runs.setdefault(key, [([], []) for _ in range(n)])[side]
        d[0].append(r["kernel"]["median_us"])
        d[1].append(r["graph"]["median_us"])
names = [chr(ord("A") + i) for i in range(n)]
print("| case | method | dtype | E | K | S | B | T | " + " | ".join(f"{x} kernel us" for x in names) + " | "
      + " | ".join(f"{x}/A" for x in names[1:]) + " | " + " | ".join(f"{x} graph us" for x in names) + " |")
print("|---" * (8 + 3 * n - 1) + "|")
for key, d in runs.items():
    if any(not s[0] for s in d):
        continue
    k = [statistics.median(s[0]) for s in d]
    g = [statistics.median(s[1]) for s in d]
    print(f"| {' | '.join(map(str, key))} | " + " | ".join(f"{x:.2f}" for x in k) + " | "
          + " | ".join(f"{x / k[0]:.3f}" for x in k[1:]) + " | " + " | ".join(f"{x:.2f}" for x in g) + " |")
PY
exit "$failed"

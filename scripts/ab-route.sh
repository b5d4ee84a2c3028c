#!/usr/bin/env bash
# Paired comparison of two moekit binaries on `bench route`, in one session on one GPU: rounds alternate the
# binaries (A, B, A, B, ...) over the DESIGN §11 fixtures (and any extra bench route cases), each run writes JSON,
# and the table below gives per case the medians over rounds of A's and B's kernel time (cold L2, CUPTI) and graph
# replay time, and the ratio B / A.
#   scripts/ab-route.sh BIN_A BIN_B OUT_DIR [ROUNDS] [FIXTURES]
#   e.g. scripts/ab-route.sh build-old/tools/moekit build/tools/moekit /tmp/ab 2 "seed6 dsv3"
set -uo pipefail
if [[ $# -lt 3 ]]; then
  sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
bin_a="$1" bin_b="$2" out="$3" rounds="${4:-2}" fixtures="${5:-seed6 dsv3}"
mkdir -p "$out"
failed=0
for ((r = 1; r <= rounds; ++r)); do
  for f in $fixtures; do
    for side in A B; do
      bin="$bin_a"
      [[ "$side" == B ]] && bin="$bin_b"
      if ! "$bin" bench route --fixtures "$f" --json "$out/${side}_${f}_r${r}.json" >"$out/${side}_${f}_r${r}.log" 2>&1; then
        echo "FAILED: $side $f round $r ($out/${side}_${f}_r${r}.log)"
        failed=1
      fi
    done
  done
done
python3 - "$out" <<'PY' || failed=1
import glob, json, os, statistics, sys
runs = {}
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    side = os.path.basename(path)[0]
    for r in json.load(open(path))["results"]:
        key = (r["fixture"], r["experts"], r["top_k"], r["block"], r["tokens"])
        d = runs.setdefault(key, {"A": ([], []), "B": ([], [])})[side]
        d[0].append(r["kernel"]["median_us"])
        d[1].append(r["graph"]["median_us"])
print("| fixture | E | K | B | T | A kernel us | B kernel us | B/A | A graph us | B graph us |")
print("|---|---|---|---|---|---|---|---|---|---|")
for key, d in runs.items():
    if not d["A"][0] or not d["B"][0]:
        continue
    ak, bk = statistics.median(d["A"][0]), statistics.median(d["B"][0])
    ag, bg = statistics.median(d["A"][1]), statistics.median(d["B"][1])
    print(f"| {' | '.join(map(str, key))} | {ak:.2f} | {bk:.2f} | {bk / ak:.3f} | {ag:.2f} | {bg:.2f} |")
PY
exit "$failed"

#!/usr/bin/env bash
# Paired comparison of two moekit binaries on `bench moe`, in one session on one GPU (METHOD: ratios against a
# baseline measured in the same run). Rounds alternate the binaries (A, B, A, B, ...) so that drift in clocks and
# temperature falls on both; each run writes JSON, and scripts/ab_moe_table.py prints the medians over rounds of
# the experts graph time of A and B, their ratio, and each kernel's cold median.
#   scripts/ab-moe.sh BIN_A BIN_B OUT_DIR "PRESET..." TOKENS [SAMPLES] [ROUNDS] [EXTRA bench moe ARGS...]
#   e.g. scripts/ab-moe.sh build-old/tools/moekit build/tools/moekit /tmp/ab "qwen3-30b-a3b gpt-oss-120b" 1,16 40 2
# Both binaries take the same arguments (--kernels is always passed), then A_ARGS / B_ARGS (environment) to the side
# alone, e.g. one binary against itself with other tactics:
#   A_ARGS="--gemm1 3 --gemm2 3" B_ARGS="--gemm1 4 --gemm2 4" scripts/ab-moe.sh BIN BIN OUT mixtral-8x7b 512,1024
# AB_METRIC names the row field compared last (default experts_graph_us; e.g. route_experts_graph_us).
# A failed run is reported and skipped.
set -uo pipefail
if [[ $# -lt 5 ]]; then
  sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
bin_a="$1" bin_b="$2" out="$3" presets="$4" tokens="$5"
samples="${6:-40}" rounds="${7:-2}"
shift $(($# < 7 ? $# : 7))
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$out"
failed=0
for ((r = 1; r <= rounds; ++r)); do
  for p in $presets; do
    for side in A B; do
      bin="$bin_a" extra="${A_ARGS:-}"
      [[ "$side" == B ]] && bin="$bin_b" extra="${B_ARGS:-}"
      read -ra side_args <<<"$extra"  # words, as on a command line
      json="$out/${side}_${p}_r${r}.json"
      if ! "$bin" bench moe --preset "$p" --tokens "$tokens" --samples "$samples" --verify-tokens 4 --kernels \
        --json "$json" "$@" "${side_args[@]}" >"$out/${side}_${p}_r${r}.log" 2>&1; then
        echo "FAILED: $side $p round $r ($out/${side}_${p}_r${r}.log)"
        rm -f "$json"
        failed=1
      fi
    done
  done
done
python3 "$root/scripts/ab_moe_table.py" "$out" "${AB_METRIC:-experts_graph_us}" || failed=1
exit "$failed"

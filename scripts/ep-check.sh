#!/usr/bin/env bash
# Expert-parallel check on a GPU machine; builds nothing (binaries come from $BUILD_DIR). Runs the CPU simulation
# test, the EP GPU tests with W = 1 (on GPU 0 alone) and W = 2, and `moekit bench ep --gpus 2 --preset deepseek-v3
# --tokens 64,4096`, with NCCL's NVLink multicast off (NCCL_NVLS_ENABLE=0, never on). With one GPU the W = 2 steps
# are skipped with a message. Logs and JSON go to $OUT_DIR; a short table comes last. Exit status 0 when all passed.
#   BUILD_DIR=build-ep OUT_DIR=/tmp/ep scripts/ep-check.sh
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
build="${BUILD_DIR:-build}"
out="${OUT_DIR:-$root/ep-check-out}"
limit="${STEP_TIMEOUT:-300}"  # a hung collective must not eat the whole session
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
summary=()
failed=0

# step NAME CMD...: runs CMD (with a timeout) logging to $out/NAME.log and records the outcome.
step() {
  local name="$1"
  shift
  local t0=$SECONDS
  if timeout "$limit" "$@" >"$out/$name.log" 2>&1; then
    summary+=("| $name | ok | $((SECONDS - t0)) s |")
  else
    local rc=$?
    summary+=("| $name | FAILED (rc $rc, $out/$name.log) | $((SECONDS - t0)) s |")
    failed=1
    tail -n 40 "$out/$name.log"
  fi
}
skip() { summary+=("| $1 | SKIPPED ($2) | |"); echo "skipping $1: $2"; }

for f in "$build/tests/ep_test" "$build/tests/gpu_ep_test" "$build/tools/moekit"; do
  [[ -x "$f" ]] || { echo "missing $f: build it first (ninja -C $build ep_test gpu_ep_test moekit_cli)"; exit 2; }
done
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
nvidia-smi topo -m >"$out/topo.txt" 2>&1 || true
echo "visible GPUs: $gpus; NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE"

step ep_test_cpu "$build/tests/ep_test"
if ((gpus >= 1)); then
  step gpu_ep_w1 env CUDA_VISIBLE_DEVICES=0 "$build/tests/gpu_ep_test" \
    --gtest_filter='GpuEp.OneGpu*:GpuEp.GraphReplayOneGpu:GpuEp.UniqueId*:GpuEp.ArgumentChecks'
else
  skip gpu_ep_w1 "no GPU visible"
fi
if ((gpus >= 2)); then
  step gpu_ep_w2 "$build/tests/gpu_ep_test" --gtest_filter='GpuEp.TwoGpus*:GpuEp.GraphReplayTwoGpus'
  step bench_ep_dsv3 "$build/tools/moekit" bench ep --gpus 2 --preset deepseek-v3 --tokens 64,4096 \
    --json "$out/bench_ep_dsv3.json"
else
  skip gpu_ep_w2 "needs 2 GPUs, $gpus visible"
  skip bench_ep_dsv3 "needs 2 GPUs, $gpus visible"
fi

echo
if [[ -f "$out/bench_ep_dsv3.log" ]]; then
  grep -E '^(ep bench|\|)' "$out/bench_ep_dsv3.log" || true
  echo
fi
echo "| step | result | time |"
echo "|---|---|---|"
printf '%s\n' "${summary[@]}"
exit "$failed"

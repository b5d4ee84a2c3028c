#!/usr/bin/env bash
# GPU check, run on a machine with an H200/H100: builds everything with all cores, runs every GPU test executable
# (tests/gpu/*_test.cu -> $BUILD_DIR/tests/gpu_*) and every CPU test, compute-sanitizer memcheck and racecheck, the
# key benchmarks, the unified layer (demo, tuned vs default, tuning time) and the expert-parallel check, printing
# short tables last. Logs and JSON go to $OUT_DIR.
#   scripts/gpu-check.sh                          everything; build in ./build, logs in ./gpu-check-out
#   PARTS="build tests" scripts/gpu-check.sh      a subset of: build tests sanitize bench layer ep
#   BUILD_DIR=build-x PARTS=bench ...             reuse binaries built earlier
#   MOE_TOKENS=1,16 PARTS=bench ...               a shorter token list for bench moe
#   MOE_ARGS=--cublas PARTS=bench ...             more bench moe arguments (--cublas: the cuBLAS batched reference)
#   DEADLINE_S=480 ...                            steps that would start later than 480 s in are skipped
#   SKIP="racecheck_gpu_experts bench_moe_deepseek-v3" ...   the named steps are skipped
# Each step's result line is printed as it finishes and appended to $OUT_DIR/summary.md, so a run cut short still
# tells which steps passed. NCCL's NVLink multicast stays off (NCCL_NVLS_ENABLE=0). Exit status: 0 when every step
# passed (a skipped step counts as failed).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
build="${BUILD_DIR:-build}"
out="${OUT_DIR:-$root/gpu-check-out}"
parts=" ${PARTS:-build tests sanitize bench layer ep} "
sanitizer_limit="${SANITIZER_TIMEOUT:-300}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# The GPU tests fail instead of skipping when device 0 is no usable sm90 GPU: this script runs where one should be.
export MOEKIT_REQUIRE_GPU=1
deadline="${DEADLINE_S:-}"
mkdir -p "$out"
: >"$out/summary.md"
summary=()
failed=0
want() { [[ "$parts" == *" $1 "* ]]; }

# record LINE: one step's result, kept for the final table, printed now and appended to $out/summary.md.
record() {
  summary+=("$1")
  echo "$1" | tee -a "$out/summary.md"
}
# step NAME CMD...: runs CMD with its output in $out/NAME.log and records the outcome.
step() {
  local name="$1"
  shift
  if [[ " ${SKIP:-} " == *" $name "* ]]; then
    record "| $name | SKIPPED (SKIP) | |"
    failed=1
    return
  fi
  if [[ -n "$deadline" ]] && ((SECONDS >= deadline)); then
    record "| $name | SKIPPED (past DEADLINE_S=$deadline at ${SECONDS} s) | |"
    failed=1
    return
  fi
  local t0=$SECONDS
  if "$@" >"$out/$name.log" 2>&1; then
    record "| $name | ok | $((SECONDS - t0)) s |"
  else
    local rc=$?
    tail -n 30 "$out/$name.log"
    record "| $name | FAILED (rc $rc, $out/$name.log) | $((SECONDS - t0)) s |"
    failed=1
  fi
}
show() {  # show LOG...: the table lines of benchmark logs (bench moe's per-kernel tables stay in the logs)
  for b in "$@"; do
    [[ -f "$out/$b.log" ]] && awk '/^kernels of one experts call/ { exit }
      /^\||copy|^backend|^time|tuned in|staged tuning/' "$out/$b.log"
    echo
  done
}

nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$out/gpu.txt"
moekit="$build/tools/moekit"

if want build; then
  step build bash -c "cmake -S . -B '$build' -G Ninja -DMOEKIT_DEPS_DIR='$root/.deps' && ninja -C '$build' -j$(nproc)"
fi

if want tests; then
  for t in "$build"/tests/gpu_*; do
    [[ -x "$t" && -f "$t" ]] && step "$(basename "$t")" "$t"
  done
  # Every CPU test too, with a GPU present: some checks change where there is one (the CUDA runner, the CLI's
  # benchmark tables, the device a tuning cache names). The GPU tests ran above; the package tests, which build a
  # consumer project, run in CI.
  step cpu_tests_with_gpu ctest --test-dir "$build" -j"$(nproc)" --output-on-failure \
    -E '^(Gpu|CudaExperts|SassCheck|Package)'
  # The router verified by 16 processes at once, 4 rounds: stream-ordering mistakes show under contention.
  step concurrent_verify bash scripts/concurrent-verify.sh "$moekit" "$out/concurrent" 16 4
  # The machine code this toolchain built: sm_90a, no local memory, HGMMA in every CUTLASS GEMM.
  step sass_check ctest --test-dir "$build" -R '^SassCheck$' --output-on-failure
fi

# Sanitizers (quick case lists: the tools slow kernels 10-100x).
if want sanitize; then
  if command -v compute-sanitizer >/dev/null; then
    cs() { timeout "$sanitizer_limit" env MOEKIT_TEST_QUICK=1 compute-sanitizer "$@"; }
    step memcheck_gpu_route cs --tool memcheck --error-exitcode 1 "$build/tests/gpu_route_test"
    step racecheck_gpu_route cs --tool racecheck --racecheck-report all --error-exitcode 1 \
      "$build/tests/gpu_route_test" --gtest_filter=-*Graph*
    step racecheck_gpu_route_graph cs --tool racecheck --racecheck-report all --error-exitcode 1 \
      "$build/tests/gpu_route_test" --gtest_filter=*Graph*
    cases='*Skewed*:*GraphCapture*:*Reject*:*DecodeShortRows*:*DecodeRoutedOnly*:*GatedEpilogue*'
    cases+=':*Cooperative*:*SeveralTiles*'
    step memcheck_gpu_experts cs --tool memcheck --error-exitcode 1 "$build/tests/gpu_experts_test" \
      --gtest_filter="$cases"
    step racecheck_gpu_experts cs --tool racecheck --racecheck-report all --error-exitcode 1 \
      "$build/tests/gpu_experts_test" --gtest_filter='*Skewed*:*GatedEpilogue*:*Cooperative*'
    # The unified layer (every tactic pair on reduced presets, graph replay, tuning), the device helpers and the
    # benchmark kernels under memcheck; their racecheck runs past the limit (the layer's kernels are the experts').
    for t in layer device bench; do
      step "memcheck_gpu_$t" cs --tool memcheck --error-exitcode 1 "$build/tests/gpu_${t}_test"
    done
    # The expert-parallel test (its one-GPU cases here). NCCL probes its kernels with cudaFuncGetAttributes while it
    # sets up a communicator, and memcheck reports each probe that finds no image for this GPU as an API error; those
    # reports are NCCL's. The step fails when the test fails or memcheck reports anything else.
    memcheck_ep() {
      local log nccl_probe others
      log=$(mktemp)
      nccl_probe='Program hit cudaErrorNoKernelImageForDevice \(error 209\) due to "no kernel image is available for '
      nccl_probe+='execution on the device" on CUDA API call to cudaFuncGetAttributes\.$'
      cs --tool memcheck "$build/tests/gpu_ep_test" >"$log" 2>&1
      local rc=$?
      cat "$log"
      others=$(grep -E '^========= [A-Z]' "$log" | grep -cvE "COMPUTE-SANITIZER|ERROR SUMMARY|$nccl_probe")
      rm -f "$log"
      echo "memcheck reports other than NCCL's probes: $others"
      ((rc == 0 && others == 0))
    }
    step memcheck_gpu_ep memcheck_ep
  else
    record "| sanitizers | SKIPPED (no compute-sanitizer) | |"
    failed=1
  fi
fi

# Key benchmarks (each verifies against the CPU reference before timing).
if want bench; then
  step bench_route_seed6 "$moekit" bench route --fixtures seed6 --phases --json "$out/bench_route_seed6.json"
  step bench_route_dsv3 "$moekit" bench route --fixtures dsv3 --phases --json "$out/bench_route_dsv3.json"
  for p in mixtral-8x7b qwen3-30b-a3b deepseek-v3 qwen3-next-80b gpt-oss-120b; do
    read -ra moe_args <<<"${MOE_ARGS:-}"  # words, as on a command line
    step "bench_moe_$p" "$moekit" bench moe --preset "$p" --tokens "${MOE_TOKENS:-1,16,64,256,1024,4096,16384}" \
      --kernels --json "$out/bench_moe_$p.json" "${moe_args[@]}"
  done
  # llama4-scout at full size (its experts take the routing weight on their input): verified against the CPU
  # reference at both paths (GEMV at T = 1, grouped at 64), then a short timing. kimi-k2 runs deepseek-v3's path.
  step bench_moe_llama4-scout "$moekit" bench moe --preset llama4-scout --tokens 1,64 --samples 10 \
    --json "$out/bench_moe_llama4-scout.json"
  jsons=()
  for p in mixtral-8x7b qwen3-30b-a3b deepseek-v3 qwen3-next-80b gpt-oss-120b; do
    [[ -f "$out/bench_moe_$p.json" ]] && jsons+=("$out/bench_moe_$p.json")
  done
  python3 scripts/plot_moe.py "$out/moe_floor_fraction.png" "${jsons[@]}" >"$out/plot.log" 2>&1 ||
    record "| plot | FAILED ($out/plot.log) | |"
  show bench_route_seed6 bench_route_dsv3 bench_moe_mixtral-8x7b bench_moe_qwen3-30b-a3b bench_moe_deepseek-v3 \
    bench_moe_qwen3-next-80b bench_moe_gpt-oss-120b bench_moe_llama4-scout
fi

# The unified layer: the demo through MoELayer ("auto" picks cuda_bf16), the tuned pair against the default pair at
# T = 1, 64, 4096 per preset (kimi-k2 at 1, 4096 and 8192: 86 and 171 routed rows per expert on 384 large experts,
# where the H100's rules take swapped 96x256 tiles and the H200's 64x256), and the wall time of tuning one preset
# over 7 token counts into a fresh cache.
if want layer; then
  step demo_cuda "$moekit" demo --backend cuda
  for p in mixtral-8x7b qwen3-30b-a3b deepseek-v3 qwen3-next-80b gpt-oss-120b; do
    step "bench_moe_tuned_$p" "$moekit" bench moe --tuned --preset "$p" --json "$out/bench_moe_tuned_$p.json"
  done
  step bench_moe_tuned_kimi-k2 "$moekit" bench moe --tuned --preset kimi-k2 --tokens 1,4096,8192 \
    --json "$out/bench_moe_tuned_kimi-k2.json"
  rm -f "$out/tune_qwen3.json" "$out/tune_qwen3.json.lock"
  step tune_qwen3 "$moekit" tune --preset qwen3-30b-a3b --tokens 1,16,64,256,1024,4096,16384 \
    --cache "$out/tune_qwen3.json" --progress lines
  show demo_cuda bench_moe_tuned_mixtral-8x7b bench_moe_tuned_qwen3-30b-a3b bench_moe_tuned_deepseek-v3 \
    bench_moe_tuned_qwen3-next-80b bench_moe_tuned_gpt-oss-120b bench_moe_tuned_kimi-k2 tune_qwen3
fi

if want ep; then
  step ep_check env BUILD_DIR="$build" OUT_DIR="$out/ep" bash scripts/ep-check.sh
  [[ -f "$out/ep_check.log" ]] && tail -n 25 "$out/ep_check.log"
fi

echo "| step | result | time |"
echo "|---|---|---|"
printf '%s\n' "${summary[@]}"
exit "$failed"

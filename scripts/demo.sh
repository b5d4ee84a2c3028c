#!/usr/bin/env bash
# The main job: installs what it needs, builds the moekit CLI and runs `moekit demo` with the given arguments
# (default preset qwen3-30b-a3b, 16 tokens). With a GPU (nvidia-smi answers) it builds the CUDA kernels and runs
# on the GPU; otherwise it builds the CPU backend only and runs the CPU reference.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh >/dev/null
source scripts/env.sh
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  build=build; cuda=ON
else
  build=build-cpu; cuda=OFF
fi
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEKIT_ENABLE_CUDA=$cuda -DMOEKIT_BUILD_TESTS=OFF >/dev/null
cmake --build "$build" -j "$MOEKIT_JOBS" --target moekit_cli >/dev/null
exec "$build/tools/moekit" demo "$@"

#!/usr/bin/env bash
# The test command: installs what the build needs, builds everything (CUDA code too when nvcc is present; GPU
# tests skip themselves without a GPU) and runs every test under ctest.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
source scripts/env.sh
build="${MOEKIT_BUILD_DIR:-build}"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" -j "$MOEKIT_JOBS"
ctest --test-dir "$build" --output-on-failure -j "$MOEKIT_JOBS"

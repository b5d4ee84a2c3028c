#!/usr/bin/env bash
# The CPU tests once more in a build without CUDA, under AddressSanitizer and UndefinedBehaviorSanitizer: every host
# path (validation, the CPU reference, the plan, the tuner, the CLI) with memory errors, leaks and undefined
# behaviour made fatal. Also keeps the MOEKIT_ENABLE_CUDA=OFF configuration building and passing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
source scripts/env.sh
build="${MOEKIT_SANITIZE_BUILD_DIR:-build-sanitize}"
flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -O1"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DMOEKIT_ENABLE_CUDA=OFF \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined"
cmake --build "$build" -j "$MOEKIT_JOBS"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir "$build" --output-on-failure -j "$MOEKIT_JOBS"

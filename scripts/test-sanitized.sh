#!/usr/bin/env bash
# The CPU tests again in builds without CUDA, under the sanitizers: every host path (validation, the CPU reference,
# the plan, the tuner, the CLI, the expert-parallel simulation) with
#   address: AddressSanitizer and UndefinedBehaviorSanitizer (memory errors, leaks, undefined behaviour; fatal),
#   thread:  ThreadSanitizer (data races in the threaded CPU reference, the tuner's shared cache, the simulated
#            ranks; fatal).
# The address build compiles with clang (installed when missing), the others with the default compiler (GCC), so
# that the host code keeps building with both. Also keeps the MOEKIT_ENABLE_CUDA=OFF configuration building and
# passing.
#   scripts/test-sanitized.sh [address|thread]...   (default: both, one build folder each)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh clang
source scripts/env.sh
kinds=("$@")
[[ ${#kinds[@]} -eq 0 ]] && kinds=(address thread)
for kind in "${kinds[@]}"; do
  case "$kind" in
    address)
      build="${MOEKIT_SANITIZE_BUILD_DIR:-build-sanitize}"
      compiler=(-DCMAKE_CXX_COMPILER=clang++)
      link="-fsanitize=address,undefined"
      flags="$link -fno-sanitize-recover=undefined -fno-omit-frame-pointer -O1"
      ;;
    thread)
      build="${MOEKIT_SANITIZE_BUILD_DIR:-build-sanitize}-thread"
      compiler=()
      link="-fsanitize=thread"
      flags="$link -O1 -g"
      ;;
    *)
      echo "unknown sanitizer build '$kind' (address or thread)" >&2
      exit 2
      ;;
  esac
  echo "== CPU tests in the $kind-sanitizer build ($build)"
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DMOEKIT_ENABLE_CUDA=OFF -DMOEKIT_TEST_PACKAGE=OFF \
    "${compiler[@]}" -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$link"
  cmake --build "$build" -j "$MOEKIT_JOBS"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 TSAN_OPTIONS=halt_on_error=1 \
    ctest --test-dir "$build" --output-on-failure -j "$MOEKIT_JOBS"
done

// Shared by the GPU tests: the skip (or failure) where device 0 is not an sm90 GPU, and the run's random seed.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>

#include "moekit/device.h"

/// Skips the current test where device 0 is not an sm90 GPU, or fails it where the run requires one
/// (test::gpu_required()); `why` says what needs one.
#define MOEKIT_SKIP_WITHOUT_SM90(why)                                                                      \
  if (!::moekit::device_is_sm90(0)) {                                                                      \
    if (::moekit::test::gpu_required()) FAIL() << "no sm90 GPU, and MOEKIT_REQUIRE_GPU is set: " << (why); \
    GTEST_SKIP() << "no sm90 GPU: " << (why);                                                              \
  }

namespace moekit::test {

/// True where MOEKIT_REQUIRE_GPU is set to anything but "" or "0" (scripts/gpu-check.sh sets it): on a machine meant
/// to run the GPU tests, a missing or unusable GPU then fails them instead of passing them as skipped.
inline bool gpu_required() {
  const char* env = std::getenv("MOEKIT_REQUIRE_GPU");
  return env != nullptr && env[0] != '\0' && !(env[0] == '0' && env[1] == '\0');
}

/// The run's random seed: MOEKIT_TEST_SEED where set, else a fresh one. Printed once, with `name`, so that a failing
/// run can be replayed.
inline uint32_t run_seed(const char* name) {
  static const uint32_t seed = [name] {
    const char* env = std::getenv("MOEKIT_TEST_SEED");
    const uint32_t s = env ? static_cast<uint32_t>(std::strtoul(env, nullptr, 10)) : std::random_device{}();
    std::printf("%s seed: %u (set MOEKIT_TEST_SEED to replay)\n", name, s);
    return s;
  }();
  return seed;
}

}  // namespace moekit::test

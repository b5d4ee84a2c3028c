// Shared by the GPU tests: the skip where device 0 is not an sm90 GPU, and the run's random seed.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>

#include "moekit/device.h"

/// Skips the current test where device 0 is not an sm90 GPU; `why` says what needs one.
#define MOEKIT_SKIP_WITHOUT_SM90(why) \
  if (!::moekit::device_is_sm90(0)) GTEST_SKIP() << "no sm90 GPU: " << (why)

namespace moekit::test {

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

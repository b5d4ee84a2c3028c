// The route() fuzz target on seeded random inputs under ctest (and under ASan/UBSan in scripts/test-sanitized.sh):
// every input must end in a checked plan or a clean rejection (route_fuzz.cpp aborts otherwise), and both outcomes
// must occur often, so that the decoder keeps reaching the valid calls and the rules that reject.
#include "route_fuzz.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

TEST(RouteFuzz, RandomInputs) {
  constexpr int kInputs = 3000;
  std::mt19937 rng(20261204);
  std::vector<uint8_t> input;
  for (int i = 0; i < kInputs; ++i) {
    input.resize(rng() % 2048);
    for (uint8_t& b : input) b = static_cast<uint8_t>(rng());
    LLVMFuzzerTestOneInput(input.data(), input.size());
  }
  const moekit::fuzz::Outcomes& o = moekit::fuzz::route_outcomes();
  EXPECT_EQ(o.accepted + o.rejected, kInputs);
  EXPECT_GT(o.accepted, kInputs / 10) << "rejected " << o.rejected;
  EXPECT_GT(o.rejected, kInputs / 10) << "accepted " << o.accepted;
}

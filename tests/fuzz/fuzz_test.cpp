// The fuzz targets on seeded random inputs under ctest (and under the sanitizers of scripts/test-sanitized.sh):
// every input must end in a checked result or a clean rejection (a broken property aborts the process), and both
// outcomes must occur often, so that the decoders keep reaching the valid calls and the rules that reject.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "fuzz_targets.h"

namespace {

void run_random_inputs(void (*target)(const uint8_t*, size_t), const moekit::fuzz::Outcomes& outcomes, int inputs,
                       size_t max_size, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> input;
  for (int i = 0; i < inputs; ++i) {
    input.resize(rng() % max_size);
    for (uint8_t& b : input) b = static_cast<uint8_t>(rng());
    target(input.data(), input.size());
  }
  EXPECT_EQ(outcomes.accepted + outcomes.rejected, inputs);
  EXPECT_GT(outcomes.accepted, inputs / 10) << "rejected " << outcomes.rejected;
  EXPECT_GT(outcomes.rejected, inputs / 10) << "accepted " << outcomes.accepted;
}

TEST(Fuzz, RouteOnRandomInputs) {
  run_random_inputs(moekit::fuzz::route_input, moekit::fuzz::outcomes(moekit::fuzz::Target::route), 3000, 2048,
                    20261204);
}

TEST(Fuzz, LayerOnRandomInputs) {
  run_random_inputs(moekit::fuzz::layer_input, moekit::fuzz::outcomes(moekit::fuzz::Target::layer), 1500, 4096,
                    20261206);
}

TEST(Fuzz, ExpertParallelOnRandomInputs) {
  run_random_inputs(moekit::fuzz::ep_input, moekit::fuzz::outcomes(moekit::fuzz::Target::ep), 1500, 4096, 20261207);
}

TEST(Fuzz, ExpertsOnRandomInputs) {
  run_random_inputs(moekit::fuzz::experts_input, moekit::fuzz::outcomes(moekit::fuzz::Target::experts), 1500, 4096,
                    20261205);
}

TEST(Fuzz, TuningCacheOnRandomInputs) {
  run_random_inputs(moekit::fuzz::tuning_cache_input, moekit::fuzz::outcomes(moekit::fuzz::Target::tuning_cache),
                    1500, 256, 20261208);
}

}  // namespace

// Routing: the CPU reference against tiny cases worked out by hand (every method, bias, groups, renormalization,
// scaling, shared slots, ties, NaN, bf16, strided rows, replay), properties over seeded random cases, every
// validation rule with its exact message, and the portable exp/sigmoid against the C library.
// Expected values are computed here independently (std::exp in double), never taken from the code under test.
#include "moekit/routing.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "error_of.h"
#include "moekit/dtype.h"
#include "moekit/error.h"
#include "moekit/plan.h"
#include "routing/routing_math.h"

namespace moekit {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

struct Routed {
  std::vector<int32_t> ids;    // [T, K+S]
  std::vector<float> weights;  // [T, K+S]
};

// Routes fp32 logits [T, E] (T = logits.size() / E) with an optional fp32 bias [E].
Routed route(const RoutingConfig& cfg, std::vector<float> logits, std::vector<float> bias = {},
             const TensorView& replay = {}) {
  const int64_t tokens = static_cast<int64_t>(logits.size()) / cfg.num_experts;
  const TensorView lv = TensorView::contiguous(logits.data(), DType::f32, {tokens, cfg.num_experts});
  const TensorView bv =
      bias.empty() ? TensorView{} : TensorView::contiguous(bias.data(), DType::f32, {cfg.num_experts});
  Routed r{std::vector<int32_t>(tokens * cfg.slots(), -1), std::vector<float>(tokens * cfg.slots(), kNaN)};
  route_topk_reference(cfg, lv, bv, r.ids.data(), r.weights.data(), replay);
  return r;
}

double sig(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

// Weights within 1e-6 relative of the hand-worked values (exact when the expected value is 0 or 1).
void expect_weights(const std::vector<float>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6 * std::abs(want[i])) << "slot " << i;
}

// ---------------------------------------------------------------- tiny hand-worked cases, one method at a time

TEST(RoutingTiny, SoftmaxTopkIsSoftmaxOverAllExperts) {
  const auto r = route(make_routing_config(RoutingMethod::softmax_topk, 4, 2), {1, 3, 2, 0.5f, /**/ -1, 0, 4, -2});
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 2, 2, 1}));
  const double s0 = std::exp(-2.0) + 1 + std::exp(-1.0) + std::exp(-2.5);  // max 3
  const double s1 = std::exp(-5.0) + std::exp(-4.0) + 1 + std::exp(-6.0);  // max 4
  expect_weights(r.weights, {1 / s0, std::exp(-1.0) / s0, 1 / s1, std::exp(-4.0) / s1});
}

TEST(RoutingTiny, SoftmaxTopkRenormalizeAndScale) {
  const double z = 1 + std::exp(-1.0);
  auto r = route(make_routing_config(RoutingMethod::softmax_topk, 4, 2, 0, true), {1, 3, 2, 0.5f});
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 2}));
  expect_weights(r.weights, {1 / z, std::exp(-1.0) / z});
  r = route(make_routing_config(RoutingMethod::softmax_topk, 4, 2, 0, true, 1, 1, 2.5f), {1, 3, 2, 0.5f});
  expect_weights(r.weights, {2.5 / z, 2.5 * std::exp(-1.0) / z});
  // Without renormalization the scale still applies.
  r = route(make_routing_config(RoutingMethod::softmax_topk, 4, 2, 0, false, 1, 1, 2.5f), {1, 3, 2, 0.5f});
  const double s = std::exp(-2.0) + 1 + std::exp(-1.0) + std::exp(-2.5);
  expect_weights(r.weights, {2.5 / s, 2.5 * std::exp(-1.0) / s});
}

TEST(RoutingTiny, TopkSoftmaxIsSoftmaxOverTheSelected) {
  const std::vector<float> logits{0.1f, -1, 2, 0.7f, 2, -3};
  const auto r = route(make_routing_config(RoutingMethod::topk_softmax, 6, 3), logits);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 4, 3}));  // the tie 2 == 2 goes to the lower id first
  const double z = 2 + std::exp(0.7 - 2.0);
  expect_weights(r.weights, {1 / z, 1 / z, std::exp(-1.3) / z});
  // Already normalized: renormalize changes nothing; the scale still multiplies.
  const auto renorm = route(make_routing_config(RoutingMethod::topk_softmax, 6, 3, 0, true), logits);
  EXPECT_EQ(renorm.ids, r.ids);
  EXPECT_EQ(renorm.weights, r.weights);
  const auto scaled = route(make_routing_config(RoutingMethod::topk_softmax, 6, 3, 0, true, 1, 1, 3.0f), logits);
  expect_weights(scaled.weights, {3 / z, 3 / z, 3 * std::exp(-1.3) / z});
}

// Groups of 2: {3, -3} {1, 1} {0.5, 0.8} {-1, -2}. Group scores (sum of the two sigmoids): 1.0, 1.462, 1.312,
// 0.388, so groups 1 and 2 are kept and expert 0, the best single expert, is excluded with its group.
TEST(RoutingTiny, SigmoidGroupedExcludesAHighExpertOfALosingGroup) {
  const std::vector<float> logits{3, -3, 1, 1, 0.5f, 0.8f, -1, -2};
  auto r = route(make_routing_config(RoutingMethod::sigmoid_grouped, 8, 3, 0, true, 4, 2, 2.5f), logits);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 3, 5}));
  const double z = 2 * sig(1) + sig(0.8);
  expect_weights(r.weights, {2.5 * sig(1) / z, 2.5 * sig(1) / z, 2.5 * sig(0.8) / z});
  r = route(make_routing_config(RoutingMethod::sigmoid_grouped, 8, 3, 0, false, 4, 2, 2.5f), logits);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 3, 5}));
  expect_weights(r.weights, {2.5 * sig(1), 2.5 * sig(1), 2.5 * sig(0.8)});
  // With every group kept, expert 0 wins.
  r = route(make_routing_config(RoutingMethod::sigmoid_grouped, 8, 3, 0, false, 4, 4), logits);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 2, 3}));
}

// A group's score is the sum of its TWO best keys: token 0 tells it from the sum of all keys (group 1 would win
// with 3 * sig(1.5)), token 1 from the best key alone (group 1 would win with sig(2)).
TEST(RoutingTiny, GroupScoreIsTheSumOfTheTwoBestKeys) {
  const auto r = route(make_routing_config(RoutingMethod::sigmoid_grouped, 6, 1, 0, false, 2, 1),
                       {2, 2, -10, 1.5f, 1.5f, 1.5f,  //
                        1.5f, 1.5f, -10, 2, 0, -10});
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 0}));
  expect_weights(r.weights, {sig(2), sig(1.5)});
}

TEST(RoutingTiny, SingleExpertGroupsScoreTheirOneKey) {
  const auto r =
      route(make_routing_config(RoutingMethod::sigmoid_grouped, 4, 2, 0, false, 4, 2), {0.3f, 0.9f, -0.2f, 0.5f});
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 3}));
  expect_weights(r.weights, {sig(0.9), sig(0.5)});
}

// All logits 0 make every sigmoid exactly 0.5; dyadic biases make both group scores exactly 1.5:
// group 0 = 0.75 + 0.75, group 1 = 1.0 + 0.5. The tie keeps group 0, although group 1 holds the best key.
TEST(RoutingTiny, EqualGroupScoresKeepTheLowerGroup) {
  const auto r = route(make_routing_config(RoutingMethod::sigmoid_grouped, 4, 1, 0, true, 2, 1), {0, 0, 0, 0},
                       {0.25f, 0.25f, 0.5f, 0});
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0}));
  expect_weights(r.weights, {1.0});  // renormalized single weight
}

TEST(RoutingTiny, BiasChangesTheSelectionNotTheWeights) {
  // sigmoid_grouped, one group: keys 0.5, 0.731, 0.881 - 5, 0.622 + 1.
  auto r = route(make_routing_config(RoutingMethod::sigmoid_grouped, 4, 2), {0, 1, 2, 0.5f}, {0, 0, -5, 1});
  EXPECT_EQ(r.ids, (std::vector<int32_t>{3, 1}));
  expect_weights(r.weights, {sig(0.5), sig(1)});
  r = route(make_routing_config(RoutingMethod::sigmoid_grouped, 4, 2), {0, 1, 2, 0.5f});
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 1}));
  // softmax_topk: keys 1, 0, 2, 0.5; the weights stay the softmax of the unbiased logits.
  r = route(make_routing_config(RoutingMethod::softmax_topk, 4, 2), {1, 3, 2, 0.5f}, {0, -3, 0, 0});
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 0}));
  const double s = std::exp(-2.0) + 1 + std::exp(-1.0) + std::exp(-2.5);
  expect_weights(r.weights, {std::exp(-1.0) / s, std::exp(-2.0) / s});
  // Renormalized softmax_topk is the softmax over the selected logits: here the bias passes over the row's max,
  // 200 above them, against which each selected term would underflow fp32 (the weights would all be 0).
  r = route(make_routing_config(RoutingMethod::softmax_topk, 4, 2, 0, true), {200, 0, -1, 3}, {-1000, 0, 0, 0});
  EXPECT_EQ(r.ids, (std::vector<int32_t>{3, 1}));
  const double z3 = 1 + std::exp(-3.0);
  expect_weights(r.weights, {1 / z3, std::exp(-3.0) / z3});
  // topk_softmax: the softmax runs over the selected unbiased logits.
  r = route(make_routing_config(RoutingMethod::topk_softmax, 4, 2), {1, 3, 2, 0.5f}, {0, -3, 0, 0});
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 0}));
  const double z = 1 + std::exp(-1.0);
  expect_weights(r.weights, {1 / z, std::exp(-1.0) / z});
}

TEST(RoutingTiny, Llama4WeightIsTheSigmoidOfTheLogit) {
  // renormalize does not apply to llama4: the weight stays sigmoid(1.5), not 1.
  const auto r = route(make_routing_config(RoutingMethod::llama4, 5, 1, 1, true), {0.2f, -1, 1.5f, 1.5f, 0});
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 5}));
  expect_weights(r.weights, {sig(1.5), 1.0});
}

TEST(RoutingTiny, PreScoredUsesTheScores) {
  const std::vector<float> scores{0.1f, 0.4f, 0.3f, 0.2f};
  auto r = route(make_routing_config(RoutingMethod::pre_scored, 4, 2), scores);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 2}));
  expect_weights(r.weights, {0.4f, 0.3f});
  r = route(make_routing_config(RoutingMethod::pre_scored, 4, 2, 0, true), scores);
  expect_weights(r.weights, {0.4f / (0.4 + 0.3f), 0.3f / (0.4 + 0.3f)});
  r = route(make_routing_config(RoutingMethod::pre_scored, 4, 2, 0, true, 1, 1, 2.0f), scores);
  expect_weights(r.weights, {2 * 0.4f / (0.4 + 0.3f), 2 * 0.3f / (0.4 + 0.3f)});
}

// Ids chosen elsewhere (README: an engine's own top-k): scores holding the chosen experts' weights and -inf
// elsewhere select exactly them, with those weights, in descending weight order; even a weight below every other
// weight's magnitude, or a zero.
TEST(RoutingTiny, PreScoredSelectsIdsChosenElsewhere) {
  const float ninf = -std::numeric_limits<float>::infinity();
  auto r = route(make_routing_config(RoutingMethod::pre_scored, 6, 3), {ninf, 0.25f, ninf, 0.5f, ninf, -2.0f});
  EXPECT_EQ(r.ids, (std::vector<int32_t>{3, 1, 5}));
  expect_weights(r.weights, {0.5f, 0.25f, -2.0f});
  r = route(make_routing_config(RoutingMethod::pre_scored, 4, 2, 1), {0.0f, ninf, ninf, 1e-30f});
  EXPECT_EQ(r.ids, (std::vector<int32_t>{3, 0, 4}));
  expect_weights(r.weights, {1e-30f, 0.0f, 1.0f});
}

TEST(RoutingTiny, RenormalizeSkipsAZeroSum) {
  const auto r = route(make_routing_config(RoutingMethod::pre_scored, 3, 2, 0, true), {0, 0, -1});
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1}));
  expect_weights(r.weights, {0, 0});
}

TEST(RoutingTiny, SharedSlotsFollowWithWeightExactlyOne) {
  const std::vector<float> logits{0.3f, -0.1f, 0.9f, 0.4f, 0.2f, -0.6f, 0.0f, 0.7f};
  for (RoutingMethod m : {RoutingMethod::softmax_topk, RoutingMethod::topk_softmax, RoutingMethod::sigmoid_grouped,
                          RoutingMethod::llama4, RoutingMethod::pre_scored}) {
    SCOPED_TRACE(std::string(routing_method_name(m)));
    const int k = m == RoutingMethod::llama4 ? 1 : 2;
    const auto r = route(make_routing_config(m, 8, k, 3, true, 1, 1, 2.5f), logits);
    ASSERT_EQ(r.ids.size(), static_cast<size_t>(k + 3));
    EXPECT_EQ(r.ids[0], 2);
    if (k == 2) {
      EXPECT_EQ(r.ids[1], 7);
    }
    for (int s = 0; s < 3; ++s) {
      EXPECT_EQ(r.ids[k + s], 8 + s);
      EXPECT_EQ(r.weights[k + s], 1.0f);  // never scaled
    }
  }
}

TEST(RoutingTiny, EqualKeysGoToTheLowerId) {
  auto r = route(make_routing_config(RoutingMethod::softmax_topk, 4, 3), {1, 1, 1, 1});
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1, 2}));
  expect_weights(r.weights, {0.25, 0.25, 0.25});
  r = route(make_routing_config(RoutingMethod::topk_softmax, 5, 3), {-2, 0.5f, 0.5f, -2, 0.5f});
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 2, 4}));
  expect_weights(r.weights, {1 / 3.0, 1 / 3.0, 1 / 3.0});
}

TEST(RoutingTiny, NaNRanksBelowMinusInfinity) {
  // NaN is treated as probability 0 by the softmax; -inf has probability 0 too.
  auto r = route(make_routing_config(RoutingMethod::softmax_topk, 4, 4), {kNaN, -kInf, 0, 1});
  EXPECT_EQ(r.ids, (std::vector<int32_t>{3, 2, 1, 0}));
  const double z = 1 + std::exp(-1.0);
  expect_weights(r.weights, {1 / z, std::exp(-1.0) / z, 0, 0});
  r = route(make_routing_config(RoutingMethod::sigmoid_grouped, 3, 3), {kNaN, -1, 2});
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 1, 0}));
  r = route(make_routing_config(RoutingMethod::pre_scored, 4, 2), {kNaN, kNaN, -kInf, kNaN});
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 0}));
  // A row of only NaN has no probability mass: its weights are 0 (routing.h: non-finite logits).
  r = route(make_routing_config(RoutingMethod::softmax_topk, 3, 2), {kNaN, kNaN, kNaN});
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1}));
  expect_weights(r.weights, {0, 0});
}

// routing.h's conventions for infinite logits: +inf logits share the softmax mass, a row of only -inf is uniform,
// sigmoid's limits are 0 and 1 (NaN stays NaN), and pre_scored weights are the scores themselves.
TEST(RoutingTiny, InfiniteLogitsHaveTheDocumentedWeights) {
  auto r = route(make_routing_config(RoutingMethod::softmax_topk, 4, 2), {kInf, 1, kInf, 3});
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 2}));
  expect_weights(r.weights, {0.5, 0.5});
  r = route(make_routing_config(RoutingMethod::softmax_topk, 4, 2), {-kInf, -kInf, -kInf, -kInf});
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1}));
  expect_weights(r.weights, {0.25, 0.25});
  r = route(make_routing_config(RoutingMethod::topk_softmax, 4, 2), {-kInf, -kInf, -kInf, -kInf});
  expect_weights(r.weights, {0.5, 0.5});
  r = route(make_routing_config(RoutingMethod::topk_softmax, 4, 2), {kNaN, 2, kInf, 1});
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 1}));
  expect_weights(r.weights, {1, 0});
  r = route(make_routing_config(RoutingMethod::sigmoid_grouped, 3, 3), {kInf, -kInf, 0});
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 2, 1}));
  expect_weights(r.weights, {1, 0.5, 0});
  r = route(make_routing_config(RoutingMethod::sigmoid_grouped, 2, 2), {kNaN, kNaN});
  EXPECT_TRUE(std::isnan(r.weights[0]) && std::isnan(r.weights[1]));
  r = route(make_routing_config(RoutingMethod::pre_scored, 3, 2), {1, kInf, -kInf});
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 0}));
  EXPECT_EQ(r.weights, (std::vector<float>{kInf, 1}));
}

TEST(RoutingTiny, Bf16LogitsAndBiasMatchFp32OfTheSameValues) {
  constexpr int kE = 40, kT = 3;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-4, 4);
  std::vector<float> logits(kT * kE), bias(kE);
  std::vector<uint16_t> logits16(kT * kE), bias16(kE);
  for (size_t i = 0; i < logits.size(); ++i)
    logits[i] = round_to_bf16(dist(rng)), logits16[i] = float_to_bf16(logits[i]);
  for (int e = 0; e < kE; ++e) bias[e] = round_to_bf16(dist(rng) / 8), bias16[e] = float_to_bf16(bias[e]);
  for (const RoutingConfig& cfg : {make_routing_config(RoutingMethod::softmax_topk, kE, 5, 1, true),
                                   make_routing_config(RoutingMethod::sigmoid_grouped, kE, 6, 1, true, 4, 2, 2.5f)}) {
    const Routed want = route(cfg, logits, bias);
    Routed got{std::vector<int32_t>(kT * cfg.slots()), std::vector<float>(kT * cfg.slots())};
    route_topk_reference(cfg, TensorView::contiguous(logits16.data(), DType::bf16, {kT, kE}),
                         TensorView::contiguous(bias16.data(), DType::bf16, {kE}), got.ids.data(),
                         got.weights.data());
    EXPECT_EQ(got.ids, want.ids);
    EXPECT_EQ(got.weights, want.weights);
  }
}

TEST(RoutingTiny, RowStrideLargerThanE) {
  constexpr int kE = 6, kT = 3, kStride = 9;
  const std::vector<float> logits{0.1f, 0.5f, -0.2f, 0.9f, 0.3f, 0.0f,  //
                                  1.0f, -1.f, 2.0f,  0.4f, 0.4f, 0.1f,  //
                                  -3.f, 0.2f, 0.2f,  0.6f, -1.f, 0.8f};
  std::vector<float> padded(kT * kStride, 1e30f);  // the padding would win every selection if it were read
  for (int t = 0; t < kT; ++t) std::copy_n(logits.begin() + t * kE, kE, padded.begin() + t * kStride);
  TensorView v = TensorView::contiguous(padded.data(), DType::f32, {kT, kE});
  v.strides[0] = kStride;
  const RoutingConfig cfg = make_routing_config(RoutingMethod::softmax_topk, kE, 2, 0, true);
  Routed got{std::vector<int32_t>(kT * 2), std::vector<float>(kT * 2)};
  route_topk_reference(cfg, v, {}, got.ids.data(), got.weights.data());
  EXPECT_EQ(got.ids, (std::vector<int32_t>{3, 1, 2, 0, 5, 3}));
  const Routed want = route(cfg, logits);
  EXPECT_EQ(got.weights, want.weights);
}

TEST(RoutingTiny, ReplayFillsRowsBelowTAndLeavesTheRest) {
  constexpr int kE = 5, kK = 2, kRows = 5;
  constexpr int16_t kSentinel = -7;
  std::vector<int16_t> replay(kRows * kK, kSentinel);
  const RoutingConfig cfg = make_routing_config(RoutingMethod::topk_softmax, kE, kK, 1);
  const auto r = route(cfg, {0, 1, 2, 3, 4, /**/ 4, 3, 2, 1, 0, /**/ 0, 9, 0, 9, 0}, {},
                       TensorView::contiguous(replay.data(), DType::i16, {kRows, kK}));
  EXPECT_EQ(r.ids, (std::vector<int32_t>{4, 3, 5, 0, 1, 5, 1, 3, 5}));
  EXPECT_EQ(replay, (std::vector<int16_t>{4, 3, 0, 1, 1, 3, kSentinel, kSentinel, kSentinel, kSentinel}));
  for (int16_t id : replay) EXPECT_LT(id, kE);  // shared ids never enter the replay
}

TEST(RoutingTiny, NoTokensWritesNothing) {
  int32_t id = -3;
  float w = -3.0f;
  route_topk_reference(make_routing_config(RoutingMethod::softmax_topk, 4, 2),
                       TensorView::contiguous(nullptr, DType::f32, {0, 4}), {}, &id, &w);
  EXPECT_EQ(id, -3);
  EXPECT_EQ(w, -3.0f);
}

// ---------------------------------------------------------------- properties over seeded random cases

// The selection key of expert e, recomputed from the contract with the shared portable math.
float key_of(const RoutingConfig& cfg, float logit, const std::vector<float>& bias, int e) {
  float key = cfg.method == RoutingMethod::sigmoid_grouped ? routing_math::sigmoid(logit) : logit;
  return bias.empty() ? key : key + bias[e];
}

// Kept groups by plain sorting: group score = sum of the two largest keys; ties -> lower group.
std::vector<bool> kept_groups(const RoutingConfig& cfg, const std::vector<float>& keys) {
  const int size = cfg.num_experts / cfg.n_group;
  std::vector<std::pair<float, int>> scores;
  for (int g = 0; g < cfg.n_group; ++g) {
    std::vector<float> k(keys.begin() + g * size, keys.begin() + (g + 1) * size);
    std::sort(k.begin(), k.end(), std::greater<>());
    scores.emplace_back(size > 1 ? k[0] + k[1] : k[0], g);
  }
  std::stable_sort(scores.begin(), scores.end(), [](auto a, auto b) { return a.first > b.first; });
  std::vector<bool> kept(cfg.n_group, false);
  for (int i = 0; i < cfg.topk_group; ++i) kept[scores[i].second] = true;
  return kept;
}

RoutingConfig random_config(std::mt19937& rng) {
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const RoutingMethod m = static_cast<RoutingMethod>(pick(0, 4));
  const int n_group = m == RoutingMethod::sigmoid_grouped ? std::vector<int>{1, 2, 4, 8}[pick(0, 3)] : 1;
  const int e = n_group * pick(1, 40);
  const int topk_group = pick(1, n_group);
  const int k = m == RoutingMethod::llama4 ? 1 : pick(1, std::min({32, e, topk_group * (e / n_group)}));
  const int s = pick(0, std::min(3, 32 - k));
  const float scale = pick(0, 1) ? 1.0f : 2.5f;
  return make_routing_config(m, e, k, s, pick(0, 1) == 1, n_group, topk_group, scale);
}

TEST(RoutingProperties, RandomCases) {
  for (uint32_t seed = 1; seed <= 300; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    const RoutingConfig cfg = random_config(rng);
    const int E = cfg.num_experts, K = cfg.top_k, S = cfg.num_shared_experts, T = 1 + seed % 5;
    std::uniform_real_distribution<float> dist(cfg.method == RoutingMethod::pre_scored ? 0.0f : -3.0f, 3.0f);
    std::vector<float> logits(T * E), bias;
    // Every third case rounds to quarters, which creates many exact ties.
    for (float& l : logits) l = seed % 3 == 0 ? std::round(dist(rng) * 4) / 4 : dist(rng);
    if (seed % 2 == 0) {
      bias.resize(E);
      for (float& b : bias) b = dist(rng) / 4;
    }
    const Routed r = route(cfg, logits, bias);
    for (int t = 0; t < T; ++t) {
      const int32_t* ids = &r.ids[t * cfg.slots()];
      const float* w = &r.weights[t * cfg.slots()];
      std::vector<float> keys(E);
      for (int e = 0; e < E; ++e) keys[e] = key_of(cfg, logits[t * E + e], bias, e);
      const std::vector<bool> kept = kept_groups(cfg, keys);
      const int size = E / cfg.n_group;
      std::vector<bool> chosen(E, false);
      for (int j = 0; j < K; ++j) {
        ASSERT_GE(ids[j], 0);
        ASSERT_LT(ids[j], E);
        EXPECT_FALSE(chosen[ids[j]]) << "expert " << ids[j] << " twice";
        chosen[ids[j]] = true;
        EXPECT_TRUE(kept[ids[j] / size]) << "expert " << ids[j] << " outside the kept groups";
        if (j > 0) {  // strictly decreasing in the (key, lower id) order
          EXPECT_GT(routing_math::packed_key(keys[ids[j - 1]], ids[j - 1]),
                    routing_math::packed_key(keys[ids[j]], ids[j]));
        }
      }
      // Top-K: no unselected expert of a kept group beats the last selected one.
      const uint64_t last = routing_math::packed_key(keys[ids[K - 1]], ids[K - 1]);
      for (int e = 0; e < E; ++e)
        if (!chosen[e] && kept[e / size]) {
          EXPECT_LT(routing_math::packed_key(keys[e], e), last) << "expert " << e;
        }
      for (int s = 0; s < S; ++s) {
        EXPECT_EQ(ids[K + s], E + s);
        EXPECT_EQ(w[K + s], 1.0f);
      }
      double sum = 0;
      for (int j = 0; j < K; ++j) sum += w[j];
      const bool normalized =
          cfg.method == RoutingMethod::topk_softmax || (cfg.renormalize && cfg.method != RoutingMethod::llama4);
      if (normalized) {
        EXPECT_NEAR(sum, cfg.routed_scaling_factor, 1e-5 * cfg.routed_scaling_factor);
      }
      if (cfg.method == RoutingMethod::llama4) {
        EXPECT_NEAR(w[0], cfg.routed_scaling_factor * sig(logits[t * E + ids[0]]), 1e-6);
      }
    }
  }
}

// Large T runs on several threads; each token must come out exactly as when routed alone.
TEST(RoutingProperties, ThreadedMatchesTokenByToken) {
  constexpr int kE = 64, kT = 1000;
  const RoutingConfig cfg = make_routing_config(RoutingMethod::sigmoid_grouped, kE, 6, 1, true, 8, 3, 2.5f);
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> dist(-3, 3);
  std::vector<float> logits(kT * kE), bias(kE);
  for (float& l : logits) l = dist(rng);
  for (float& b : bias) b = dist(rng) / 4;
  std::vector<int16_t> replay(kT * 6, -1);
  const Routed all = route(cfg, logits, bias, TensorView::contiguous(replay.data(), DType::i16, {kT, 6}));
  for (int t = 0; t < kT; ++t) {
    const Routed one = route(cfg, std::vector<float>(logits.begin() + t * kE, logits.begin() + (t + 1) * kE), bias);
    ASSERT_TRUE(std::equal(one.ids.begin(), one.ids.end(), all.ids.begin() + t * 7)) << "token " << t;
    ASSERT_TRUE(std::equal(one.weights.begin(), one.weights.end(), all.weights.begin() + t * 7)) << "token " << t;
    for (int j = 0; j < 6; ++j) ASSERT_EQ(replay[t * 6 + j], one.ids[j]) << "token " << t;
  }
}

// ---------------------------------------------------------------- validation: every rule, exact words

using testing::error_of;

std::string config_error(RoutingConfig c) {
  return error_of([&] { c.validate(); });
}

TEST(RoutingValidate, ConfigLimits) {
  using M = RoutingMethod;
  EXPECT_EQ(config_error(make_routing_config(M::softmax_topk, 8, 9)),
            "moekit::route: top_k (9) must be <= num_experts (8)");
  EXPECT_EQ(config_error(make_routing_config(M::softmax_topk, 8, 0)), "moekit::route: top_k (0) must be >= 1");
  EXPECT_EQ(config_error(make_routing_config(M::softmax_topk, 64, 33)), "moekit::route: top_k (33) must be <= 32");
  EXPECT_EQ(config_error(make_routing_config(M::softmax_topk, 0, 1)),
            "moekit::route: num_experts (0) must be in [1, 1024]");
  EXPECT_EQ(config_error(make_routing_config(M::softmax_topk, 1025, 1)),
            "moekit::route: num_experts (1025) must be in [1, 1024]");
  EXPECT_EQ(config_error(make_routing_config(M::softmax_topk, 8, 2, -1)),
            "moekit::route: num_shared_experts (-1) must be >= 0");
  EXPECT_EQ(config_error(make_routing_config(M::softmax_topk, 64, 30, 3)),
            "moekit::route: top_k + num_shared_experts (33) must be <= 32");
  EXPECT_EQ(config_error(make_routing_config(M::sigmoid_grouped, 8, 2, 0, false, 0, 1)),
            "moekit::route: n_group (0) must be >= 1");
  EXPECT_EQ(config_error(make_routing_config(M::sigmoid_grouped, 8, 2, 0, false, 3, 1)),
            "moekit::route: n_group (3) must divide num_experts (8)");
  EXPECT_EQ(
      config_error(make_routing_config(M::softmax_topk, 8, 2, 0, false, 2, 1)),
      "moekit::route: n_group (2) must be 1 for routing method softmax_topk (only sigmoid_grouped uses groups)");
  EXPECT_EQ(config_error(make_routing_config(M::sigmoid_grouped, 8, 2, 0, false, 4, 5)),
            "moekit::route: topk_group (5) must be in [1, n_group (4)]");
  EXPECT_EQ(config_error(make_routing_config(M::sigmoid_grouped, 8, 2, 0, false, 4, 0)),
            "moekit::route: topk_group (0) must be in [1, n_group (4)]");
  EXPECT_EQ(config_error(make_routing_config(M::sigmoid_grouped, 8, 3, 0, false, 4, 1)),
            "moekit::route: top_k (3) must be <= the experts in the kept groups, topk_group * num_experts / n_group "
            "(1 * 8 / 4 = 2)");
  EXPECT_EQ(config_error(make_routing_config(M::llama4, 8, 2)),
            "moekit::route: top_k (2) must be 1 for routing method llama4");
  EXPECT_EQ(config_error(make_routing_config(M::softmax_topk, 8, 2, 0, false, 1, 1, 0.0f)),
            "moekit::route: routed_scaling_factor (0) must be finite and > 0");
  EXPECT_EQ(config_error(make_routing_config(M::softmax_topk, 8, 2, 0, false, 1, 1, -1.5f)),
            "moekit::route: routed_scaling_factor (-1.5) must be finite and > 0");
  EXPECT_EQ(config_error(make_routing_config(M::softmax_topk, 8, 2, 0, false, 1, 1, kNaN)),
            "moekit::route: routed_scaling_factor (nan) must be finite and > 0");
  EXPECT_EQ(config_error(make_routing_config(M::softmax_topk, 8, 2, 0, false, 1, 1, kInf)),
            "moekit::route: routed_scaling_factor (inf) must be finite and > 0");
  // The limits themselves are accepted.
  EXPECT_EQ(config_error(make_routing_config(M::softmax_topk, 1024, 32)), "no throw");
  EXPECT_EQ(config_error(make_routing_config(M::sigmoid_grouped, 1024, 8, 24, true, 8, 4, 2.5f)), "no throw");
  EXPECT_EQ(config_error(make_routing_config(M::sigmoid_grouped, 8, 2, 0, false, 4, 1)), "no throw");
}

TEST(RoutingValidate, MethodNames) {
  for (RoutingMethod m : {RoutingMethod::softmax_topk, RoutingMethod::topk_softmax, RoutingMethod::sigmoid_grouped,
                          RoutingMethod::llama4, RoutingMethod::pre_scored})
    EXPECT_EQ(parse_routing_method(routing_method_name(m)), m);
  EXPECT_EQ(routing_method_name(RoutingMethod::sigmoid_grouped), "sigmoid_grouped");
  EXPECT_EQ(error_of([] { parse_routing_method("softmax"); }),
            "moekit::route: unknown routing method 'softmax' (expected one of: softmax_topk, topk_softmax, "
            "sigmoid_grouped, llama4, pre_scored)");
  // A method value outside the enum (an engine's integer cast in) is rejected, not routed with unset weights.
  RoutingConfig cfg = make_routing_config(static_cast<RoutingMethod>(7), 8, 2);
  EXPECT_EQ(error_of([&] { cfg.validate(); }), "moekit::route: method (7) must be a known routing method");
}

// Tensors for one call: cfg E = 8, K = 2, logits [4, 8] fp32 on the CPU. The buffers are large enough for every
// shape below; validation reads no data.
struct ArgsFixture {
  RoutingConfig cfg = make_routing_config(RoutingMethod::softmax_topk, 8, 2, 1);
  std::vector<float> buf = std::vector<float>(256, 0.0f);
  std::vector<int16_t> replay_buf = std::vector<int16_t>(64, 0);
  TensorView logits = TensorView::contiguous(buf.data(), DType::f32, {4, 8});
  TensorView bias = TensorView::contiguous(buf.data(), DType::f32, {8});
  TensorView replay = TensorView::contiguous(replay_buf.data(), DType::i16, {4, 2});

  std::string error(int64_t max_tokens = 4, Device device = Device::cpu()) const {
    return error_of([&] { validate_route_args(cfg, logits, bias, replay, max_tokens, device); });
  }
};

TEST(RoutingValidate, Logits) {
  ArgsFixture a;
  EXPECT_EQ(a.error(), "no throw");
  a.logits = TensorView::contiguous(a.buf.data(), DType::f32, {8});
  EXPECT_EQ(a.error(), "moekit::route: logits must be 2-D [T, E], got [8] fp32 cpu");
  a.logits = TensorView::contiguous(a.buf.data(), DType::f16, {4, 8});
  EXPECT_EQ(a.error(), "moekit::route: logits dtype (fp16) must be fp32 or bf16");
  a.logits = TensorView::contiguous(a.buf.data(), DType::f32, {4, 7});
  EXPECT_EQ(a.error(), "moekit::route: logits.shape[1] (7) must equal num_experts (8)");
  a.logits = TensorView::contiguous(a.buf.data(), DType::f32, {4, 8});
  a.logits.shape[0] = -1;  // only a hand-built view has a negative extent
  EXPECT_EQ(a.error(), "moekit::route: logits.shape[0] (-1) must be >= 0");
  a.logits.shape[0] = 4;
  a.logits.strides = {16, 2};
  EXPECT_EQ(a.error(), "moekit::route: logits.stride[1] (2) must be 1");
  a.logits.strides = {4, 1};
  EXPECT_EQ(a.error(), "moekit::route: logits.stride[0] (4) must be >= num_experts (8)");
  a.logits.strides = {12, 1};
  EXPECT_EQ(a.error(), "no throw");
  EXPECT_EQ(a.error(3), "moekit::route: tokens (4) must be <= max_tokens (3)");
  a.bias = {};
  a.replay = {};
  EXPECT_EQ(a.error(4, Device::cuda(0)), "moekit::route: logits.device (cpu) must be the routing device (cuda:0)");
  a.logits.data = nullptr;
  EXPECT_EQ(a.error(), "moekit::route: logits.data (null) must be non-null");
  // The config is validated first.
  a.cfg.top_k = 9;
  EXPECT_EQ(a.error(), "moekit::route: top_k (9) must be <= num_experts (8)");
}

TEST(RoutingValidate, Bias) {
  ArgsFixture a;
  a.bias = TensorView::contiguous(a.buf.data(), DType::f32, {7});
  EXPECT_EQ(a.error(), "moekit::route: bias must be 1-D [E] with E = num_experts (8), got [7] fp32 cpu");
  a.bias = TensorView::contiguous(a.buf.data(), DType::f32, {1, 8});
  EXPECT_EQ(a.error(), "moekit::route: bias must be 1-D [E] with E = num_experts (8), got [1, 8] fp32 cpu");
  a.bias = TensorView::contiguous(a.buf.data(), DType::i32, {8});
  EXPECT_EQ(a.error(), "moekit::route: bias dtype (int32) must be fp32 or bf16");
  a.bias = TensorView::contiguous(a.buf.data(), DType::bf16, {8});
  EXPECT_EQ(a.error(), "no throw");
  a.bias.strides[0] = 2;
  EXPECT_EQ(a.error(), "moekit::route: bias.stride[0] (2) must be 1");
  a.bias = TensorView::contiguous(a.buf.data(), DType::f32, {8}, Device::cuda(1));
  EXPECT_EQ(a.error(), "moekit::route: bias.device (cuda:1) must be the routing device (cpu)");
}

TEST(RoutingValidate, Replay) {
  ArgsFixture a;
  a.replay = TensorView::contiguous(a.replay_buf.data(), DType::i32, {4, 2});
  EXPECT_EQ(a.error(), "moekit::route: replay dtype (int32) must be int16");
  a.replay = TensorView::contiguous(a.replay_buf.data(), DType::i16, {3, 2});
  EXPECT_EQ(a.error(), "moekit::route: replay rows (3) must be >= tokens (4)");
  a.replay = TensorView::contiguous(a.replay_buf.data(), DType::i16, {4, 3});  // K + S is not the width
  EXPECT_EQ(a.error(), "moekit::route: replay.shape[1] (3) must equal top_k (2)");
  a.replay = TensorView::contiguous(a.replay_buf.data(), DType::i16, {8});
  EXPECT_EQ(a.error(), "moekit::route: replay must be 2-D [R, K] with K = top_k (2), got [8] int16 cpu");
  a.replay = TensorView::contiguous(a.replay_buf.data(), DType::i16, {6, 2});
  EXPECT_EQ(a.error(), "no throw");  // more rows than tokens is the normal case
  a.replay.strides[0] = 4;
  EXPECT_EQ(a.error(), "moekit::route: replay strides ([4, 1]) must be contiguous ([2, 1])");
  a.replay = TensorView::contiguous(a.replay_buf.data(), DType::i16, {4, 2}, Device::cuda(0));
  EXPECT_EQ(a.error(), "moekit::route: replay.device (cuda:0) must be the routing device (cpu)");
  // The router writes replay while it reads logits and bias: no shared byte (the rows just after logits are fine).
  auto replay_at = [&](int float_offset) {
    return TensorView::contiguous(reinterpret_cast<int16_t*>(a.buf.data() + float_offset), DType::i16, {4, 2});
  };
  a.replay = replay_at(31);  // logits are floats 0..31
  EXPECT_EQ(a.error(), "moekit::route: replay ([4, 2] int16 cpu) must share no byte with logits");
  a.replay = replay_at(32);
  EXPECT_EQ(a.error(), "no throw");
  a.bias = TensorView::contiguous(a.buf.data() + 64, DType::f32, {8});
  a.replay = replay_at(70);
  EXPECT_EQ(a.error(), "moekit::route: replay ([4, 2] int16 cpu) must share no byte with bias");
  a.replay = replay_at(72);
  EXPECT_EQ(a.error(), "no throw");
  // The rule E < 32768 for replay cannot trigger while num_experts <= 1024, so it has no test here.
}

// Logits, bias and replay start on an element boundary of their dtype (a misaligned element access faults on the
// GPU and is undefined on the CPU); sizes and strides in elements keep every later element aligned too.
TEST(RoutingValidate, PointersAlignedToTheirElements) {
  ArgsFixture a;
  char* base = reinterpret_cast<char*>(a.buf.data());
  auto expected = [](const char* name, const void* p, int bytes, const char* dtype) {
    return fmt::format("moekit::route: {}.data ({:#x}) must be {}-byte aligned (its {} elements)", name,
                       reinterpret_cast<uintptr_t>(p), bytes, dtype);
  };
  a.logits = TensorView::contiguous(base + 2, DType::f32, {4, 8});
  EXPECT_EQ(a.error(), expected("logits", base + 2, 4, "fp32"));
  a.logits = TensorView::contiguous(base + 2, DType::bf16, {4, 8});  // 2 bytes in: a bf16 boundary
  EXPECT_EQ(a.error(), "no throw");
  a.logits = TensorView::contiguous(base + 1, DType::bf16, {4, 8});
  EXPECT_EQ(a.error(), expected("logits", base + 1, 2, "bf16"));
  a.logits = TensorView::contiguous(a.buf.data(), DType::f32, {4, 8});
  a.bias = TensorView::contiguous(base + 128 + 2, DType::f32, {8});
  EXPECT_EQ(a.error(), expected("bias", base + 130, 4, "fp32"));
  a.bias = TensorView::contiguous(base + 128 + 1, DType::bf16, {8});
  EXPECT_EQ(a.error(), expected("bias", base + 129, 2, "bf16"));
  a.bias = TensorView::contiguous(base + 128 + 2, DType::bf16, {8});
  EXPECT_EQ(a.error(), "no throw");
  char* replay_base = reinterpret_cast<char*>(a.replay_buf.data());
  a.replay = TensorView::contiguous(replay_base + 1, DType::i16, {4, 2});
  EXPECT_EQ(a.error(), expected("replay", replay_base + 1, 2, "int16"));
  // The reference checks the same rules (route() on a CPU plan validates before it reads).
  RoutePlan plan({4, 8, 2, 0, 4}, Device::cpu());
  EXPECT_EQ(error_of([&] {
              route(a.cfg, TensorView::contiguous(base + 2, DType::f32, {4, 8}), {}, plan);
            }),
            expected("logits", base + 2, 4, "fp32"));
}

TEST(RoutingValidate, ReferenceValidatesItsArguments) {
  std::vector<float> logits(8, 0.0f);
  std::vector<int32_t> ids(8);
  std::vector<float> w(8);
  const TensorView lv = TensorView::contiguous(logits.data(), DType::f32, {2, 4});
  EXPECT_EQ(error_of([&] {
              route_topk_reference(make_routing_config(RoutingMethod::softmax_topk, 4, 5), lv, {}, ids.data(),
                                   w.data());
            }),
            "moekit::route: top_k (5) must be <= num_experts (4)");
  EXPECT_EQ(error_of([&] {
              route_topk_reference(make_routing_config(RoutingMethod::softmax_topk, 4, 2), lv, {}, nullptr, w.data());
            }),
            "moekit::route: topk_ids (null) must be non-null");
  EXPECT_EQ(error_of([&] {
              route_topk_reference(make_routing_config(RoutingMethod::softmax_topk, 4, 2), lv, {}, ids.data(),
                                   nullptr);
            }),
            "moekit::route: topk_weights (null) must be non-null");
  std::vector<int16_t> replay(2);
  const TensorView rv = TensorView::contiguous(replay.data(), DType::i16, {1, 2});
  EXPECT_EQ(error_of([&] {
              route_topk_reference(make_routing_config(RoutingMethod::softmax_topk, 4, 2), lv, {}, ids.data(),
                                   w.data(), rv);
            }),
            "moekit::route: replay rows (1) must be >= tokens (2)");
}

// ---------------------------------------------------------------- portable exp / sigmoid and the key order

// Distance in units in the last place between two non-NaN floats (through the sign-magnitude integer order).
int64_t ulps(float a, float b) {
  auto ordered = [](float f) {
    const int64_t u = routing_math::bits(f);
    return u & 0x80000000 ? -(u & 0x7fffffff) : u;
  };
  return std::abs(ordered(a) - ordered(b));
}

std::vector<float> sweep(float lo, float hi, int n) {
  std::vector<float> xs;
  for (int i = 0; i <= n; ++i) xs.push_back(lo + (hi - lo) * static_cast<float>(i) / static_cast<float>(n));
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(lo, hi);
  for (int i = 0; i < n; ++i) xs.push_back(dist(rng));
  return xs;
}

// The router's divisions by Kt (<= 32), B (<= 256) and the group size (<= 1024): every numerator below 2^16 for
// those divisors, and for every divisor up to 2^16 the numerators around each multiple.
TEST(RoutingMath, MagicDivisionIsExact) {
  int64_t checked = 0;
  for (uint32_t d = 1; d <= 1024; ++d) {
    const uint32_t m = routing_math::division_magic(d);
    for (uint32_t n = 0; n < (1u << 16); ++n) {
      if (routing_math::magic_div(n, m) != n / d) {
        ADD_FAILURE() << n << " / " << d << ": " << routing_math::magic_div(n, m) << ", want " << n / d;
        return;
      }
      ++checked;
    }
  }
  for (uint32_t d = 1025; d <= (1u << 16); ++d) {
    const uint32_t m = routing_math::division_magic(d);
    for (uint32_t q = 1; q * d < (1u << 16); ++q)
      for (uint32_t n : {q * d - 1, q * d, q * d + d - 1}) {
        if (n >= (1u << 16)) continue;
        ASSERT_EQ(routing_math::magic_div(n, m), n / d) << n << " / " << d;
        ++checked;
      }
    ASSERT_EQ(routing_math::magic_div(0, m), 0u) << "0 / " << d;
  }
  EXPECT_EQ(routing_math::division_magic(1), 0u);  // 2^32 wraps: magic_div treats 0 as the divisor 1
  EXPECT_EQ(routing_math::magic_div(65535, 0), 65535u);
  EXPECT_GT(checked, int64_t{1024} << 16);
}

TEST(RoutingMath, ExpWithin3UlpOfStdExp) {
  std::vector<float> xs = sweep(-110.0f, 88.7f, 200000);
  for (float x :
       {-110.0f, -104.0f, -103.9f, -87.0f, -87.3f, -1e-30f, -0.0f, 0.0f, 1e-30f, 1.0f, 88.0f, 88.7f, 88.72283f})
    xs.push_back(x);
  int64_t worst = 0;
  for (float x : xs) {
    const float got = routing_math::exp(x), want = std::exp(x);
    ASSERT_LE(ulps(got, want), 3) << "x = " << x << ": " << got << " vs " << want;
    worst = std::max(worst, ulps(got, want));
  }
  std::printf("exp: worst %lld ulp over %zu values\n", static_cast<long long>(worst), xs.size());
  EXPECT_EQ(routing_math::exp(0.0f), 1.0f);
  EXPECT_TRUE(std::isnan(routing_math::exp(kNaN)));
  EXPECT_EQ(routing_math::exp(kInf), kInf);
  EXPECT_EQ(routing_math::exp(-kInf), 0.0f);
  EXPECT_EQ(routing_math::exp(89.0f), kInf);
  EXPECT_EQ(routing_math::exp(-110.0f), 0.0f);
}

TEST(RoutingMath, SigmoidWithin4UlpOfTheFormula) {
  std::vector<float> xs = sweep(-100.0f, 100.0f, 200000);
  for (float x : {-110.0f, -88.7f, -87.0f, -20.0f, -1e-30f, 0.0f, 1e-30f, 17.0f, 88.7f, 110.0f}) xs.push_back(x);
  for (float x : xs) {
    const float got = routing_math::sigmoid(x), want = 1.0f / (1.0f + std::exp(-x));
    ASSERT_LE(ulps(got, want), 4) << "x = " << x << ": " << got << " vs " << want;
  }
  EXPECT_EQ(routing_math::sigmoid(0.0f), 0.5f);
  EXPECT_EQ(routing_math::sigmoid(kInf), 1.0f);
  EXPECT_EQ(routing_math::sigmoid(-kInf), 0.0f);
  EXPECT_TRUE(std::isnan(routing_math::sigmoid(kNaN)));
}

TEST(RoutingMath, KeyOrder) {
  using routing_math::ordered_key;
  using routing_math::packed_key;
  const std::vector<float> ascending{kNaN, -kInf, -1e30f, -1.0f, -1e-40f, 0.0f, 1e-40f, 1.0f, 1e30f, kInf};
  for (size_t i = 1; i < ascending.size(); ++i) EXPECT_LT(ordered_key(ascending[i - 1]), ordered_key(ascending[i]));
  EXPECT_EQ(ordered_key(-0.0f), ordered_key(0.0f));
  EXPECT_EQ(ordered_key(-kNaN), ordered_key(kNaN));
  EXPECT_GT(packed_key(1.0f, 3), packed_key(1.0f, 4));  // equal keys: the lower id ranks higher
  EXPECT_GT(packed_key(1.0f, 1000), packed_key(0.5f, 0));
  EXPECT_EQ(routing_math::packed_expert(packed_key(-2.0f, 1023)), 1023);
}

}  // namespace
}  // namespace moekit

// Autotuner: token buckets, key sensitivity, the drift-corrected comparison, staged search on tactics with known
// costs, the default heuristic, timing on caller-given logits, and the progress output. The persisted cache:
// tuning_cache_test.cpp.
#include "moekit/tuner.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "fake_runner.h"
#include "moekit/error.h"
#include "moekit/layer.h"
#include "moekit/version.h"
#include "runtime/progress.h"
#include "tuner_test_util.h"

namespace moekit {
namespace {

using testing::built_runner;
using testing::FakeRunner;
using testing::FakeRunnerConfig;
using testing::small_spec;
using testing::test_metadata;

// ---- buckets
// --------------------------------------------------------------------------------------------------------

TEST(TokenBucket, Boundaries) {
  const std::pair<int64_t, int64_t> cases[] = {
      {1, 1},         {2, 2},
      {3, 4},         {5, 8},
      {255, 256},     {256, 256},
      {257, 512},     {512, 512},
      {513, 768},     {1000, 1024},
      {2047, 2048},   {2048, 2048},
      {2049, 2560},   {2560, 2560},
      {2561, 3072},   {4095, 4096},
      {4096, 4096},   {4097, 8192},
      {8192, 8192},   {8193, 16384},
      {16384, 16384}, {kMaxTunedTokens, int64_t{1} << 31},
  };
  for (auto [t, b] : cases) EXPECT_EQ(token_bucket(t), b) << "T=" << t;
}

TEST(TokenBucket, MatchesTheRuleForEveryTokenCount) {
  // The bucket list written out from DESIGN §6, independently of the implementation.
  std::vector<int64_t> list;
  for (int64_t b = 1; b <= 256; b *= 2) list.push_back(b);
  for (int64_t b = 512; b <= 2048; b += 256) list.push_back(b);
  for (int64_t b = 2560; b <= 4096; b += 512) list.push_back(b);
  for (int64_t b = 8192; b <= 65536; b *= 2) list.push_back(b);
  for (int64_t t = 1; t <= 65536; ++t) {
    const int64_t expected = *std::lower_bound(list.begin(), list.end(), t);
    ASSERT_EQ(token_bucket(t), expected) << "T=" << t;
  }
  EXPECT_EQ(token_buckets(65536), list);
  EXPECT_EQ(token_buckets(3), (std::vector<int64_t>{1, 2, 4}));
  EXPECT_EQ(token_buckets(1), (std::vector<int64_t>{1}));
}

TEST(TokenBucket, RejectsOutOfRange) {
  for (int64_t t : {int64_t{0}, int64_t{-1}, kMaxTunedTokens + 1}) {
    try {
      token_bucket(t);
      FAIL() << "no throw for " << t;
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(std::string(e.what()),
                "moekit::tuner: tokens (" + std::to_string(t) + ") must be in [1, 2147483647]");
    }
  }
}

// ---- key
// ------------------------------------------------------------------------------------------------------------

TEST(TuningKey, IsReadableAndHoldsEveryField) {
  FakeRunner r;
  ASSERT_TRUE(r.check_support(small_spec(), Device::cpu()).ok);
  EXPECT_EQ(tuning_key(r, small_spec(), 40),
            "runner=fake@1 E=8 local=8@0 K=2 S=0 H=16 I=8 act=silu_gated gate_up=gate_first bias=0 "
            "routing=softmax_topk groups=1/1 w=bf16 a=bf16 blocks=128x128/128 T=64");
  LayerSpec llama4_like = small_spec();
  llama4_like.experts.routing_weight_on_input = true;
  EXPECT_EQ(tuning_key(r, llama4_like, 40),
            "runner=fake@1 E=8 local=8@0 K=2 S=0 H=16 I=8 act=silu_gated gate_up=gate_first bias=0 weight_on_input=1 "
            "routing=softmax_topk groups=1/1 w=bf16 a=bf16 blocks=128x128/128 T=64");
}

TEST(TuningKey, EveryFieldChangesTheKey) {
  const LayerSpec base = small_spec();
  FakeRunner runner;
  std::vector<std::pair<std::string, std::string>> keys;  // (what changed, key)
  keys.emplace_back("nothing", tuning_key(runner, base, 64));
  auto with = [&](const std::string& what, auto mutate) {
    LayerSpec s = base;
    mutate(s);
    s.validate();  // every variant is a valid layer
    keys.emplace_back(what, tuning_key(runner, s, 64));
  };
  with("E", [](LayerSpec& s) { s.experts.num_experts = s.routing.num_experts = 16; });
  with("local E", [](LayerSpec& s) { s.experts.local_num_experts = 4; });
  with("offset", [](LayerSpec& s) {
    s.experts.local_num_experts = 4;
    s.experts.local_expert_offset = 4;
  });
  with("K", [](LayerSpec& s) { s.experts.top_k = s.routing.top_k = 4; });
  with("S", [](LayerSpec& s) { s.experts.num_shared_experts = s.routing.num_shared_experts = 1; });
  with("H", [](LayerSpec& s) { s.experts.hidden = 32; });
  with("I", [](LayerSpec& s) { s.experts.intermediate = 16; });
  with("activation", [](LayerSpec& s) { s.experts.activation = Activation::swiglu_clamped; });
  with("gate_up", [](LayerSpec& s) { s.experts.gate_up = GateUpLayout::interleaved; });
  with("expert biases", [](LayerSpec& s) { s.expert_biases = true; });
  with("routing weight on input", [](LayerSpec& s) { s.experts.routing_weight_on_input = true; });
  with("routing method", [](LayerSpec& s) { s.routing.method = RoutingMethod::topk_softmax; });
  with("n_group", [](LayerSpec& s) {
    s.routing.method = RoutingMethod::sigmoid_grouped;
    s.routing.n_group = 4;
    s.routing.topk_group = 4;
  });
  with("topk_group", [](LayerSpec& s) {
    s.routing.method = RoutingMethod::sigmoid_grouped;
    s.routing.n_group = 4;
    s.routing.topk_group = 2;
  });
  with("weight format", [](LayerSpec& s) { s.quant.weight_format = WeightFormat::fp8_e4m3_block; });
  with("activation format", [](LayerSpec& s) {
    s.quant.weight_format = WeightFormat::fp8_e4m3_block;
    s.quant.activation_format = ActivationFormat::fp8_e4m3_token_block;
  });
  with("block_n", [](LayerSpec& s) { s.quant.block_n = 64; });
  with("block_k", [](LayerSpec& s) { s.quant.block_k = 64; });
  with("activation block", [](LayerSpec& s) { s.quant.activation_block = 64; });
  keys.emplace_back("bucket", tuning_key(runner, base, 65));
  FakeRunner other_name({.name = "other"});
  keys.emplace_back("runner", tuning_key(other_name, base, 64));
  FakeRunner other_version({.version = "2"});
  keys.emplace_back("runner version", tuning_key(other_version, base, 64));

  std::set<std::string> distinct;
  for (const auto& [what, key] : keys) EXPECT_TRUE(distinct.insert(key).second) << what << " did not change: " << key;
  // The topk_group variant must differ from the n_group one too, so both group fields are in the key.
  // Token counts inside one bucket share the key.
  EXPECT_EQ(tuning_key(runner, base, 33), tuning_key(runner, base, 64));
}

// ---- comparing under drift
// ------------------------------------------------------------------------------------------------

TEST(BracketedRatio, InterpolatesTheReferenceAtTheCandidatesPlace) {
  // Reference 10, 12, 14: a linear drift; a candidate equal to it at its place reads 1 in every round.
  const std::vector<double> ref{10, 12, 14};
  EXPECT_DOUBLE_EQ(bracketed_ratio(ref, std::vector<double>{11, 13}, 0.5), 1.0);
  EXPECT_DOUBLE_EQ(bracketed_ratio(ref, std::vector<double>{10.5, 12.5}, 0.25), 1.0);
  // Rounds' ratios 0.9, 1.2, 0.95: the median.
  EXPECT_DOUBLE_EQ(bracketed_ratio(std::vector<double>{10, 10, 10, 10}, std::vector<double>{9, 12, 9.5}, 0.5), 0.95);
  // Two rounds: the mean of their ratios.
  EXPECT_DOUBLE_EQ(bracketed_ratio(ref, std::vector<double>{9.9, 14.3}, 0.5), 0.5 * (0.9 + 1.1));
}

TEST(BracketedRatio, RejectsWhatItCannotCompare) {
  const std::vector<double> two{1, 1}, three{1, 1, 1}, one{1};
  auto error = [](std::span<const double> ref, std::span<const double> cand, double f) {
    try {
      bracketed_ratio(ref, cand, f);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no throw");
  };
  EXPECT_EQ(error(one, {}, 0.5), "moekit::tuner: bracketed_ratio: candidate has no timings");
  EXPECT_EQ(error(three, one, 0.5),
            "moekit::tuner: bracketed_ratio: reference has 3 timings, must have candidate's 1 + 1 (one before each "
            "round and one after the last)");
  for (double f : {0.0, 1.0, -0.5, std::nan("")})
    EXPECT_EQ(error(two, one, f).rfind("moekit::tuner: bracketed_ratio: fraction (", 0), 0u) << f;
  EXPECT_EQ(error(std::vector<double>{1, 0}, one, 0.5),
            "moekit::tuner: bracketed_ratio: reference[1] (0) must be finite and positive");
  EXPECT_EQ(error(two, std::vector<double>{std::numeric_limits<double>::infinity()}, 0.5),
            "moekit::tuner: bracketed_ratio: candidate[0] (inf) must be finite and positive");
}

TEST(BracketingSpread, MeasuresTheDeparturesFromAStraightLineThatBracketingCannotCancel) {
  EXPECT_EQ(bracketing_spread(std::vector<double>{}), 0.0);
  EXPECT_EQ(bracketing_spread(std::vector<double>{10, 20}), 0.0);          // no inner timing
  EXPECT_EQ(bracketing_spread(std::vector<double>{10, 11, 12, 13}), 0.0);  // a linear drift
  // 10.5 against the line's 10 (5%), then 10 against 10.25 (2.4%): the larger.
  EXPECT_DOUBLE_EQ(bracketing_spread(std::vector<double>{10, 10.5, 10, 10.5}), 0.05);
  EXPECT_DOUBLE_EQ(bracketing_spread(std::vector<double>{10, 9, 10}), 0.1);
}

TEST(BracketingSpread, RejectsTimingsThatAreNotTimes) {
  for (double bad : {0.0, -1.0, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    try {
      bracketing_spread(std::vector<double>{1.0, bad, 1.0});
      FAIL() << "no throw for " << bad;
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(std::string(e.what()).rfind("moekit::tuner: bracketing_spread: reference[1] (", 0), 0u) << e.what();
      EXPECT_NE(std::string(e.what()).find(") must be finite and positive"), std::string::npos) << e.what();
    }
  }
}

// ---- staged search
// --------------------------------------------------------------------------------------------------

TEST(StagedTuning, AdditiveCostsFindTheBestPairWithNPlusNPlus16Timings) {
  const std::vector<double> c1{5, 2, 7, 1, 9};  // best GEMM1: 3, then 1
  const std::vector<double> c2{4, 8, 3, 6};     // best GEMM2: 2, then 0
  auto r = built_runner(
      {.n1 = 5, .n2 = 4, .default_pair = {0, 1}, .cost = [&](TacticPair p) { return c1[p.gemm1] + c2[p.gemm2]; }});
  Autotuner tuner(test_metadata());
  const int64_t tokens[] = {100};
  std::vector<TuneResult> res = tuner.tune(*r, small_spec(), tokens);
  ASSERT_EQ(res.size(), 1u);
  EXPECT_EQ(res[0].timed_configs, 5 + 4 + 3 * 5 + 1);
  ASSERT_EQ(r->timed.size(), 25u);
  // Stage 1: each GEMM1 tactic with the default GEMM2 (1); stage 2: each GEMM2 with the default GEMM1 (0).
  for (int i = 0; i < 5; ++i) EXPECT_EQ(r->timed[i], (TacticPair{i, 1}));
  for (int j = 0; j < 4; ++j) EXPECT_EQ(r->timed[5 + j], (TacticPair{0, j}));
  // Stage 3: three rounds of the default and the 2x2 shortlist pairs, in turn, then the default once more.
  const std::vector<TacticPair> round{{0, 1}, {3, 2}, {3, 0}, {1, 2}, {1, 0}};
  for (int k = 0; k < 3; ++k)
    EXPECT_EQ(std::vector<TacticPair>(r->timed.begin() + 9 + 5 * k, r->timed.begin() + 14 + 5 * k), round)
        << "round " << k;
  EXPECT_EQ(r->timed.back(), (TacticPair{0, 1}));
  EXPECT_EQ(r->schedules, (std::vector<size_t>{9, 16}));  // one schedule per stage: both GEMMs', the final one
  EXPECT_EQ(res[0].best, (TacticPair{3, 2}));
  // The result holds every final timing: the default's four, each pair's three and its ratio to the default.
  EXPECT_EQ(res[0].default_timings, (std::vector<double>(4, 5.0 + 8.0)));
  ASSERT_EQ(res[0].final_stage.size(), 4u);
  for (size_t j = 0; j < 4; ++j) {
    const FinalStageTiming& f = res[0].final_stage[j];
    EXPECT_EQ(f.tactics, round[j + 1]);
    const double cost = c1[f.tactics.gemm1] + c2[f.tactics.gemm2];
    EXPECT_EQ(f.seconds, (std::vector<double>(3, cost)));
    EXPECT_DOUBLE_EQ(f.ratio, cost / 13.0);
  }
  EXPECT_EQ(res[0].bucket, 128);
  for (int64_t t : r->timed_tokens) EXPECT_EQ(t, 128);  // timed at the bucket
  const TuningEntry& e = res[0].entry;
  EXPECT_EQ(e.gemm1, "g1_3");
  EXPECT_EQ(e.gemm2, "g2_2");
  EXPECT_EQ(e.gemm1_shortlist, (std::vector<std::string>{"g1_3", "g1_1"}));
  EXPECT_EQ(e.gemm2_shortlist, (std::vector<std::string>{"g2_2", "g2_0"}));
  EXPECT_EQ(e.seconds, 1.0 + 3.0);
  EXPECT_EQ(e.default_seconds, 5.0 + 8.0);
  EXPECT_EQ(e.tokens, 128);
}

TEST(StagedTuning, FindsABetterPairThanTheStageWinnersWhenCostsDoNotCompose) {
  // Alone, GEMM1 0 and GEMM2 0 win their stages, but together they pay a penalty of 10 (say, both want the
  // same shared memory); the best of the four shortlist pairs is (1, 0).
  const std::vector<double> c1{1, 2, 5}, c2{1, 3, 5};
  auto cost = [&](TacticPair p) { return c1[p.gemm1] + c2[p.gemm2] + (p.gemm1 == 0 && p.gemm2 == 0 ? 10.0 : 0.0); };
  auto r = built_runner({.n1 = 3, .n2 = 3, .default_pair = {2, 2}, .cost = cost});
  Autotuner tuner(test_metadata());
  const int64_t tokens[] = {64};
  TuneResult res = tuner.tune(*r, small_spec(), tokens)[0];
  EXPECT_EQ(res.timed_configs, 3 + 3 + 3 * 5 + 1);
  EXPECT_EQ(res.entry.gemm1_shortlist, (std::vector<std::string>{"g1_0", "g1_1"}));
  EXPECT_EQ(res.entry.gemm2_shortlist, (std::vector<std::string>{"g2_0", "g2_1"}));
  // Pairs: (0,0) = 12, (0,1) = 4, (1,0) = 3, (1,1) = 5.
  EXPECT_EQ(res.best, (TacticPair{1, 0}));
  EXPECT_EQ(res.entry.seconds, 3.0);
  EXPECT_EQ(res.entry.default_seconds, 10.0);
}

TEST(StagedTuning, KeepsTheDefaultWhenEveryShortlistPairIsSlower) {
  // Each stage ranks tactics next to the default partner, where 1 and 2 look best; paired together they pay a
  // penalty of 20, so all four shortlist pairs lose to the default pair (0, 0), timed beside them.
  const std::vector<double> c1{5, 1, 2}, c2{5, 1, 2};
  auto cost = [&](TacticPair p) { return c1[p.gemm1] + c2[p.gemm2] + (p.gemm1 != 0 && p.gemm2 != 0 ? 20.0 : 0.0); };
  auto r = built_runner({.n1 = 3, .n2 = 3, .default_pair = {0, 0}, .cost = cost});
  Autotuner tuner(test_metadata());
  const int64_t tokens[] = {8};
  TuneResult res = tuner.tune(*r, small_spec(), tokens)[0];
  EXPECT_EQ(res.timed_configs, 3 + 3 + 3 * 5 + 1);
  // Shortlist pairs: (1,1) = 22, (1,2) = 23, (2,1) = 23, (2,2) = 24; the default (0,0) = 10.
  EXPECT_EQ(res.best, (TacticPair{0, 0}));
  EXPECT_EQ(res.entry.seconds, 10.0);
  EXPECT_EQ(res.entry.gemm1, "g1_0");
  EXPECT_EQ(res.entry.gemm2, "g2_0");
}

// GEMM1 and GEMM2 tactics 1 and 2 look faster next to the default partner (0), but together they pay `penalty`:
// the best shortlist pair, (1, 1), costs 8 + penalty against the default (0, 0)'s 10.
double paired_cost(TacticPair p, double penalty) {
  const double c[] = {5.0, 4.0, 4.5};
  return c[p.gemm1] + c[p.gemm2] + (p.gemm1 != 0 && p.gemm2 != 0 ? penalty : 0.0);
}

TEST(StagedTuning, APairReplacesTheDefaultOnlyWhenMoreThanOnePercentFaster) {
  for (const auto& [penalty, want] :
       {std::pair{2.0, TacticPair{0, 0}}, std::pair{1.95, TacticPair{0, 0}}, std::pair{1.8, TacticPair{1, 1}}}) {
    auto r = built_runner({.cost = [penalty = penalty](TacticPair p) { return paired_cost(p, penalty); }});
    Autotuner tuner(test_metadata());
    const int64_t tokens[] = {64};
    const TuneResult res = tuner.tune(*r, small_spec(), tokens)[0];
    EXPECT_EQ(res.best, want) << "(1, 1) costs " << 8 + penalty << " against the default's 10";
    EXPECT_EQ(res.entry.default_seconds, 10.0);
    EXPECT_EQ(res.entry.seconds, (want == TacticPair{0, 0} ? 10.0 : 8 + penalty));
  }
}

// Timings that drift by up to 0.5% per call (clocks settling under a power cap, temperature) must not turn a tie into
// a tuned entry: each pair is compared with the default timed around it. (Against a default timed first in stage 1,
// the final pairs, timed 6-9 calls later, would look 0.6-0.9% faster or slower by a drift of 0.1% alone; against a
// default timed last in each round, 1-4 calls after the pairs, the first pair would look 2% faster by a drift of
// 0.5%.)
TEST(StagedTuning, ADriftDuringTheSearchDoesNotReplaceTheDefaultWithAnEqualPair) {
  for (double drift : {-5e-3, -1e-3, 1e-3, 5e-3}) {
    int calls = 0;
    auto r = built_runner({.cost = [&](TacticPair p) { return paired_cost(p, 2.0) * (1.0 + drift * calls++); }});
    Autotuner tuner(test_metadata());
    const int64_t tokens[] = {64};
    const TuneResult res = tuner.tune(*r, small_spec(), tokens)[0];
    EXPECT_EQ(res.best, (TacticPair{0, 0})) << "drift " << drift;
    EXPECT_EQ(res.entry.gemm1_shortlist, (std::vector<std::string>{"g1_1", "g1_2"}));
    EXPECT_EQ(res.timed_configs, 3 + 3 + 3 * 5 + 1);
    ASSERT_EQ(res.final_stage.size(), 4u);
    for (const FinalStageTiming& f : res.final_stage)  // a linear drift cancels in the bracketed ratios
      EXPECT_NEAR(f.ratio, paired_cost(f.tactics, 2.0) / 10.0, 1e-12) << "drift " << drift;
  }
}

// Under the same drift a pair 2% faster than the default still wins.
TEST(StagedTuning, ADriftDuringTheSearchDoesNotHideAFasterPair) {
  for (double drift : {-5e-3, 5e-3}) {
    int calls = 0;
    auto r = built_runner({.cost = [&](TacticPair p) { return paired_cost(p, 1.8) * (1.0 + drift * calls++); }});
    Autotuner tuner(test_metadata());
    const int64_t tokens[] = {64};
    const TuneResult res = tuner.tune(*r, small_spec(), tokens)[0];
    EXPECT_EQ(res.best, (TacticPair{1, 1})) << "drift " << drift;  // 9.8 against the default's 10
    ASSERT_FALSE(res.final_stage.empty());
    EXPECT_EQ(res.final_stage[0].tactics, (TacticPair{1, 1}));
    EXPECT_NEAR(res.final_stage[0].ratio, 0.98, 1e-12) << "drift " << drift;
  }
}

// One slow timing of the winner (a context switch, another process on the GPU) does not decide: medians of 3 rounds.
TEST(StagedTuning, TheFinalStageRanksByMediansOverTheRounds) {
  int calls = 0;
  auto r = built_runner({.cost = [&](TacticPair p) {
    ++calls;
    const double c = paired_cost(p, 1.0);                            // (1, 1) costs 9, the default 10
    return p == TacticPair{1, 1} && calls == 3 + 3 + 2 ? 100.0 : c;  // its first final timing is an outlier
  }});
  Autotuner tuner(test_metadata());
  const int64_t tokens[] = {64};
  const TuneResult res = tuner.tune(*r, small_spec(), tokens)[0];
  EXPECT_EQ(r->timed[7], (TacticPair{1, 1}));  // the outlier hit the winner
  EXPECT_EQ(res.best, (TacticPair{1, 1}));
  EXPECT_EQ(res.entry.seconds, 9.0);
}

// One slow timing of the default between two rounds enters both rounds' ratios and makes an equal pair look faster in
// two of its three; the pair's median time, no lower than the default's, keeps the default. (A fast one makes the
// pairs look slower.)
TEST(StagedTuning, OneOutlyingTimingOfTheDefaultDoesNotDecide) {
  for (double outlier : {5.0, 100.0}) {
    int calls = 0;
    auto r = built_runner({.cost = [&](TacticPair p) {
      ++calls;
      // (1, 1) costs 10 like the default; the default's second final timing (before round 2) is the outlier
      return p == TacticPair{0, 0} && calls == 3 + 3 + 6 ? outlier : paired_cost(p, 2.0);
    }});
    Autotuner tuner(test_metadata());
    const int64_t tokens[] = {64};
    const TuneResult res = tuner.tune(*r, small_spec(), tokens)[0];
    ASSERT_EQ(res.default_timings.size(), 4u);
    EXPECT_EQ(res.default_timings[1], outlier);
    EXPECT_EQ(res.best, (TacticPair{0, 0})) << "outlier " << outlier;
    EXPECT_EQ(res.entry.default_seconds, 10.0);
  }
}

// The final stage of deepseek-v3 at T = 4096 as the tuner timed it on an H200 (us, in timing order; the fortieth
// session's `bench moe --tuned`): the default's fourth timing jumped 7.7% above its third. The third pair read 0.980
// against the default timed around it, and the bench then timed it at 1.001 of the default. With the bound at 1 minus
// the default's 4.6% spread, the default stays.
TEST(StagedTuning, ADefaultThatStraysFromAStraightLineRaisesTheBar) {
  const std::vector<double> def{6658.4, 6696.9, 6566.5, 7070.2};
  // Keyed by 10 * gemm1 + gemm2.
  const std::map<int, std::vector<double>> pairs{{11, {6631.6, 6617.3, 6844.8}},
                                                 {12, {6698.5, 6662.0, 6607.3}},
                                                 {21, {6545.9, 6595.6, 6475.5}},
                                                 {22, {6711.2, 6832.0, 6696.0}}};
  std::map<int, size_t> next;
  auto cost = [&](TacticPair p) {
    size_t& i = next[10 * p.gemm1 + p.gemm2];
    if (p == TacticPair{0, 0}) return i++ < 2 ? 7000.0 : def.at(i - 3);  // its two stage timings, then the final's
    if (p.gemm1 == 0 || p.gemm2 == 0) return 6500.0 + 100.0 * (p.gemm1 + p.gemm2);  // stages: 1 and 2 shortlisted
    return pairs.at(10 * p.gemm1 + p.gemm2).at(i++);
  };
  auto r = built_runner({.cost = cost});
  Autotuner tuner(test_metadata());
  const int64_t tokens[] = {4096};
  const TuneResult res = tuner.tune(*r, small_spec(), tokens)[0];
  ASSERT_EQ(res.final_stage.size(), 4u);
  EXPECT_EQ(res.default_timings, def);
  const FinalStageTiming& third = res.final_stage[2];
  EXPECT_EQ(third.tactics, (TacticPair{2, 1}));
  EXPECT_DOUBLE_EQ(third.ratio, bracketed_ratio(def, third.seconds, 3.0 / 5.0));
  EXPECT_LT(third.ratio, 0.99);  // a 1% bar alone would have taken it
  EXPECT_NEAR(res.default_spread, (0.5 * (6696.9 + 7070.2) - 6566.5) / (0.5 * (6696.9 + 7070.2)), 1e-12);
  EXPECT_DOUBLE_EQ(res.threshold, 1.0 - res.default_spread);
  EXPECT_GT(third.ratio, res.threshold);
  EXPECT_EQ(res.best, (TacticPair{0, 0}));
  EXPECT_EQ(res.entry.gemm1, "g1_0");
  EXPECT_EQ(res.entry.gemm2, "g2_0");
}

// Costs where the default (0, 0) alternates 10 / 10.2 (its final-stage timings 10, 10.2, 10, 10.2: a spread of 2%)
// and (1, 1) costs 9.5.
std::function<double(TacticPair)> wobbling_default_cost() {
  return [calls = 0](TacticPair p) mutable {
    if (p == TacticPair{0, 0}) return calls++ % 2 == 1 ? 10.2 : 10.0;
    return paired_cost(p, 1.5);
  };
}

// A default that wobbles by 2% around a straight line still lets a pair 5% faster win, and the bar is 0.98.
TEST(StagedTuning, AFasterPairStillWinsAboveTheDefaultsSpread) {
  auto r = built_runner({.cost = wobbling_default_cost()});
  Autotuner tuner(test_metadata());
  const int64_t tokens[] = {64};
  const TuneResult res = tuner.tune(*r, small_spec(), tokens)[0];
  ASSERT_EQ(res.default_timings.size(), 4u);
  EXPECT_NEAR(res.default_spread, 0.02, 1e-12);
  EXPECT_NEAR(res.threshold, 0.98, 1e-12);
  EXPECT_EQ(res.best, (TacticPair{1, 1}));
  EXPECT_EQ(res.entry.seconds, 9.5);
}

TEST(StagedTuning, SingleTacticStagesAreNotRanked) {
  {
    auto r = built_runner({.n1 = 1, .n2 = 3, .cost = [](TacticPair p) { return 3.0 - p.gemm2; }});
    Autotuner tuner(test_metadata());
    const int64_t tokens[] = {1};
    TuneResult res = tuner.tune(*r, small_spec(), tokens)[0];
    EXPECT_EQ(res.timed_configs, 0 + 3 + 3 * (1 * 2 + 1) + 1);  // the pairs (0, 2), (0, 1) and the default
    EXPECT_EQ(res.best, (TacticPair{0, 2}));
  }
  {
    auto r = built_runner({.n1 = 1, .n2 = 1});
    Autotuner tuner(test_metadata());
    const int64_t tokens[] = {1};
    TuneResult res = tuner.tune(*r, small_spec(), tokens)[0];
    EXPECT_EQ(res.timed_configs, 1);  // one candidate, the default: nothing to compare, one timing
    EXPECT_EQ(res.entry.seconds, res.entry.default_seconds);
    EXPECT_TRUE(res.default_timings.empty());
    EXPECT_TRUE(res.final_stage.empty());
  }
}

TEST(StagedTuning, TimesAtMostMaxTokensAndOncePerBucket) {
  auto r = built_runner({}, /*max_tokens=*/100);
  Autotuner tuner(test_metadata());
  const int64_t tokens[] = {100, 65, 3, 4};  // 100 and 65 share bucket 128; 3 and 4 share bucket 4
  std::vector<TuneResult> res = tuner.tune(*r, small_spec(), tokens);
  ASSERT_EQ(res.size(), 2u);
  EXPECT_EQ(res[0].bucket, 128);
  EXPECT_EQ(res[1].bucket, 4);
  EXPECT_EQ(res[0].entry.tokens, 100);                   // capped at the runner's max_tokens
  EXPECT_EQ(r->timed.size(), 2u * (3 + 3 + 3 * 4 + 1));  // the default (0, 0) is a shortlist pair
}

TEST(StagedTuning, DefaultHeuristicWithoutAnEntryAndTheWinnerAfterTuning) {
  auto r = built_runner({.default_pair = {2, 1}, .cost = [](TacticPair p) { return 1.0 + p.gemm1 + p.gemm2; }});
  Autotuner tuner(test_metadata());
  TacticChoice c = tuner.choose(*r, small_spec(), 50);
  EXPECT_FALSE(c.tuned);
  EXPECT_EQ(c.tactics, (TacticPair{2, 1}));
  EXPECT_TRUE(r->timed.empty());  // choosing never times
  const int64_t tokens[] = {50};
  tuner.tune(*r, small_spec(), tokens);
  c = tuner.choose(*r, small_spec(), 33);  // same bucket (64)
  EXPECT_TRUE(c.tuned);
  EXPECT_FALSE(c.per_token);  // the winner is not the default: it holds for the whole bucket
  EXPECT_EQ(c.tactics, (TacticPair{0, 0}));
  EXPECT_FALSE(tuner.choose(*r, small_spec(), 65).tuned);  // another bucket
}

// The heuristic switches at T = 40, inside bucket 64. Tuning times the bucket at 64, where the default (0, 0) wins,
// so the entry confirms the heuristic and every T of the bucket keeps the default for itself.
TEST(StagedTuning, AWinnerEqualToTheDefaultLeavesTheDefaultForEachTokenCount) {
  auto r = built_runner({.default_for = [](int64_t t) { return t <= 40 ? TacticPair{1, 1} : TacticPair{0, 0}; }});
  Autotuner tuner(test_metadata());
  const int64_t tokens[] = {50};
  const TuneResult res = tuner.tune(*r, small_spec(), tokens)[0];
  EXPECT_EQ(res.bucket, 64);
  EXPECT_EQ(res.best, (TacticPair{0, 0}));
  for (int64_t t : {33, 40}) {
    const TacticChoice c = tuner.choose(*r, small_spec(), t);
    EXPECT_TRUE(c.tuned);
    EXPECT_TRUE(c.per_token);
    EXPECT_EQ(c.tactics, (TacticPair{1, 1})) << "T = " << t;
  }
  EXPECT_EQ(tuner.choose(*r, small_spec(), 41).tactics, (TacticPair{0, 0}));
  // An entry whose winner is another pair holds for the whole bucket.
  tuner.insert(tuning_key(*r, small_spec(), 50), {"g1_2", "g2_0", {"g1_2"}, {"g2_0"}, 1.0, 2.0, 64});
  for (int64_t t : {33, 64}) {
    const TacticChoice c = tuner.choose(*r, small_spec(), t);
    EXPECT_FALSE(c.per_token);
    EXPECT_EQ(c.tactics, (TacticPair{2, 0})) << "T = " << t;
  }
}

// The default a bucket is compared with is the one for the token count it is timed at (capped by max_tokens).
TEST(StagedTuning, ComparesWithTheDefaultAtTheTimedTokenCount) {
  auto r = built_runner({.default_for =
                             [](int64_t t) {
                               return t <= 24 ? TacticPair{1, 1} : TacticPair{0, 0};
                             }},
                        /*max_tokens=*/20);
  Autotuner tuner(test_metadata());
  const int64_t tokens[] = {20};
  const TuneResult res = tuner.tune(*r, small_spec(), tokens)[0];
  EXPECT_EQ(res.bucket, 32);
  EXPECT_EQ(res.entry.tokens, 20);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(r->timed[i], (TacticPair{i, 1}));  // stage 1 next to the default's GEMM2
  EXPECT_EQ(res.entry.default_seconds, 1.0 + 1 + 1);
  EXPECT_EQ(res.best, (TacticPair{0, 0}));
  EXPECT_FALSE(tuner.choose(*r, small_spec(), 20).per_token);
}

TEST(StagedTuning, SkipsCachedBucketsUnlessAskedToRetune) {
  auto r = built_runner();
  Autotuner tuner(test_metadata());
  const int64_t tokens[] = {8};
  tuner.tune(*r, small_spec(), tokens);
  r->timed.clear();
  TuneResult again = tuner.tune(*r, small_spec(), tokens)[0];
  EXPECT_TRUE(again.from_cache);
  EXPECT_EQ(again.timed_configs, 0);
  EXPECT_TRUE(r->timed.empty());
  TuneResult full = tuner.tune(*r, small_spec(), tokens, {.mode = TuneMode::full})[0];
  EXPECT_EQ(full.timed_configs, 19);
}

TEST(StagedTuning, TimingNeedsABuiltRunner) {
  FakeRunner r;
  ASSERT_TRUE(r.check_support(small_spec(), Device::cpu()).ok);
  Autotuner tuner(test_metadata());
  const int64_t tokens[] = {8};
  try {
    tuner.tune(r, small_spec(), tokens);
    FAIL() << "no throw";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "moekit::tuner: runner 'fake': tune() called before build()");
  }
  // A request the cache answers entirely needs no build.
  tuner.insert(tuning_key(r, small_spec(), 8), {"g1_1", "g2_2", {"g1_1"}, {"g2_2"}, 1.0, 2.0, 8});
  TuneResult res = tuner.tune(r, small_spec(), tokens)[0];
  EXPECT_TRUE(res.from_cache);
  EXPECT_EQ(res.best, (TacticPair{1, 2}));
}

TEST(StagedTuning, TimesOnTheGivenLogitsAndThenGoesBackToTheSynthetic) {
  auto r = built_runner();
  Autotuner tuner(test_metadata());
  std::vector<float> logits(3 * 8, 0.5f);  // [3, E = 8]
  const TensorView view = TensorView::contiguous(logits.data(), DType::f32, {3, 8});
  const int64_t tokens[] = {8, 64};
  tuner.tune(*r, small_spec(), tokens, {.logits = view});
  ASSERT_EQ(r->timed_logits.size(), 2u * 19);
  for (const void* p : r->timed_logits) EXPECT_EQ(p, logits.data());
  EXPECT_EQ(r->timing_logits_sets, (std::vector<const void*>{logits.data(), nullptr}));
  EXPECT_EQ(r->timing_logits, nullptr);
  ASSERT_EQ(tuner.size(), 2u);  // one entry per bucket, so the loops below check both
  for (const auto& [key, e] : tuner.entries()) EXPECT_EQ(e.routing, "given") << key;
  // Without logits the timings stay on the synthetic ones and nothing is set.
  r->timing_logits_sets.clear();
  r->timed_logits.clear();
  tuner.tune(*r, small_spec(), tokens, {.mode = TuneMode::full});
  ASSERT_EQ(r->timed_logits.size(), 2u * 19);
  for (const void* p : r->timed_logits) EXPECT_EQ(p, nullptr);
  EXPECT_TRUE(r->timing_logits_sets.empty());
  ASSERT_EQ(tuner.size(), 2u);
  for (const auto& [key, e] : tuner.entries()) EXPECT_EQ(e.routing, "synthetic") << key;
  // A request the cache answers times nothing and does not touch the logits.
  tuner.tune(*r, small_spec(), tokens, {.logits = view});
  EXPECT_TRUE(r->timing_logits_sets.empty());
}

TEST(StagedTuning, GoesBackToTheSyntheticLogitsWhenATimingThrows) {
  int calls = 0;
  auto r = built_runner({.cost = [&](TacticPair) -> double {
    if (++calls == 4) throw CudaError("test", "timing failed");
    return 1.0;
  }});
  Autotuner tuner(test_metadata());
  std::vector<uint16_t> logits(8, 0);  // [1, 8] bf16
  const int64_t tokens[] = {8};
  EXPECT_THROW(
      tuner.tune(*r, small_spec(), tokens, {.logits = TensorView::contiguous(logits.data(), DType::bf16, {1, 8})}),
      CudaError);
  EXPECT_EQ(r->timed_logits.size(), 4u);
  EXPECT_EQ(r->timing_logits_sets, (std::vector<const void*>{logits.data(), nullptr}));
  EXPECT_EQ(r->timing_logits, nullptr);
}

TEST(StagedTuning, RejectsTimingLogitsThatRouteCannotTake) {
  auto r = built_runner();
  Autotuner tuner(test_metadata());
  std::vector<float> logits(4 * 8, 0.0f);
  const int64_t tokens[] = {8};
  auto error_of = [&](const TensorView& v) {
    try {
      tuner.tune(*r, small_spec(), tokens, {.mode = TuneMode::full, .logits = v});
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no throw");
  };
  EXPECT_EQ(error_of(TensorView::contiguous(logits.data(), DType::f32, {4, 7})),
            "moekit::route: logits.shape[1] (7) must equal num_experts (8)");
  EXPECT_EQ(error_of(TensorView::contiguous(logits.data(), DType::i32, {4, 8})),
            "moekit::route: logits dtype (int32) must be fp32 or bf16");
  EXPECT_EQ(error_of(TensorView::contiguous(logits.data(), DType::f32, {4, 8}, Device::cuda(0))),
            "moekit::route: logits.device (cuda:0) must be the routing device (cpu)");
  EXPECT_EQ(error_of(TensorView::contiguous(logits.data(), DType::f32, {0, 8})),
            "moekit::layer: runner 'fake': timing logits ([0, 8] fp32 cpu) must have at least one row");
  EXPECT_TRUE(r->timed.empty());
  EXPECT_TRUE(r->timing_logits_sets.empty());
  // The runner checks the lifecycle too.
  FakeRunner unbuilt;
  ASSERT_TRUE(unbuilt.check_support(small_spec(), Device::cpu()).ok);
  EXPECT_THROW(unbuilt.set_timing_logits(TensorView::contiguous(logits.data(), DType::f32, {4, 8})), InvalidArgument);
}

// ---- progress
// -------------------------------------------------------------------------------------------------------

std::string captured(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string s;
  for (int ch; (ch = std::fgetc(f)) != EOF;) s.push_back(static_cast<char>(ch));
  return s;
}

TEST(Progress, EtaFromTheAverageCostSoFar) {
  double now = 100.0;
  std::FILE* f = std::tmpfile();
  detail::TuneProgress p(ProgressStyle::bar, f, "tune fake", 4, [&] { return now; });
  EXPECT_EQ(p.eta(), "ETA ?");
  now = 102.0;
  p.timed(64);  // 1 of 4 done in 2 s: 3 left at 2 s each
  EXPECT_EQ(p.eta(), "ETA 6.00 s");
  p.finish();
  const std::string out = captured(f);
  EXPECT_EQ(out.front(), '\r');
  EXPECT_NE(out.find("[#######-----------------------] 1/4 timings  T=64  2.00 s elapsed  ETA 6.00 s"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.back(), '\n');
  std::fclose(f);
}

TEST(Progress, PlainLinesWhenNotATerminal) {
  std::FILE* f = std::tmpfile();
  auto r = built_runner();
  Autotuner tuner(test_metadata());
  const int64_t tokens[] = {3, 64};
  tuner.tune(*r, small_spec(), tokens, {.progress = ProgressStyle::detect, .progress_stream = f});
  const std::string out = captured(f);
  EXPECT_EQ(out.find('\r'), std::string::npos) << out;
  std::vector<std::string> lines;
  std::stringstream s(out);
  for (std::string line; std::getline(s, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 2u) << out;
  EXPECT_EQ(lines[0].rfind("tune fake: T=3 (bucket 4): gemm1=g1_0 gemm2=g2_0 ", 0), 0u) << lines[0];
  // Each bucket plans 3 + 3 + 3 * 5 + 1 timings and needs 3 fewer: the default (0, 0) is one of its shortlist pairs.
  EXPECT_NE(lines[0].find("19 timed; 19/41 timings"), std::string::npos) << lines[0];
  EXPECT_NE(lines[1].find("38/38 timings"), std::string::npos) << lines[1];
  EXPECT_EQ(lines[1].substr(lines[1].size() - 6), ", done") << lines[1];
  std::fclose(f);
}

// A line names the raised bar where the default's final timings strayed by more than 1%, and only there.
TEST(Progress, ALineNamesTheBoundWhereTheDefaultStrayed) {
  std::FILE* f = std::tmpfile();
  auto r = built_runner({.cost = wobbling_default_cost()});
  Autotuner tuner(test_metadata());
  const int64_t tokens[] = {64};
  tuner.tune(*r, small_spec(), tokens, {.progress = ProgressStyle::lines, .progress_stream = f});
  const std::string out = captured(f);
  EXPECT_NE(out.find("), default spread 2.0%, bound 0.980; 22 timed;"), std::string::npos) << out;
  std::FILE* g = std::tmpfile();
  auto steady = built_runner();
  Autotuner other(test_metadata());
  other.tune(*steady, small_spec(), tokens, {.progress = ProgressStyle::lines, .progress_stream = g});
  const std::string plain = captured(g);
  EXPECT_EQ(plain.find("bound"), std::string::npos) << plain;
  std::fclose(f);
  std::fclose(g);
}

TEST(Progress, FormatsDurations) {
  EXPECT_EQ(detail::format_seconds(850e-9), "850 ns");
  EXPECT_EQ(detail::format_seconds(12.34e-6), "12.3 us");
  EXPECT_EQ(detail::format_seconds(4.567e-3), "4.57 ms");
  EXPECT_EQ(detail::format_seconds(1.234), "1.23 s");
}

TEST(Version, IsTheProjectVersion) {
  EXPECT_EQ(kVersion, "0.1.0");
  EXPECT_EQ(CacheMetadata::current().library_version, "0.1.0");
}

}  // namespace
}  // namespace moekit

// Expert parallelism on the CPU: the contiguous partition (hand-worked tables, uneven E/W), its error messages, the
// all-to-all dispatch table (hand-worked cases, and random ones against an independent destination computation:
// each token's row reaches each owning rank exactly once, in ascending token order), and ep_simulate with W in
// {1, 2, 3, 4} in-process ranks in both modes against the single-rank reference layer (route + experts_reference
// on all W*T tokens): equal within bf16 rounding (W = 1 all-gather bit for bit). Seeds are fixed and printed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "error_of.h"
#include "moekit/error.h"
#include "moekit/expert_parallel.h"
#include "moekit/experts.h"
#include "moekit/plan.h"
#include "parallel/ep_bookkeeping.h"

namespace moekit {
namespace {

using testing::error_of;

// ---- partition ------------------------------------------------------------------------------------------------

TEST(EpPartition, HandWorkedTables) {
  // E = 10 over W = 3: 10 = 4 + 3 + 3; over W = 4: 10 = 3 + 3 + 2 + 2.
  const std::vector<std::pair<int, int>> w3{{0, 4}, {4, 3}, {7, 3}}, w4{{0, 3}, {3, 3}, {6, 2}, {8, 2}};
  for (int r = 0; r < 3; ++r) {
    const ExpertPartition p = expert_partition(10, 3, r);
    EXPECT_EQ(p.offset, w3[r].first) << r;
    EXPECT_EQ(p.count, w3[r].second) << r;
  }
  for (int r = 0; r < 4; ++r) {
    const ExpertPartition p = expert_partition(10, 4, r);
    EXPECT_EQ(p.offset, w4[r].first) << r;
    EXPECT_EQ(p.count, w4[r].second) << r;
  }
  const ExpertPartition one = expert_partition(7, 1, 0);
  EXPECT_EQ(one.offset, 0);
  EXPECT_EQ(one.count, 7);
  // Owners of E = 10, W = 4, written out: 0 0 0 1 1 1 2 2 3 3.
  const std::vector<int> owners{0, 0, 0, 1, 1, 1, 2, 2, 3, 3};
  for (int e = 0; e < 10; ++e) EXPECT_EQ(expert_owner(10, 4, e), owners[e]) << e;
}

TEST(EpPartition, CoversEveryExpertOnceForManyShapes) {
  for (int E = 1; E <= 40; ++E)
    for (int W = 1; W <= std::min(E, 8); ++W) {
      int next = 0;
      for (int r = 0; r < W; ++r) {
        const ExpertPartition p = expert_partition(E, W, r);
        EXPECT_EQ(p.offset, next) << "E " << E << " W " << W << " r " << r;
        EXPECT_TRUE(p.count == E / W || p.count == E / W + 1) << "E " << E << " W " << W << " r " << r;
        for (int e = p.offset; e < p.offset + p.count; ++e) EXPECT_EQ(expert_owner(E, W, e), r);
        next += p.count;
      }
      EXPECT_EQ(next, E) << "E " << E << " W " << W;
    }
}

TEST(EpPartition, RankExpertConfig) {
  ExpertConfig g = make_expert_config(10, 2, 16, 8, 1);
  const ExpertConfig c = rank_expert_config(g, 4, 2);
  EXPECT_EQ(c.local_num_experts, 2);
  EXPECT_EQ(c.local_expert_offset, 6);
  EXPECT_EQ(c.weight_experts(), 3);
  g.local_num_experts = 2;
  g.local_expert_offset = 6;
  EXPECT_EQ(rank_expert_config(g, 4, 2).local_expert_offset, 6);  // already this rank's range: accepted
  EXPECT_EQ(error_of([&] { rank_expert_config(g, 4, 1); }),
            "moekit::ep: local experts (2 at 6) must be -1 or rank 1's partition (3 at 3)");
}

TEST(EpPartition, Errors) {
  EXPECT_EQ(error_of([] { expert_partition(3, 4, 0); }), "moekit::ep: world_size (4) must be <= num_experts (3)");
  EXPECT_EQ(error_of([] { expert_partition(8, 0, 0); }), "moekit::ep: world_size (0) must be in 1..32");
  EXPECT_EQ(error_of([] { expert_partition(64, 33, 0); }), "moekit::ep: world_size (33) must be in 1..32");
  EXPECT_EQ(error_of([] { expert_partition(8, 4, 4); }), "moekit::ep: rank (4) must be in 0..3");
  EXPECT_EQ(error_of([] { expert_owner(8, 2, 8); }), "moekit::ep: expert (8) must be in 0..7");
  EXPECT_EQ(error_of([] { parse_ep_mode("ring"); }),
            "moekit::ep: unknown mode 'ring' (expected one of: all_gather, all_to_all)");
  EXPECT_EQ(parse_ep_mode("all_to_all"), EpMode::all_to_all);
  EXPECT_EQ(ep_mode_name(EpMode::all_gather), "all_gather");
}

// ---- dispatch table -------------------------------------------------------------------------------------------

TEST(EpDispatch, HandWorked) {
  // E = 4 over W = 2 (rank 0: experts 0-1, rank 1: 2-3), K = 2. Tokens: {0,1} -> rank 0; {2,0} -> both; {3,2} -> 1.
  const std::vector<int32_t> ids{0, 1, 2, 0, 3, 2};
  const ep::DispatchTable d = ep::build_dispatch_table(ids.data(), 3, 2, 0, 4, 2, 0);
  EXPECT_EQ(d.send_count, (std::vector<int32_t>{2, 2}));
  EXPECT_EQ(d.send_token, (std::vector<int32_t>{0, 1, -1, 1, 2, -1}));
  EXPECT_EQ(d.token_pos, (std::vector<int32_t>{0, -1, 1, 0, -1, 1}));
  // With one shared expert (slot 2, id 4) every token also stays on its own rank (here rank 1).
  const std::vector<int32_t> ids_s{0, 1, 4, 2, 0, 4, 3, 2, 4};
  const ep::DispatchTable s = ep::build_dispatch_table(ids_s.data(), 3, 2, 1, 4, 2, 1);
  EXPECT_EQ(s.send_count, (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(s.send_token, (std::vector<int32_t>{0, 1, -1, 0, 1, 2}));
  EXPECT_EQ(s.token_pos, (std::vector<int32_t>{0, 0, 1, 1, -1, 2}));
}

TEST(EpDispatch, EveryTokenReachesEachOwnerExactlyOnce) {
  const uint32_t seed = 20240611;
  std::printf("EpDispatch seed %u\n", seed);
  std::mt19937 rng(seed);
  for (int E : {4, 7, 10, 33})
    for (int W = 1; W <= 4 && W <= E; ++W)
      for (int S : {0, 2})
        for (int self = 0; self < W; ++self) {
          const int K = std::min(E, 3);
          const int64_t T = 23;
          std::vector<int32_t> ids(T * (K + S));
          for (int64_t t = 0; t < T; ++t) {
            std::vector<int32_t> all(E);
            for (int e = 0; e < E; ++e) all[e] = e;
            std::shuffle(all.begin(), all.end(), rng);
            for (int j = 0; j < K; ++j) ids[t * (K + S) + j] = all[j];
            for (int j = 0; j < S; ++j) ids[t * (K + S) + K + j] = E + j;
          }
          // Independent owners: the test's own walk over the partition sizes.
          std::vector<int> owner(E);
          for (int r = 0, e = 0; r < W; ++r)
            for (int n = 0; n < E / W + (r < E % W ? 1 : 0); ++n) owner[e++] = r;
          const ep::DispatchTable d = ep::build_dispatch_table(ids.data(), T, K, S, E, W, self);
          const std::string where = "E " + std::to_string(E) + " W " + std::to_string(W) + " S " + std::to_string(S) +
                                    " self " + std::to_string(self);
          for (int r = 0; r < W; ++r) {
            std::vector<int> seen(T, 0);
            int64_t last = -1;
            for (int i = 0; i < d.send_count[r]; ++i) {
              const int t = d.send_token[r * T + i];
              ASSERT_GE(t, 0) << where;
              EXPECT_GT(t, last) << where << ": rows in ascending token order";
              last = t;
              ++seen[t];
              EXPECT_EQ(d.token_pos[t * W + r], i) << where;
            }
            for (int i = d.send_count[r]; i < T; ++i) EXPECT_EQ(d.send_token[r * T + i], -1) << where;
            for (int64_t t = 0; t < T; ++t) {
              bool wanted = S > 0 && r == self;
              for (int j = 0; j < K; ++j) wanted = wanted || owner[ids[t * (K + S) + j]] == r;
              EXPECT_EQ(seen[t], wanted ? 1 : 0) << where << " token " << t << " rank " << r;
              if (!wanted) {
                EXPECT_EQ(d.token_pos[t * W + r], -1) << where;
              }
            }
          }
        }
}

TEST(EpDispatch, InertExpertsBelongToOtherRanks) {
  // E = 10, W = 4, rank 1 holds 3..5; K = 3 inert experts are 6, 7, 8 (other ranks').
  std::vector<int> inert;
  for (int e = 0; e < 10; ++e)
    if (ep::is_inert_expert(e, 10, 3, 3, 3)) inert.push_back(e);
  EXPECT_EQ(inert, (std::vector<int>{6, 7, 8}));
  inert.clear();  // the last rank wraps around: 8..9 local, inert 0, 1
  for (int e = 0; e < 10; ++e)
    if (ep::is_inert_expert(e, 10, 8, 2, 2)) inert.push_back(e);
  EXPECT_EQ(inert, (std::vector<int>{0, 1}));
}

// ---- simulation against the single-rank layer -----------------------------------------------------------------

struct SimCase {
  std::string name;
  RoutingConfig routing;
  int hidden = 32, intermediate = 16;
  int64_t tokens = 5;
  bool bias = false;
  DType logits_dtype = DType::f32;
  bool hot = false;              // every token prefers the same experts (other ranks receive nothing)
  bool weight_on_input = false;  // ExpertConfig::routing_weight_on_input
};

std::vector<SimCase> sim_cases() {
  return {
      {"softmax_topk E8 K2", make_routing_config(RoutingMethod::softmax_topk, 8, 2, 0, true)},
      {"sigmoid_grouped E12 K3 S1 bias",
       make_routing_config(RoutingMethod::sigmoid_grouped, 12, 3, 1, true, 4, 2, 2.5f), 32, 16, 7, true},
      {"topk_softmax E10 K4 S2 bf16 logits", make_routing_config(RoutingMethod::topk_softmax, 10, 4, 2, true), 24, 8,
       6, false, DType::bf16},
      {"softmax_topk E5 K2 S1 T1", make_routing_config(RoutingMethod::softmax_topk, 5, 2, 1, false), 16, 8, 1},
      {"softmax_topk E4 K3 (E - L < K)", make_routing_config(RoutingMethod::softmax_topk, 4, 3, 0, true), 16, 8, 9},
      {"one hot expert set S1", make_routing_config(RoutingMethod::softmax_topk, 8, 2, 1, true), 16, 8, 6, false,
       DType::f32, true},
      {"llama4 E8 K1 S1 weight on input", make_routing_config(RoutingMethod::llama4, 8, 1, 1, false), 16, 8, 6, false,
       DType::f32, false, true},
      {"softmax_topk E6 K2 S1 weight on input", make_routing_config(RoutingMethod::softmax_topk, 6, 2, 1, true), 16,
       8, 5, false, DType::f32, false, true},
  };
}

std::vector<uint16_t> random_bf16(std::mt19937& rng, int64_t n, float scale) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<uint16_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = float_to_bf16(u(rng));
  return v;
}

void run_sim_case(const SimCase& c, int W, EpMode mode, uint32_t seed) {
  SCOPED_TRACE(c.name + " W " + std::to_string(W) + " " + std::string(ep_mode_name(mode)) + " seed " +
               std::to_string(seed));
  std::mt19937 rng(seed);
  const int E = c.routing.num_experts, K = c.routing.top_k, S = c.routing.num_shared_experts;
  const int64_t H = c.hidden, I = c.intermediate, T = c.tokens, N = W * T;
  ExpertConfig g{};
  g.num_experts = E;
  g.top_k = K;
  g.hidden = c.hidden;
  g.intermediate = c.intermediate;
  g.num_shared_experts = S;
  g.routing_weight_on_input = c.weight_on_input;
  // The whole layer: weights of E + S experts, W*T tokens.
  std::vector<uint16_t> w13 = random_bf16(rng, (E + S) * 2 * I * H, 1.0f / std::sqrt(float(H)));
  std::vector<uint16_t> w2 = random_bf16(rng, (E + S) * H * I, 1.0f / std::sqrt(float(I)));
  std::vector<uint16_t> hidden = random_bf16(rng, N * H, 1.0f);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::vector<float> logits32(static_cast<size_t>(N * E));
  for (int64_t t = 0; t < N; ++t)
    for (int e = 0; e < E; ++e) logits32[t * E + e] = c.hot ? (e < K ? 8.0f - e : nd(rng) - 8.0f) : nd(rng);
  std::vector<uint16_t> logits16(logits32.size());
  for (size_t i = 0; i < logits32.size(); ++i) logits16[i] = float_to_bf16(logits32[i]);
  void* logits = c.logits_dtype == DType::bf16 ? static_cast<void*>(logits16.data()) : logits32.data();
  const int64_t lsz = dtype_size(c.logits_dtype);
  std::vector<float> bias(static_cast<size_t>(E));
  for (auto& b : bias) b = nd(rng) * 0.05f;
  const TensorView bias_view = c.bias ? TensorView::contiguous(bias.data(), DType::f32, {E}) : TensorView{};

  // Single-rank reference layer.
  RoutePlan plan(PlanShape{N, E, K, S, 4}, Device::cpu());
  route(c.routing, TensorView::contiguous(logits, c.logits_dtype, {N, E}), bias_view, plan);
  std::vector<uint16_t> ref(static_cast<size_t>(N * H));
  ExpertWeights full{TensorView::contiguous(w13.data(), DType::bf16, {E + S, 2 * I, H}),
                     TensorView::contiguous(w2.data(), DType::bf16, {E + S, H, I}),
                     {},
                     {}};
  experts_reference(g, full, TensorView::contiguous(hidden.data(), DType::bf16, {N, H}), plan.view(),
                    TensorView::contiguous(ref.data(), DType::bf16, {N, H}), 1);

  // W ranks: each holds its slice of the experts plus all shared ones, and T of the tokens.
  std::vector<std::vector<uint16_t>> rw13(W), rw2(W), rout(W, std::vector<uint16_t>(static_cast<size_t>(T * H)));
  std::vector<EpSimRank> ranks(W);
  for (int r = 0; r < W; ++r) {
    const ExpertPartition p = expert_partition(E, W, r);
    auto slice = [&](const std::vector<uint16_t>& w, int64_t per, std::vector<uint16_t>& dst) {
      dst.assign(w.begin() + p.offset * per, w.begin() + (p.offset + p.count) * per);
      dst.insert(dst.end(), w.begin() + E * per, w.begin() + (E + S) * per);
    };
    slice(w13, 2 * I * H, rw13[r]);
    slice(w2, H * I, rw2[r]);
    const int64_t L = p.count;
    ranks[r].weights.w13 = TensorView::contiguous(rw13[r].data(), DType::bf16, {L + S, 2 * I, H});
    ranks[r].weights.w2 = TensorView::contiguous(rw2[r].data(), DType::bf16, {L + S, H, I});
    ranks[r].hidden = TensorView::contiguous(hidden.data() + r * T * H, DType::bf16, {T, H});
    ranks[r].logits = TensorView::contiguous(static_cast<char*>(logits) + r * T * E * lsz, c.logits_dtype, {T, E});
    ranks[r].out = TensorView::contiguous(rout[r].data(), DType::bf16, {T, H});
  }
  EpSimArgs a;
  a.experts = g;
  a.routing = c.routing;
  a.routing_bias = bias_view;
  a.mode = mode;
  a.block = 4;
  ep_simulate(a, ranks);

  for (int r = 0; r < W; ++r) {
    const double err = relative_frobenius_bf16(rout[r].data(), ref.data() + r * T * H, T * H);
    // Each rank's partial sums are rounded to bf16 before the cross-rank sum: a few bf16 roundings at most.
    EXPECT_LE(err, 5e-3) << "rank " << r;
    if (W == 1 && mode == EpMode::all_gather) {
      EXPECT_EQ(rout[r], ref) << "W = 1 all-gather is the reference";
    }
  }
}

TEST(EpSimulate, BothModesMatchTheSingleRankLayer) {
  uint32_t seed = 777;
  std::printf("EpSimulate base seed %u\n", seed);
  for (const SimCase& c : sim_cases())
    for (int W = 1; W <= 4; ++W) {
      if (W > c.routing.num_experts) continue;
      for (EpMode mode : {EpMode::all_gather, EpMode::all_to_all}) run_sim_case(c, W, mode, ++seed);
    }
}

TEST(EpSimulate, RejectsUnequalTokenCounts) {
  const ExpertConfig g = make_expert_config(4, 1, 8, 8);
  std::vector<uint16_t> w13(4 * 16 * 8), w2(4 * 8 * 8), h(3 * 8), o(3 * 8);
  std::vector<float> l(3 * 4);
  std::vector<EpSimRank> ranks(2);
  for (int r = 0; r < 2; ++r) {
    const int64_t T = r == 0 ? 2 : 1;
    ranks[r].weights.w13 = TensorView::contiguous(w13.data(), DType::bf16, {2, 16, 8});
    ranks[r].weights.w2 = TensorView::contiguous(w2.data(), DType::bf16, {2, 8, 8});
    ranks[r].hidden = TensorView::contiguous(h.data(), DType::bf16, {T, 8});
    ranks[r].logits = TensorView::contiguous(l.data(), DType::f32, {T, 4});
    ranks[r].out = TensorView::contiguous(o.data(), DType::bf16, {T, 8});
  }
  EpSimArgs a;
  a.experts = g;
  a.routing = make_routing_config(RoutingMethod::softmax_topk, 4, 1, 0, false);
  EXPECT_EQ(error_of([&] { ep_simulate(a, ranks); }),
            "moekit::ep: rank 1 hidden/out ([1, 8] bf16 cpu / [1, 8] bf16 cpu) must be [T, H] = [2, 8] bf16 "
            "contiguous with logits of rank 0's dtype (every rank the same T)");
  // Routing and experts must describe the same layer, whatever the ranks hold.
  a.routing = make_routing_config(RoutingMethod::softmax_topk, 4, 2, 0, false);
  EXPECT_EQ(error_of([&] { ep_simulate(a, ranks); }),
            "moekit::ep: routing (E 4, K 2, S 0) must match the experts (E 4, K 1, S 0)");
}

}  // namespace
}  // namespace moekit

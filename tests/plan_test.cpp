// Route plan: the capacity formula and its bound, every PlanShape rule with its message, the plan invariants on
// seeded random topk ids (many T, E, K, S, B; empty experts; one hot expert), hand-written plans for tiny cases,
// determinism, RoutePlan ownership on the CPU, and route() end to end on the CPU backend.
#include "moekit/plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "moekit/device.h"
#include "moekit/error.h"
#include "moekit/routing.h"

namespace moekit {
namespace {

template <class F>
void expect_error_message(F&& f, const std::string& expected) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected: " << expected;
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()), expected);
  }
}

std::vector<int32_t> copy_of(const int32_t* p, int64_t n) {
  return std::vector<int32_t>(p, p + n);
}

/// A hand-computed plan: every array past the top-k ids and weights.
struct HandPlan {
  std::vector<int32_t> counts, offsets, sorted, rows, blocks, extent;
};

void expect_plan(const RoutePlanView& v, const HandPlan& want) {
  EXPECT_EQ(copy_of(v.expert_counts, static_cast<int64_t>(want.counts.size())), want.counts);
  EXPECT_EQ(copy_of(v.expert_offsets, static_cast<int64_t>(want.offsets.size())), want.offsets);
  EXPECT_EQ(copy_of(v.sorted_slots, static_cast<int64_t>(want.sorted.size())), want.sorted);
  EXPECT_EQ(copy_of(v.slot_rows, static_cast<int64_t>(want.rows.size())), want.rows);
  EXPECT_EQ(copy_of(v.block_experts, static_cast<int64_t>(want.blocks.size())), want.blocks);
  EXPECT_EQ(copy_of(v.extent, static_cast<int64_t>(want.extent.size())), want.extent);
}

// ------------------------------------------------------------------------------------------------ capacity

TEST(PlanCapacity, HandComputedValues) {
  // cap = T*Kt + min(G, T*Kt) * (B-1), rounded up to B.
  EXPECT_EQ(plan_capacity(0, 8, 2, 0, 16), 0);
  EXPECT_EQ(plan_capacity(1, 8, 2, 0, 1), 2);            // 2 + 2*0
  EXPECT_EQ(plan_capacity(2, 8, 2, 0, 16), 64);          // 4 + 4*15 = 64
  EXPECT_EQ(plan_capacity(4, 8, 2, 0, 16), 128);         // 8 + 8*15 = 128
  EXPECT_EQ(plan_capacity(16, 8, 2, 0, 16), 160);        // 32 + 8*15 = 152 -> 160
  EXPECT_EQ(plan_capacity(3, 5, 2, 1, 4), 28);           // Kt 3, G 6: 9 + 6*3 = 27 -> 28
  EXPECT_EQ(plan_capacity(10, 3, 1, 0, 256), 1024);      // 10 + 3*255 = 775 -> 1024
  EXPECT_EQ(plan_capacity(1, 1024, 32, 0, 256), 8192);   // 32 + 32*255 = 8192
  EXPECT_EQ(plan_capacity(1000, 256, 8, 1, 64), 25216);  // 9000 + 257*63 = 25191 -> 25216
  PlanShape s{.max_tokens = 3, .num_experts = 5, .top_k = 2, .num_shared_experts = 1, .block = 4};
  EXPECT_EQ(s.slots(), 3);
  EXPECT_EQ(s.groups(), 6);
  EXPECT_EQ(s.capacity(), 28);
}

TEST(PlanCapacity, RejectsBadArguments) {
  expect_error_message([] { plan_capacity(4, 8, 2, 0, 0); }, "moekit::plan: block (0) must be in [1, 256]");
  expect_error_message([] { plan_capacity(4, 8, 2, 0, 300); }, "moekit::plan: block (300) must be in [1, 256]");
  expect_error_message([] { plan_capacity(-1, 8, 2, 0, 16); }, "moekit::plan: tokens (-1) must be >= 0");
  expect_error_message([] { plan_capacity(4, 0, 2, 0, 16); }, "moekit::plan: num_experts (0) must be in [1, 1024]");
  expect_error_message([] { plan_capacity(int64_t{1} << 31, 8, 1, 0, 1); },
                       "moekit::plan: tokens (2147483648) * slots (1) must be <= 2147483647");
  // 2147483000 + 1024*255 = 2147744120 -> 2147744256 rows: more than int32 can index.
  expect_error_message([] { plan_capacity(2147483000, 1024, 1, 0, 256); },
                       "moekit::plan: capacity (2147744256) for tokens (2147483000) must be <= 2147483647");
}

// When T*Kt <= G and every slot goes to its own expert, each expert needs a whole block: the bound is reached.
TEST(PlanCapacity, BoundIsReachedWhenEveryExpertGetsOneSlot) {
  PlanShape shape{.max_tokens = 3, .num_experts = 8, .top_k = 2, .num_shared_experts = 0, .block = 16};
  RoutePlan plan(shape, Device::cpu());
  RoutePlanView& v = plan.mutable_view();
  for (int s = 0; s < 6; ++s) v.topk_ids[s] = s;  // tokens 0..2 -> experts {0,1}, {2,3}, {4,5}
  build_plan_reference(3, v);
  EXPECT_EQ(v.extent[0], 96);  // 6 experts x one block of 16
  EXPECT_EQ(plan_capacity(3, 8, 2, 0, 16), 96);
}

// ------------------------------------------------------------------------------------------------ PlanShape

TEST(PlanShape, EveryRuleHasItsMessage) {
  const PlanShape ok{.max_tokens = 4, .num_experts = 8, .top_k = 2, .num_shared_experts = 1, .block = 16};
  EXPECT_NO_THROW(ok.validate());
  struct Rule {
    PlanShape shape;
    std::string message;
  };
  auto with = [&](auto edit) {
    PlanShape s = ok;
    edit(s);
    return s;
  };
  const std::vector<Rule> rules = {
      {with([](PlanShape& s) { s.max_tokens = 0; }), "moekit::plan: max_tokens (0) must be >= 1"},
      {with([](PlanShape& s) { s.max_tokens = -5; }), "moekit::plan: max_tokens (-5) must be >= 1"},
      {with([](PlanShape& s) { s.num_experts = 0; }), "moekit::plan: num_experts (0) must be in [1, 1024]"},
      {with([](PlanShape& s) { s.num_experts = 1025; }), "moekit::plan: num_experts (1025) must be in [1, 1024]"},
      {with([](PlanShape& s) { s.top_k = 0; }), "moekit::plan: top_k (0) must be >= 1"},
      {with([](PlanShape& s) { s.num_shared_experts = -1; }), "moekit::plan: num_shared_experts (-1) must be >= 0"},
      {with([](PlanShape& s) { s.top_k = 30, s.num_shared_experts = 3; }),
       "moekit::plan: top_k + num_shared_experts (33) must be <= 32"},
      {with([](PlanShape& s) { s.block = 0; }), "moekit::plan: block (0) must be in [1, 256]"},
      {with([](PlanShape& s) { s.block = 300; }), "moekit::plan: block (300) must be in [1, 256]"},
      {with([](PlanShape& s) { s.block = -3; }), "moekit::plan: block (-3) must be in [1, 256]"},
  };
  for (const Rule& r : rules) {
    expect_error_message([&] { r.shape.validate(); }, r.message);
    expect_error_message([&] { RoutePlan plan(r.shape, Device::cpu()); }, r.message);
  }
  // The limits themselves are allowed.
  EXPECT_NO_THROW(with([](PlanShape& s) { s.num_experts = 1024, s.block = 256; }).validate());
  EXPECT_NO_THROW(with([](PlanShape& s) { s.top_k = 1, s.num_shared_experts = 31, s.block = 1; }).validate());
}

// ------------------------------------------------------------------------------------------------ invariants

enum class IdPattern { distinct, hot, few_experts, any };

const char* pattern_name(IdPattern p) {
  switch (p) {
    case IdPattern::distinct:
      return "distinct";
    case IdPattern::hot:
      return "hot";
    case IdPattern::few_experts:
      return "few_experts";
    case IdPattern::any:
      return "any";
  }
  return "?";
}

// topk ids [T, Kt] for one pattern: `distinct` K distinct experts per token (as a router gives); `hot` the same K
// experts for every token (all tokens to one expert when K = 1); `few_experts` K distinct among a few, leaving most
// experts empty; `any` uniform over all G groups with repeats. Shared slots hold E..E+S-1 except under `any`.
std::vector<int32_t> make_ids(const PlanShape& s, int64_t tokens, IdPattern pattern, std::mt19937& rng) {
  const int E = s.num_experts, K = s.top_k, S = s.num_shared_experts, Kt = s.slots();
  std::vector<int32_t> ids(static_cast<size_t>(tokens * Kt));
  std::vector<int32_t> pool(E);
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  const int hot_base = static_cast<int>(rng() % static_cast<uint32_t>(E - K + 1));
  const int few = std::min(E, K + 2);
  for (int64_t t = 0; t < tokens; ++t) {
    int32_t* row = ids.data() + t * Kt;
    if (pattern == IdPattern::any) {
      for (int j = 0; j < Kt; ++j) row[j] = static_cast<int32_t>(rng() % static_cast<uint32_t>(E + S));
      continue;
    }
    if (pattern == IdPattern::hot) {
      for (int j = 0; j < K; ++j) row[j] = hot_base + j;
    } else {
      const int n = pattern == IdPattern::distinct ? E : few;
      std::vector<int32_t> choice(pool.begin(), pool.begin() + n);  // partial Fisher-Yates over the first n
      for (int j = 0; j < K; ++j) {
        std::swap(choice[j], choice[j + static_cast<int>(rng() % static_cast<uint32_t>(n - j))]);
        row[j] = choice[j];
      }
    }
    for (int j = 0; j < S; ++j) row[K + j] = E + j;
  }
  return ids;
}

constexpr int32_t kCanary = -7;  // marks entries the build must not touch

// Checks every documented property of a plan built for `ids` [T, Kt], computing the expectations independently.
void check_plan(const RoutePlanView& v, int64_t T, const std::vector<int32_t>& ids) {
  const PlanShape& s = v.shape;
  const int G = s.groups(), B = s.block;
  const int64_t total = T * s.slots();
  const int32_t pad = static_cast<int32_t>(total);
  const int64_t cap_t = plan_capacity(T, s.num_experts, s.top_k, s.num_shared_experts, B);
  ASSERT_EQ(v.tokens, T);

  std::vector<int32_t> counts(G, 0);
  for (int32_t e : ids) ++counts[e];
  for (int e = 0; e < G; ++e) ASSERT_EQ(v.expert_counts[e], counts[e]) << "expert " << e;

  ASSERT_EQ(v.expert_offsets[0], 0);
  for (int e = 0; e < G; ++e) {
    const int32_t lo = v.expert_offsets[e], hi = v.expert_offsets[e + 1];
    ASSERT_EQ(hi % B, 0) << "offset of expert " << e + 1;
    ASSERT_GE(hi - lo, counts[e]) << "expert " << e;
    ASSERT_LT(hi - lo - counts[e], B) << "expert " << e << ": a whole block of padding";
  }
  const int32_t used = v.expert_offsets[G];
  ASSERT_LE(used, cap_t) << "the capacity bound";
  ASSERT_EQ(v.extent[0], used);
  ASSERT_EQ(v.extent[1], used / B);

  // Rows of each expert: its slots in ascending order, then padding up to the next offset.
  std::vector<int> seen(static_cast<size_t>(total), 0);
  for (int e = 0; e < G; ++e) {
    const int32_t lo = v.expert_offsets[e];
    for (int32_t r = lo; r < v.expert_offsets[e + 1]; ++r) {
      const int32_t slot = v.sorted_slots[r];
      if (r >= lo + counts[e]) {
        ASSERT_EQ(slot, pad) << "padding row " << r;
        continue;
      }
      ASSERT_GE(slot, 0);
      ASSERT_LT(slot, total) << "row " << r;
      ASSERT_EQ(ids[slot], e) << "row " << r << " holds slot " << slot;
      if (r > lo) {
        ASSERT_LT(v.sorted_slots[r - 1], slot) << "rows of expert " << e << " must ascend";
      }
      ASSERT_EQ(v.slot_rows[slot], r) << "slot_rows is the inverse of sorted_slots";
      ++seen[slot];
    }
  }
  for (int64_t slot = 0; slot < total; ++slot) ASSERT_EQ(seen[slot], 1) << "slot " << slot;
  for (int64_t r = used; r < cap_t; ++r) ASSERT_EQ(v.sorted_slots[r], pad) << "row " << r << " past the extent";
  for (int64_t r = cap_t; r < s.capacity(); ++r) ASSERT_EQ(v.sorted_slots[r], kCanary) << "row " << r;

  // Blocks inside the extent: one owner, whose segment holds the whole block; past it: -1 up to cap(T)/B.
  for (int64_t b = 0; b < used / B; ++b) {
    const int32_t e = v.block_experts[b];
    ASSERT_GE(e, 0) << "block " << b;
    ASSERT_LT(e, G) << "block " << b;
    ASSERT_LE(v.expert_offsets[e], b * B) << "block " << b;
    ASSERT_GE(v.expert_offsets[e + 1], (b + 1) * B) << "block " << b;
    for (int64_t r = b * B; r < (b + 1) * B; ++r)
      if (v.sorted_slots[r] != pad) {
        ASSERT_EQ(ids[v.sorted_slots[r]], e) << "block " << b << " row " << r;
      }
  }
  for (int64_t b = used / B; b < cap_t / B; ++b) ASSERT_EQ(v.block_experts[b], -1) << "block " << b;
  for (int64_t b = cap_t / B; b < s.capacity() / B; ++b) ASSERT_EQ(v.block_experts[b], kCanary) << "block " << b;
}

// A CPU plan whose sorted_slots and block_experts are filled with the canary, with `ids` copied in.
RoutePlan plan_with_ids(const PlanShape& shape, const std::vector<int32_t>& ids) {
  RoutePlan plan(shape, Device::cpu());
  RoutePlanView& v = plan.mutable_view();
  std::fill(v.sorted_slots, v.sorted_slots + shape.capacity(), kCanary);
  std::fill(v.block_experts, v.block_experts + shape.capacity() / shape.block, kCanary);
  std::copy(ids.begin(), ids.end(), v.topk_ids);
  return plan;
}

struct InvariantCase {
  int64_t tokens;
  int E, K, S, B;
};

TEST(BuildPlanReference, InvariantsOnRandomIds) {
  const std::vector<InvariantCase> cases = {
      {1, 8, 2, 0, 1},    {1, 8, 2, 0, 256},    {1, 1, 1, 0, 1},      {1, 1, 1, 0, 256},      {7, 5, 3, 0, 4},
      {33, 13, 4, 1, 16}, {100, 64, 8, 0, 128}, {256, 256, 8, 1, 64}, {37, 1000, 10, 0, 8},   {512, 512, 10, 0, 16},
      {64, 6, 6, 0, 3},   {200, 3, 1, 2, 256},  {0, 8, 2, 0, 16},     {1, 1024, 32, 0, 256},  {5, 1024, 1, 31, 7},
      {300, 48, 6, 2, 5}, {1000, 7, 1, 0, 1},   {129, 96, 4, 0, 256}, {2048, 128, 8, 0, 128},
  };
  int checked = 0;
  for (const InvariantCase& c : cases) {
    for (IdPattern p : {IdPattern::distinct, IdPattern::hot, IdPattern::few_experts, IdPattern::any}) {
      for (uint32_t seed : {1u, 2u}) {
        // Leave room past T so the build is seen not to write beyond the capacity for its own T.
        const PlanShape shape{.max_tokens = std::max<int64_t>(1, c.tokens + (seed == 1 ? 0 : 5)),
                              .num_experts = c.E,
                              .top_k = c.K,
                              .num_shared_experts = c.S,
                              .block = c.B};
        std::mt19937 rng(seed * 7919u + static_cast<uint32_t>(c.tokens * 31 + c.E));
        const std::vector<int32_t> ids = make_ids(shape, c.tokens, p, rng);
        SCOPED_TRACE(testing::Message() << "T=" << c.tokens << " E=" << c.E << " K=" << c.K << " S=" << c.S
                                        << " B=" << c.B << " max_tokens=" << shape.max_tokens
                                        << " ids=" << pattern_name(p) << " seed=" << seed);
        RoutePlan plan = plan_with_ids(shape, ids);
        build_plan_reference(c.tokens, plan.mutable_view());
        check_plan(plan.view(), c.tokens, ids);
        if (HasFatalFailure()) return;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, static_cast<int>(cases.size()) * 8);
}

// A plan for one T, then a smaller T in the same buffers: the second build does not depend on the first.
TEST(BuildPlanReference, ReuseWithFewerTokens) {
  const PlanShape shape{.max_tokens = 50, .num_experts = 12, .top_k = 3, .num_shared_experts = 1, .block = 8};
  std::mt19937 rng(11);
  RoutePlan reused = plan_with_ids(shape, make_ids(shape, 50, IdPattern::distinct, rng));
  build_plan_reference(50, reused.mutable_view());
  const std::vector<int32_t> ids = make_ids(shape, 9, IdPattern::any, rng);
  std::copy(ids.begin(), ids.end(), reused.mutable_view().topk_ids);
  build_plan_reference(9, reused.mutable_view());

  RoutePlan fresh = plan_with_ids(shape, ids);
  build_plan_reference(9, fresh.mutable_view());
  const RoutePlanView &a = reused.view(), &b = fresh.view();
  const int64_t cap9 = plan_capacity(9, 12, 3, 1, 8), G = shape.groups();
  EXPECT_EQ(copy_of(a.sorted_slots, cap9), copy_of(b.sorted_slots, cap9));
  EXPECT_EQ(copy_of(a.block_experts, cap9 / 8), copy_of(b.block_experts, cap9 / 8));
  EXPECT_EQ(copy_of(a.slot_rows, 9 * 4), copy_of(b.slot_rows, 9 * 4));
  EXPECT_EQ(copy_of(a.expert_counts, G), copy_of(b.expert_counts, G));
  EXPECT_EQ(copy_of(a.expert_offsets, G + 1), copy_of(b.expert_offsets, G + 1));
  EXPECT_EQ(copy_of(a.extent, 2), copy_of(b.extent, 2));
  EXPECT_EQ(a.tokens, 9);
}

// ------------------------------------------------------------------------------------------------ hand cases

TEST(BuildPlanReference, TinyCaseByHand) {
  // T=3, E=4, K=2, B=2. Slots 0..5 -> experts 2,0 | 2,3 | 0,2. Counts e0: slots 1,4; e1: none; e2: 0,2,5; e3: 3.
  // Padded segments: e0 [0,2), e1 [2,2), e2 [2,6), e3 [6,8). Padding sentinel T*Kt = 6. cap(3) = 6 + 4 = 10.
  const PlanShape shape{.max_tokens = 3, .num_experts = 4, .top_k = 2, .num_shared_experts = 0, .block = 2};
  RoutePlan plan = plan_with_ids(shape, {2, 0, 2, 3, 0, 2});
  build_plan_reference(3, plan.mutable_view());
  const RoutePlanView& v = plan.view();
  EXPECT_EQ(shape.capacity(), 10);
  expect_plan(v, {.counts = {2, 0, 3, 1},
                  .offsets = {0, 2, 2, 6, 8},
                  .sorted = {1, 4, 0, 2, 5, 6, 3, 6, 6, 6},
                  .rows = {2, 0, 3, 6, 1, 4},
                  .blocks = {0, 2, 2, 3, -1},
                  .extent = {8, 4}});
  EXPECT_EQ(v.tokens, 3);
}

TEST(BuildPlanReference, TinyCaseWithSharedExpertByHand) {
  // T=2, E=3, K=1, S=1, B=4: G=4, Kt=2. Both tokens route to expert 1; the shared expert is id 3.
  // Slots 0..3 -> 1,3 | 1,3. Segments: e1 [0,4) = 0,2,pad,pad; e3 [4,8) = 1,3,pad,pad. cap(2) = 4 + 4*3 = 16.
  const PlanShape shape{.max_tokens = 2, .num_experts = 3, .top_k = 1, .num_shared_experts = 1, .block = 4};
  RoutePlan plan = plan_with_ids(shape, {1, 3, 1, 3});
  build_plan_reference(2, plan.mutable_view());
  const RoutePlanView& v = plan.view();
  EXPECT_EQ(copy_of(v.expert_counts, 4), (std::vector<int32_t>{0, 2, 0, 2}));
  EXPECT_EQ(copy_of(v.expert_offsets, 5), (std::vector<int32_t>{0, 0, 4, 4, 8}));
  EXPECT_EQ(copy_of(v.sorted_slots, 16), (std::vector<int32_t>{0, 2, 4, 4, 1, 3, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4}));
  EXPECT_EQ(copy_of(v.slot_rows, 4), (std::vector<int32_t>{0, 4, 1, 5}));
  EXPECT_EQ(copy_of(v.block_experts, 4), (std::vector<int32_t>{1, 3, -1, -1}));
  EXPECT_EQ(copy_of(v.extent, 2), (std::vector<int32_t>{8, 2}));
}

TEST(BuildPlanReference, ZeroTokens) {
  const PlanShape shape{.max_tokens = 4, .num_experts = 5, .top_k = 2, .num_shared_experts = 1, .block = 16};
  RoutePlan plan = plan_with_ids(shape, {});
  build_plan_reference(0, plan.mutable_view());
  const RoutePlanView& v = plan.view();
  EXPECT_EQ(copy_of(v.expert_counts, 6), std::vector<int32_t>(6, 0));
  EXPECT_EQ(copy_of(v.expert_offsets, 7), std::vector<int32_t>(7, 0));
  EXPECT_EQ(copy_of(v.extent, 2), (std::vector<int32_t>{0, 0}));
  EXPECT_EQ(v.sorted_slots[0], kCanary);  // cap(0) = 0: nothing to write
  EXPECT_EQ(v.tokens, 0);
}

TEST(BuildPlanReference, Deterministic) {
  const PlanShape shape{.max_tokens = 777, .num_experts = 60, .top_k = 6, .num_shared_experts = 2, .block = 32};
  std::mt19937 rng(5);
  const std::vector<int32_t> ids = make_ids(shape, 777, IdPattern::distinct, rng);
  RoutePlan a = plan_with_ids(shape, ids), b = plan_with_ids(shape, ids);
  build_plan_reference(777, a.mutable_view());
  build_plan_reference(777, b.mutable_view());
  build_plan_reference(777, b.mutable_view());  // and a rebuild in the same buffers
  const int64_t cap = shape.capacity(), n = 777 * shape.slots(), G = shape.groups();
  EXPECT_EQ(copy_of(a.view().sorted_slots, cap), copy_of(b.view().sorted_slots, cap));
  EXPECT_EQ(copy_of(a.view().slot_rows, n), copy_of(b.view().slot_rows, n));
  EXPECT_EQ(copy_of(a.view().block_experts, cap / 32), copy_of(b.view().block_experts, cap / 32));
  EXPECT_EQ(copy_of(a.view().expert_counts, G), copy_of(b.view().expert_counts, G));
  EXPECT_EQ(copy_of(a.view().expert_offsets, G + 1), copy_of(b.view().expert_offsets, G + 1));
  EXPECT_EQ(copy_of(a.view().extent, 2), copy_of(b.view().extent, 2));
}

TEST(BuildPlanReference, RejectsBadInput) {
  const PlanShape shape{.max_tokens = 4, .num_experts = 6, .top_k = 2, .num_shared_experts = 1, .block = 4};
  RoutePlan plan = plan_with_ids(shape, std::vector<int32_t>(12, 0));
  expect_error_message([&] { build_plan_reference(5, plan.mutable_view()); },
                       "moekit::plan: tokens (5) must be in [0, max_tokens (4)]");
  expect_error_message([&] { build_plan_reference(-1, plan.mutable_view()); },
                       "moekit::plan: tokens (-1) must be in [0, max_tokens (4)]");
  plan.mutable_view().topk_ids[4] = 7;  // token 1, slot 1; G = 7
  expect_error_message([&] { build_plan_reference(4, plan.mutable_view()); },
                       "moekit::plan: topk_ids[1, 1] (7) must be in [0, 7)");
  EXPECT_NO_THROW(build_plan_reference(1, plan.mutable_view()));  // token 1 is not part of a 1-token plan
  plan.mutable_view().topk_ids[4] = 0;
  plan.mutable_view().topk_ids[9] = -1;
  expect_error_message([&] { build_plan_reference(4, plan.mutable_view()); },
                       "moekit::plan: topk_ids[3, 0] (-1) must be in [0, 7)");
}

// ------------------------------------------------------------------------------------------------ RoutePlan

bool disjoint(const void* a, int64_t a_bytes, const void* b, int64_t b_bytes) {
  auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return pa + static_cast<uintptr_t>(a_bytes) <= pb || pb + static_cast<uintptr_t>(b_bytes) <= pa;
}

TEST(RoutePlan, CpuBuffersHaveTheirSizesAndAlignment) {
  const PlanShape shape{.max_tokens = 16, .num_experts = 8, .top_k = 2, .num_shared_experts = 0, .block = 16};
  RoutePlan plan(shape, Device::cpu());
  EXPECT_EQ(plan.device(), Device::cpu());
  EXPECT_EQ(plan.shape().capacity(), 160);  // 32 + 8*15 = 152 -> 160
  const RoutePlanView& v = plan.view();
  EXPECT_EQ(v.tokens, 0);
  struct Buffer {
    const void* p;
    int64_t elements;
  };
  const std::vector<Buffer> buffers = {{v.topk_ids, 32},      {v.topk_weights, 32},  {v.slot_rows, 32},
                                       {v.expert_counts, 8},  {v.expert_offsets, 9}, {v.sorted_slots, 160},
                                       {v.block_experts, 10}, {v.extent, 2}};
  for (size_t i = 0; i < buffers.size(); ++i) {
    ASSERT_NE(buffers[i].p, nullptr) << "buffer " << i;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(buffers[i].p) % 256, 0u) << "buffer " << i;
    for (size_t j = 0; j < i; ++j)
      EXPECT_TRUE(disjoint(buffers[i].p, buffers[i].elements * 4, buffers[j].p, buffers[j].elements * 4))
          << "buffers " << j << " and " << i;
  }
}

TEST(RoutePlan, MoveKeepsTheBuffers) {
  const PlanShape shape{.max_tokens = 8, .num_experts = 4, .top_k = 2, .num_shared_experts = 0, .block = 4};
  RoutePlan a(shape, Device::cpu());
  a.mutable_view().topk_ids[3] = 2;
  const int32_t* ids = a.view().topk_ids;
  const int32_t* rows = a.view().sorted_slots;

  RoutePlan b(std::move(a));
  EXPECT_EQ(b.view().topk_ids, ids);
  EXPECT_EQ(b.view().sorted_slots, rows);
  EXPECT_EQ(b.view().topk_ids[3], 2);
  EXPECT_EQ(b.shape().max_tokens, 8);
  EXPECT_EQ(a.view().topk_ids, nullptr);  // NOLINT(bugprone-use-after-move): the moved-from state is specified

  RoutePlan c(PlanShape{.max_tokens = 1, .num_experts = 1, .top_k = 1, .block = 1}, Device::cpu());
  c = std::move(b);
  EXPECT_EQ(c.view().topk_ids, ids);
  EXPECT_EQ(c.view().sorted_slots, rows);
  EXPECT_EQ(c.shape().num_experts, 4);
  EXPECT_EQ(b.view().sorted_slots, nullptr);  // NOLINT(bugprone-use-after-move)

  // A moved-from plan refuses to be built into rather than writing through null pointers.
  expect_error_message([&] { build_plan_reference(0, b.mutable_view()); },
                       "moekit::plan: buffers must all be allocated (a moved-from plan has none)");
  // route() and copy_plan() name the moved-from plan rather than its zero shape.
  RoutingConfig cfg;
  cfg.num_experts = 4;
  cfg.top_k = 2;
  std::vector<float> logits(2 * 4, 0.0f);
  const TensorView l = TensorView::contiguous(logits.data(), DType::f32, {2, 4});
  expect_error_message([&] { route(cfg, l, {}, b); }, "moekit::route: plan holds no buffers (it was moved from)");
  expect_error_message([&] { copy_plan(b, c); }, "moekit::copy_plan: src holds no buffers (it was moved from)");
  expect_error_message([&] { copy_plan(c, b); }, "moekit::copy_plan: dst holds no buffers (it was moved from)");
  route(cfg, l, {}, c);  // the plan it moved into routes
  EXPECT_EQ(c.view().tokens, 2);
}

TEST(RoutePlan, CudaDeviceWithoutCuda) {
  if (built_with_cuda()) GTEST_SKIP() << "this build has CUDA; the GPU tests cover CUDA plans";
  const PlanShape shape{.max_tokens = 8, .num_experts = 4, .top_k = 2, .num_shared_experts = 0, .block = 4};
  try {
    RoutePlan plan(shape, Device::cuda(0));
    FAIL() << "no exception";
  } catch (const NotSupported& e) {
    EXPECT_STREQ(e.what(), "moekit::plan: device (cuda:0) is not available: moekit was built without CUDA");
  }
}

// ------------------------------------------------------------------------------------------------ route()

// The plan of Route.CpuEndToEndByHand's three tokens: slots 0..5 -> 1,2 | 0,3 | 2,0: e0 {2,5}, e1 {0}, e2 {1,4},
// e3 {3}; B=2, sentinel 6, cap(3) = 6 + 4 = 10.
void expect_hand_plan(const RoutePlanView& v) {
  EXPECT_EQ(v.tokens, 3);
  expect_plan(v, {.counts = {2, 1, 2, 1},
                  .offsets = {0, 2, 4, 6, 8},
                  .sorted = {2, 5, 0, 6, 1, 4, 3, 6, 6, 6},
                  .rows = {2, 4, 0, 6, 5, 1},
                  .blocks = {0, 1, 2, 3, -1},
                  .extent = {8, 4}});
}

// softmax_topk, E=4, K=2, B=2 on three tokens whose top-2 is plain from the logits (token 2 has a tie at 0.0
// between experts 0, 1 and 3: the lower id, 0, wins the second slot).
TEST(Route, CpuEndToEndByHand) {
  std::vector<float> logits = {0.1f, 3.0f, 2.0f, -1.0f,  //
                               5.0f, 0.0f, 0.0f, 4.0f,   //
                               0.0f, 0.0f, 1.0f, 0.0f};
  RoutingConfig cfg{.method = RoutingMethod::softmax_topk, .num_experts = 4, .top_k = 2};
  RoutePlan plan(PlanShape{.max_tokens = 4, .num_experts = 4, .top_k = 2, .num_shared_experts = 0, .block = 2},
                 Device::cpu());
  route(cfg, TensorView::contiguous(logits.data(), DType::f32, {3, 4}), {}, plan);
  const RoutePlanView& v = plan.view();
  EXPECT_EQ(copy_of(v.topk_ids, 6), (std::vector<int32_t>{1, 2, 0, 3, 2, 0}));
  for (int t = 0; t < 3; ++t) {
    double z = 0;
    for (int e = 0; e < 4; ++e) z += std::exp(double(logits[t * 4 + e]));
    for (int j = 0; j < 2; ++j) {
      const double want = std::exp(double(logits[t * 4 + v.topk_ids[t * 2 + j]])) / z;
      EXPECT_NEAR(v.topk_weights[t * 2 + j], want, 1e-6 * want) << "token " << t << " slot " << j;
    }
  }
  expect_hand_plan(v);
}

TEST(CopyPlan, HostToHostCopiesTheLastCallAndItsTokenCount) {
  std::vector<float> logits = {0.1f, 3.0f, 2.0f, -1.0f, 5.0f, 0.0f, 0.0f, 4.0f, 0.0f, 0.0f, 1.0f, 0.0f};
  RoutingConfig cfg{.method = RoutingMethod::softmax_topk, .num_experts = 4, .top_k = 2};
  RoutePlan src(PlanShape{.max_tokens = 4, .num_experts = 4, .top_k = 2, .num_shared_experts = 0, .block = 2},
                Device::cpu());
  route(cfg, TensorView::contiguous(logits.data(), DType::f32, {3, 4}), {}, src);
  RoutePlan dst(PlanShape{.max_tokens = 3, .num_experts = 4, .top_k = 2, .num_shared_experts = 0, .block = 2},
                Device::cpu());
  copy_plan(src, dst);
  const RoutePlanView &s = src.view(), &d = dst.view();
  EXPECT_EQ(copy_of(d.topk_ids, 6), copy_of(s.topk_ids, 6));
  EXPECT_EQ(std::vector<float>(d.topk_weights, d.topk_weights + 6),
            std::vector<float>(s.topk_weights, s.topk_weights + 6));
  expect_hand_plan(d);
}

TEST(CopyPlan, RejectsAnotherShapeOrTooFewTokens) {
  const PlanShape shape{.max_tokens = 4, .num_experts = 4, .top_k = 2, .num_shared_experts = 0, .block = 2};
  RoutePlan src(shape, Device::cpu());
  src.mutable_view().tokens = 4;
  PlanShape other = shape;
  other.block = 4;
  RoutePlan wrong_block(other, Device::cpu());
  try {
    copy_plan(src, wrong_block);
    ADD_FAILURE() << "no exception for another block size";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()),
              "moekit::copy_plan: dst shape (E 4, K 2, S 0, B 4) must equal src's (E 4, K 2, S 0, B 2)");
  }
  other = shape;
  other.max_tokens = 3;
  RoutePlan small(other, Device::cpu());
  try {
    copy_plan(src, small);
    ADD_FAILURE() << "no exception for max_tokens below the tokens";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()), "moekit::copy_plan: dst max_tokens (3) must be >= src's tokens (4)");
  }
}

TEST(Route, CpuSharedExpertsAndReplay) {
  const int T = 40, E = 16, K = 3, S = 1;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  std::vector<float> logits(T * E);
  for (float& x : logits) x = normal(rng);
  std::vector<int16_t> replay(48 * K, int16_t{-9});
  RoutingConfig cfg{.method = RoutingMethod::topk_softmax, .num_experts = E, .top_k = K, .num_shared_experts = S};
  RoutePlan plan(PlanShape{.max_tokens = 48, .num_experts = E, .top_k = K, .num_shared_experts = S, .block = 8},
                 Device::cpu());
  route(cfg, TensorView::contiguous(logits.data(), DType::f32, {T, E}), {}, plan, nullptr,
        TensorView::contiguous(replay.data(), DType::i16, {48, K}));
  const RoutePlanView& v = plan.view();
  std::vector<int32_t> ids = copy_of(v.topk_ids, T * (K + S));
  for (int t = 0; t < T; ++t) {
    // The K routed slots are the K largest logits, in descending order; then the shared slot E with weight 1.
    std::vector<float> sorted(logits.begin() + t * E, logits.begin() + (t + 1) * E);
    std::sort(sorted.begin(), sorted.end(), std::greater<>());
    for (int j = 0; j < K; ++j) {
      EXPECT_EQ(logits[t * E + ids[t * 4 + j]], sorted[j]) << "token " << t << " slot " << j;
      EXPECT_EQ(replay[t * K + j], ids[t * 4 + j]) << "replay row " << t;
    }
    EXPECT_EQ(ids[t * 4 + K], E);
    EXPECT_EQ(v.topk_weights[t * 4 + K], 1.0f);
  }
  for (int i = T * K; i < 48 * K; ++i) EXPECT_EQ(replay[i], -9) << "replay rows >= T stay untouched";
  // The plan is the reference plan of those ids.
  RoutePlan expected = plan_with_ids(plan.shape(), ids);
  build_plan_reference(T, expected.mutable_view());
  const int64_t cap = plan_capacity(T, E, K, S, 8);
  EXPECT_EQ(copy_of(v.sorted_slots, cap), copy_of(expected.view().sorted_slots, cap));
  EXPECT_EQ(copy_of(v.block_experts, cap / 8), copy_of(expected.view().block_experts, cap / 8));
  EXPECT_EQ(copy_of(v.slot_rows, T * 4), copy_of(expected.view().slot_rows, T * 4));
  EXPECT_EQ(copy_of(v.extent, 2), copy_of(expected.view().extent, 2));
}

TEST(Route, RejectsAPlanOfAnotherShape) {
  std::vector<float> logits(2 * 8, 0.5f);
  const TensorView lv = TensorView::contiguous(logits.data(), DType::f32, {2, 8});
  RoutingConfig cfg{.method = RoutingMethod::softmax_topk, .num_experts = 8, .top_k = 2};
  RoutePlan wide(PlanShape{.max_tokens = 4, .num_experts = 64, .top_k = 2, .block = 4}, Device::cpu());
  expect_error_message([&] { route(cfg, lv, {}, wide); },
                       "moekit::route: plan num_experts (64) must equal the routing config's num_experts (8)");
  RoutePlan k3(PlanShape{.max_tokens = 4, .num_experts = 8, .top_k = 3, .block = 4}, Device::cpu());
  expect_error_message([&] { route(cfg, lv, {}, k3); },
                       "moekit::route: plan top_k (3) must equal the routing config's top_k (2)");
  RoutePlan shared(PlanShape{.max_tokens = 4, .num_experts = 8, .top_k = 2, .num_shared_experts = 1, .block = 4},
                   Device::cpu());
  expect_error_message(
      [&] { route(cfg, lv, {}, shared); },
      "moekit::route: plan num_shared_experts (1) must equal the routing config's num_shared_experts (0)");
  // More tokens than the plan holds: rejected by the shared validation before anything is written.
  RoutePlan small(PlanShape{.max_tokens = 1, .num_experts = 8, .top_k = 2, .block = 4}, Device::cpu());
  EXPECT_THROW(route(cfg, lv, {}, small), InvalidArgument);
  EXPECT_EQ(small.view().tokens, 0);
}

}  // namespace
}  // namespace moekit

// Fuzz target for moekit::route() on the CPU backend: a routing config, the logits, bias and replay views and the
// plan shape are all decoded from the input bytes, mostly valid, sometimes breaking one rule. Every call must either
// throw moekit::InvalidArgument naming the operation, or fill a plan with every property of DESIGN §4 (checked here
// from the ids alone) and the replay rows; an input that the documented rules (include/moekit/routing.h, plan.h)
// call valid must not be rejected. A violation prints what broke and aborts.
//
// Built as the libFuzzer binary route_fuzzer with clang (-DMOEKIT_BUILD_FUZZERS=ON), and always into the smoke test
// Fuzz.RouteOnRandomInputs (fuzz_test.cpp), which feeds it seeded random inputs under ctest.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_targets.h"
#include "moekit/dtype.h"
#include "moekit/error.h"
#include "moekit/plan.h"
#include "moekit/routing.h"
#include "moekit/tensor.h"
#include "routing/routing_math.h"

namespace {

using namespace moekit;
using fuzz::Bytes;
using fuzz::require;
using fuzz::violation;

/// Logit values: a palette with ties, signed zeros, infinities, NaN and values at the sigmoid's and exp's edges,
/// or any 32-bit pattern.
float logit_value(Bytes& in) {
  static const float kPalette[] = {0.0f,     -0.0f,     1.0f,   -1.0f,   0.5f,  2.0f,   -2.0f,  88.0f,
                                   -88.0f,   -69.5f,    100.0f, -100.0f, 1e30f, -1e30f, 1e-40f, -1e-40f,
                                   INFINITY, -INFINITY, NAN,    3.0f,    -3.0f, 0.25f,  1e-7f,  16.0f};
  constexpr int kPaletteSize = sizeof(kPalette) / sizeof(kPalette[0]);
  const int c = in.pick(kPaletteSize + 8);
  if (c < kPaletteSize) return kPalette[c];
  const uint32_t bits = in.u32();
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

/// Values in [-80, 80], the range where check_weights() holds a row's weights to the contract: ties, signed zeros,
/// subnormals, the sigmoid's exact-division edge, or any value of that range.
float tame_logit_value(Bytes& in) {
  static const float kPalette[] = {0.0f, -0.0f, 1.0f,  -1.0f, 0.5f,   2.0f,    -2.0f, -69.5f,
                                   3.0f, -3.0f, 0.25f, 1e-7f, 1e-40f, -1e-40f, 16.0f, 80.0f};
  constexpr int kPaletteSize = sizeof(kPalette) / sizeof(kPalette[0]);
  const int c = in.pick(kPaletteSize + 8);
  if (c < kPaletteSize) return kPalette[c];
  return -80.0f + 160.0f * static_cast<float>(in.u32() >> 8) / static_cast<float>(1u << 24);
}

/// Which sizes a field takes: mostly small and valid, sometimes the limits and just past them.
int experts_value(Bytes& in) {
  static const int kChoices[] = {1,  2,  3,  4,  5,   6,   7,   8,    12, 16,   31,
                                 32, 33, 64, 96, 128, 160, 256, 1024, 0,  1025, -4};
  return kChoices[in.pick(sizeof(kChoices) / sizeof(kChoices[0]))];
}

struct Case {
  RoutingConfig cfg;
  PlanShape shape;
  int64_t tokens = 0;
  int64_t row_stride = 0;
  DType logits_dtype = DType::f32;
  int bias_kind = 0;    // 0 none, 1 fp32 [E], 2 bf16 [E], 3 [E + 1] fp32, 4 int32 [E]
  int replay_kind = 0;  // 0 none, 1 [T + extra, K] int16, 2 [T - 1, K], 3 [T, K + 1], 4 int32
  int replay_extra = 0;
  bool valid_by_contract = false;  // every documented rule holds
};

Case decode_case(Bytes& in) {
  Case c;
  RoutingConfig& cfg = c.cfg;
  cfg.method = static_cast<RoutingMethod>(in.chance(97) ? in.pick(5) : 5 + in.pick(251));  // or no method at all
  cfg.num_experts = experts_value(in);
  const int E = std::max(cfg.num_experts, 1);
  cfg.top_k = in.chance(90) ? 1 + in.pick(std::min(E, 32)) : in.pick(40) - 2;
  cfg.num_shared_experts = in.chance(70) ? 0 : in.pick(5) - (in.chance(10) ? 2 : 0);
  cfg.renormalize = in.chance(50);
  if (cfg.method == RoutingMethod::llama4 && in.chance(90)) cfg.top_k = 1;
  if (cfg.method == RoutingMethod::sigmoid_grouped && in.chance(80)) {
    static const int kGroups[] = {1, 2, 4, 8, 3, 5, 16, 32};
    cfg.n_group = kGroups[in.pick(8)];
    if (in.chance(80)) {
      while (E % cfg.n_group != 0) cfg.n_group /= 2;
      cfg.n_group = std::max(cfg.n_group, 1);
    }
    cfg.topk_group = 1 + in.pick(cfg.n_group);
    const int kept = cfg.topk_group * (E / cfg.n_group);
    if (kept >= 1 && cfg.top_k > kept && in.chance(80)) cfg.top_k = 1 + in.pick(std::min(kept, 32));
  } else if (in.chance(5)) {
    cfg.n_group = in.pick(3);
    cfg.topk_group = in.pick(3);
  }
  static const float kScales[] = {1.0f, 2.5f, 0.125f, 1e-30f, 0.0f, -1.0f, INFINITY, NAN};
  cfg.routed_scaling_factor = in.chance(85) ? kScales[in.pick(4)] : kScales[in.pick(8)];

  c.tokens = in.pick(24) + (in.chance(10) ? 40 : 0);
  c.row_stride = cfg.num_experts + (in.chance(30) ? in.pick(9) : 0) - (in.chance(5) ? 1 : 0);
  c.logits_dtype = in.chance(90) ? (in.chance(50) ? DType::f32 : DType::bf16) : DType::i32;
  c.bias_kind = in.chance(50) ? 0 : (in.chance(90) ? 1 + in.pick(2) : 3 + in.pick(2));
  c.replay_kind = in.chance(60) ? 0 : (in.chance(90) ? 1 : 2 + in.pick(3));
  c.replay_extra = in.pick(3);

  c.shape = {.max_tokens = std::max<int64_t>(1, c.tokens + in.pick(3) - (in.chance(5) ? 2 : 0)),
             .num_experts = cfg.num_experts,
             .top_k = cfg.top_k,
             .num_shared_experts = cfg.num_shared_experts,
             .block = in.chance(95) ? 1 + in.pick(256) : (in.chance(50) ? 0 : 257)};
  if (in.chance(3)) c.shape.top_k += 1;  // a plan of another shape

  // The documented rules, restated here from the headers (not from the validation code).
  const RoutingConfig& r = cfg;
  const bool groups_ok = r.method == RoutingMethod::sigmoid_grouped
                             ? r.n_group >= 1 && r.num_experts % r.n_group == 0 && r.topk_group >= 1 &&
                                   r.topk_group <= r.n_group && r.top_k <= r.topk_group * (r.num_experts / r.n_group)
                             : r.n_group == 1 && r.topk_group == 1;
  const bool config_ok = static_cast<int>(r.method) < 5 && r.num_experts >= 1 && r.num_experts <= kMaxExperts &&
                         r.top_k >= 1 && r.top_k <= std::min(r.num_experts, 32) && r.num_shared_experts >= 0 &&
                         r.top_k + r.num_shared_experts <= kMaxSlots && groups_ok &&
                         (r.method != RoutingMethod::llama4 || r.top_k == 1) &&
                         std::isfinite(r.routed_scaling_factor) && r.routed_scaling_factor > 0.0f;
  const bool tensors_ok =
      c.row_stride >= r.num_experts && c.logits_dtype != DType::i32 && c.bias_kind <= 2 && c.replay_kind <= 1;
  const bool plan_ok =
      c.shape.block >= 1 && c.shape.block <= kMaxBlock && c.tokens <= c.shape.max_tokens && c.shape.top_k == r.top_k;
  c.valid_by_contract = config_ok && tensors_ok && plan_ok;
  return c;
}

/// Every property of DESIGN §4 for a plan built from its own topk ids, and the routing contract's slot rules.
void check_plan(const Case& c, const RoutePlanView& v) {
  const int E = c.cfg.num_experts, K = c.cfg.top_k, S = c.cfg.num_shared_experts, Kt = K + S, G = E + S;
  const int B = c.shape.block;
  const int64_t T = c.tokens, total = T * Kt;
  require(v.tokens == T, "plan token count");
  std::vector<int64_t> counts(G, 0);
  for (int64_t t = 0; t < T; ++t) {
    const int32_t* ids = v.topk_ids + t * Kt;
    for (int j = 0; j < K; ++j) {
      require(ids[j] >= 0 && ids[j] < E, "routed id out of range");
      for (int i = 0; i < j; ++i) require(ids[i] != ids[j], "an expert routed twice for one token");
    }
    for (int j = K; j < Kt; ++j) {
      require(ids[j] == E + j - K, "shared slot id");
      require(v.topk_weights[t * Kt + j] == 1.0f, "shared slot weight");
    }
    for (int j = 0; j < Kt; ++j) ++counts[ids[j]];
  }
  require(v.expert_offsets[0] == 0, "first offset");
  for (int g = 0; g < G; ++g) {
    require(v.expert_counts[g] == counts[g], "expert count");
    const int64_t seg = v.expert_offsets[g + 1] - v.expert_offsets[g];
    require(v.expert_offsets[g + 1] % B == 0 && seg >= counts[g] && seg - counts[g] < B, "padded segment");
  }
  const int64_t used = v.expert_offsets[G];
  const int64_t cap = plan_capacity(T, E, K, S, B);
  require(used <= cap, "extent within the capacity for T");
  require(v.extent[0] == used && v.extent[1] == used / B, "extent");
  std::vector<int> seen(static_cast<size_t>(total), 0);
  for (int g = 0; g < G; ++g) {
    int32_t previous = -1;
    for (int64_t r = v.expert_offsets[g]; r < v.expert_offsets[g + 1]; ++r) {
      const int32_t slot = v.sorted_slots[r];
      if (r >= v.expert_offsets[g] + counts[g]) {
        require(slot == total, "padding row");
        continue;
      }
      require(slot > previous && slot < total && v.topk_ids[slot] == g, "expert rows: its slots, ascending");
      require(v.slot_rows[slot] == r, "slot_rows inverts sorted_slots");
      previous = slot;
      ++seen[slot];
    }
    for (int64_t b = v.expert_offsets[g] / B; b < v.expert_offsets[g + 1] / B; ++b)
      require(v.block_experts[b] == g, "block owner");
  }
  for (int64_t s = 0; s < total; ++s) require(seen[s] == 1, "every slot in exactly one row");
  for (int64_t r = used; r < cap; ++r) require(v.sorted_slots[r] == total, "rows past the extent");
  for (int64_t b = used / B; b < cap / B; ++b) require(v.block_experts[b] == -1, "blocks past the extent");
}

/// `a` (expert ea) is selected before `b` (expert eb) in the contract's order: the higher key, NaN below every
/// number, equal keys (-0 == +0) to the lower id.
bool before(float a, int ea, float b, int eb) {
  const bool a_nan = a != a, b_nan = b != b;
  if (a_nan != b_nan) return b_nan;
  if (!a_nan && a != b) return a > b;
  return ea < eb;
}

/// The routed ids of every token against the contract of include/moekit/routing.h, restated here: key = logit (or
/// its portable sigmoid for sigmoid_grouped) + bias; groups scored by the sum of their two best keys (one for groups
/// of one expert) and ordered like keys; the K best experts of the kept groups in descending order.
void check_selection(const RoutingConfig& cfg, const std::vector<float>& logits, int64_t stride,
                     const std::vector<float>& bias, const int32_t* ids, int64_t T) {
  const int E = cfg.num_experts, K = cfg.top_k, Kt = cfg.slots();
  const bool grouped = cfg.method == RoutingMethod::sigmoid_grouped;
  const int size = E / cfg.n_group;
  std::vector<float> key(static_cast<size_t>(E));
  std::vector<int> order(static_cast<size_t>(E)), groups(static_cast<size_t>(cfg.n_group));
  std::vector<float> score(static_cast<size_t>(cfg.n_group));
  for (int64_t t = 0; t < T; ++t) {
    for (int e = 0; e < E; ++e) {
      const float l = logits[static_cast<size_t>(t * stride + e)];
      key[e] = grouped ? routing_math::sigmoid(l) : l;
      if (!bias.empty()) key[e] += bias[e];
    }
    auto by_key = [&](int a, int b) { return before(key[a], a, key[b], b); };
    std::vector<bool> kept(static_cast<size_t>(cfg.n_group), true);
    if (grouped && cfg.n_group > 1) {
      for (int g = 0; g < cfg.n_group; ++g) {
        std::vector<int> members(static_cast<size_t>(size));
        for (int i = 0; i < size; ++i) members[i] = g * size + i;
        std::sort(members.begin(), members.end(), by_key);
        score[g] = size > 1 ? key[members[0]] + key[members[1]] : key[members[0]];
        groups[g] = g;
      }
      std::sort(groups.begin(), groups.end(), [&](int a, int b) { return before(score[a], a, score[b], b); });
      for (int i = 0; i < cfg.n_group; ++i) kept[groups[i]] = i < cfg.topk_group;
    }
    int n = 0;
    for (int e = 0; e < E; ++e)
      if (kept[e / size]) order[n++] = e;
    std::sort(order.begin(), order.begin() + n, by_key);
    for (int j = 0; j < K; ++j)
      require(ids[t * Kt + j] == order[j], "token " + std::to_string(t) + " slot " + std::to_string(j) + ": expert " +
                                               std::to_string(ids[t * Kt + j]) + ", the contract gives " +
                                               std::to_string(order[j]));
  }
}

/// The routed weights of every token whose logits are all in [-80, 80] (the header's formulas say nothing finer about
/// infinities and NaN), against the contract's table computed in double: softmax over all E (softmax_topk) or over
/// the K selected (topk_softmax), the sigmoid (sigmoid_grouped, llama4) or the score (pre_scored); renormalized over
/// the K when asked and the sum is non-zero (not topk_softmax, not llama4); times routed_scaling_factor.
void check_weights(const RoutingConfig& cfg, const std::vector<float>& logits, int64_t stride, const int32_t* ids,
                   const float* weights, int64_t T) {
  const int E = cfg.num_experts, K = cfg.top_k, Kt = cfg.slots();
  std::vector<double> w(static_cast<size_t>(K));
  for (int64_t t = 0; t < T; ++t) {
    const float* row = logits.data() + t * stride;
    if (!std::all_of(row, row + E, [](float l) { return l >= -80.0f && l <= 80.0f; })) continue;
    double max = row[0], all = 0.0, selected = 0.0, abs_sum = 0.0;
    for (int e = 0; e < E; ++e) max = std::max(max, double{row[e]});
    for (int e = 0; e < E; ++e) all += std::exp(row[e] - max);
    for (int j = 0; j < K; ++j) selected += std::exp(row[ids[t * Kt + j]] - max);
    for (int j = 0; j < K; ++j) {
      const double l = row[ids[t * Kt + j]];
      switch (cfg.method) {
        case RoutingMethod::softmax_topk:
          w[j] = std::exp(l - max) / all;
          break;
        case RoutingMethod::topk_softmax:
          w[j] = std::exp(l - max) / selected;
          break;
        case RoutingMethod::sigmoid_grouped:
        case RoutingMethod::llama4:
          w[j] = 1.0 / (1.0 + std::exp(-l));
          break;
        case RoutingMethod::pre_scored:
          w[j] = l;
          break;
      }
    }
    double sum = 0.0;
    for (int j = 0; j < K; ++j) {
      sum += w[j];
      abs_sum += std::abs(w[j]);
    }
    const bool renormalize = cfg.renormalize && cfg.method != RoutingMethod::topk_softmax &&
                             cfg.method != RoutingMethod::llama4 && sum != 0.0;
    // A renormalized sum that cancels (pre_scored's signed scores) magnifies fp32 rounding without bound: skipped.
    if (renormalize && std::abs(sum) < 0.25 * abs_sum) continue;
    for (int j = 0; j < K; ++j) {
      const double want = (renormalize ? w[j] / sum : w[j]) * cfg.routed_scaling_factor;
      const double got = weights[t * Kt + j];
      require(std::abs(got - want) <= 2e-5 * std::abs(want) + 1e-6 * cfg.routed_scaling_factor * (1.0 + abs_sum),
              fmt::format(
                  "token {} slot {}: weight {:.9g}, the contract gives {:.9g} (method {}, scale {:g}, E {}, K {})", t,
                  j, got, want, static_cast<int>(cfg.method), cfg.routed_scaling_factor, E, K));
    }
  }
}

void run_case(const Case& c, Bytes& in) {
  const RoutingConfig& cfg = c.cfg;
  const int E = std::max(cfg.num_experts, 1);
  const int K = std::max(cfg.top_k, 1);
  const int64_t T = c.tokens, stride = std::max<int64_t>(c.row_stride, 1);

  // Buffers sized for what each view describes, so that only a rule the validation misses can read out of bounds.
  const size_t elem = c.logits_dtype == DType::bf16 ? 2 : 4;
  std::vector<unsigned char> logits_buf(static_cast<size_t>(std::max<int64_t>(T * stride, 1)) * elem);
  // A quarter of the rows tame (every value in [-80, 80]): a row of E wild values is rarely all in range, and only
  // such rows have their weights checked.
  bool tame = false;
  for (int64_t i = 0; i < T * stride; ++i) {
    if (i % stride == 0) tame = in.chance(25);
    const float f = tame ? tame_logit_value(in) : logit_value(in);
    if (elem == 2) {
      const uint16_t b = float_to_bf16(f);
      std::memcpy(logits_buf.data() + i * 2, &b, 2);
    } else {
      std::memcpy(logits_buf.data() + i * 4, &f, 4);
    }
  }
  TensorView logits{.data = logits_buf.data(), .dtype = c.logits_dtype, .device = Device::cpu(), .ndim = 2};
  const bool negative_tokens = in.chance(2);  // a hand-built view with a negative row count
  logits.shape = {negative_tokens ? -1 - in.pick(3) : T, cfg.num_experts, 0, 0};
  logits.strides = {c.row_stride, 1, 0, 0};

  std::vector<float> bias_f(static_cast<size_t>(E + 1));
  for (float& b : bias_f) b = logit_value(in);
  std::vector<uint16_t> bias_h(bias_f.size());
  for (size_t i = 0; i < bias_f.size(); ++i) bias_h[i] = float_to_bf16(bias_f[i]);
  const int64_t replay_rows = c.replay_kind == 2 ? T - 1 : T + c.replay_extra;
  constexpr int16_t kUntouched = -12345;
  // Room for [rows, K + 1] int32 (replay_kind 4 views it as int32).
  std::vector<int16_t> replay_buf(static_cast<size_t>(std::max<int64_t>(replay_rows, 1) * (K + 1) * 2), kUntouched);

  try {
    TensorView bias, replay;  // views with a negative extent throw from contiguous(): counted as rejections
    if (c.bias_kind == 1 || c.bias_kind == 3)
      bias = TensorView::contiguous(bias_f.data(), DType::f32, {cfg.num_experts + (c.bias_kind == 3 ? 1 : 0)});
    else if (c.bias_kind == 2)
      bias = TensorView::contiguous(bias_h.data(), DType::bf16, {cfg.num_experts});
    else if (c.bias_kind == 4)
      bias = TensorView::contiguous(bias_f.data(), DType::i32, {cfg.num_experts});
    if (c.replay_kind >= 1)
      replay = TensorView::contiguous(replay_buf.data(), c.replay_kind == 4 ? DType::i32 : DType::i16,
                                      {replay_rows, cfg.top_k + (c.replay_kind == 3 ? 1 : 0)});
    RoutePlan plan(c.shape, Device::cpu());
    route(cfg, logits, bias, plan, nullptr, replay);
    fuzz::accepted(fuzz::outcomes(fuzz::Target::route), c.valid_by_contract && !negative_tokens, "");
    check_plan(c, plan.view());
    std::vector<float> logit_values(static_cast<size_t>(T * stride)), bias_values;
    for (size_t i = 0; i < logit_values.size(); ++i) {
      uint16_t h;
      if (elem == 2) std::memcpy(&h, logits_buf.data() + i * 2, 2);
      logit_values[i] = elem == 2 ? bf16_to_float(h) : reinterpret_cast<const float*>(logits_buf.data())[i];
    }
    if (bias.present())
      for (int e = 0; e < cfg.num_experts; ++e)
        bias_values.push_back(bias.dtype == DType::bf16 ? bf16_to_float(bias_h[e]) : bias_f[e]);
    check_selection(cfg, logit_values, c.row_stride, bias_values, plan.view().topk_ids, T);
    check_weights(cfg, logit_values, c.row_stride, plan.view().topk_ids, plan.view().topk_weights, T);
    if (replay.present()) {
      for (int64_t t = 0; t < replay_rows; ++t)
        for (int j = 0; j < cfg.top_k; ++j) {
          const int16_t got = replay_buf[static_cast<size_t>(t * cfg.top_k + j)];
          require(
              t < T ? got == plan.view().topk_ids[t * (cfg.top_k + cfg.num_shared_experts) + j] : got == kUntouched,
              "replay rows");
        }
    }
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    if (c.valid_by_contract && negative_tokens)
      require(what.find("logits.shape[0] (") != std::string::npos,
              "a negative T rejected for another reason: " + what);
    fuzz::rejected(fuzz::outcomes(fuzz::Target::route), c.valid_by_contract && !negative_tokens, what, "");
  }
}

}  // namespace

void moekit::fuzz::route_input(const uint8_t* data, size_t size) {
  Bytes in(data, size);
  run_case(decode_case(in), in);
}

MOEKIT_FUZZ_ENTRY(route_input)

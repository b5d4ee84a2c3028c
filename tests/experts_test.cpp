// Expert compute: activation and layout names, gated activations at hand-worked points, the CPU reference layer
// against an independent fp64 computation (every activation and gate/up layout, biases, shared experts, expert
// parallelism, empty experts, one token, thread-count independence), every validation message, and the GPU
// activation pass's split of rows into slices.
// Plans are filled by hand here (topk ids and weights): experts_reference reads nothing else from the plan.
#include "moekit/experts.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "error_of.h"
#include "experts/internal.h"
#include "experts/row_slices.h"
#include "moekit/error.h"
#include "moekit/presets.h"

namespace moekit {
namespace {

// ---------------------------------------------------------------------------------------------------------------
// Helpers

uint16_t bf16_of(float f) {
  return float_to_bf16(f);
}

/// Host buffers of one problem: weights, hidden states, top-k ids and weights, and the plan view over them.
struct Problem {
  ExpertConfig cfg;
  int64_t tokens = 0;
  std::vector<uint16_t> w13, w2, hidden;  // [E', 2I, H], [E', H, I], [T, H] bf16
  std::vector<float> b13, b2;             // [E', 2I], [E', H] fp32 (empty: no bias)
  std::vector<uint16_t> b13_bf16, b2_bf16;
  std::vector<int32_t> ids;  // [T, K+S]
  std::vector<float> wts;    // [T, K+S]
  bool bias_as_bf16 = false;

  int slots() const { return cfg.top_k + cfg.num_shared_experts; }

  ExpertWeights weights() {
    const int64_t e = cfg.weight_experts(), h = cfg.hidden, i = cfg.intermediate;
    ExpertWeights w;
    w.w13 = TensorView::contiguous(w13.data(), DType::bf16, {e, 2 * i, h});
    w.w2 = TensorView::contiguous(w2.data(), DType::bf16, {e, h, i});
    if (!b13.empty()) {
      w.b13 = bias_as_bf16 ? TensorView::contiguous(b13_bf16.data(), DType::bf16, {e, 2 * i})
                           : TensorView::contiguous(b13.data(), DType::f32, {e, 2 * i});
      w.b2 = bias_as_bf16 ? TensorView::contiguous(b2_bf16.data(), DType::bf16, {e, h})
                          : TensorView::contiguous(b2.data(), DType::f32, {e, h});
    }
    return w;
  }

  RoutePlanView plan() {
    RoutePlanView v;
    v.shape.max_tokens = tokens;
    v.shape.num_experts = cfg.num_experts;
    v.shape.top_k = cfg.top_k;
    v.shape.num_shared_experts = cfg.num_shared_experts;
    v.shape.block = 1;
    v.tokens = tokens;
    v.topk_ids = ids.data();
    v.topk_weights = wts.data();
    return v;
  }

  /// Runs the reference (in chunks of `chunk_tokens` tokens when > 0) and returns out [T, H] as floats.
  std::vector<float> run(int threads = 0, int64_t chunk_tokens = 0) {
    std::vector<uint16_t> out(tokens * cfg.hidden, 0xffff);  // NaN: every element must be written
    const ExpertWeights w = weights();
    const TensorView x = TensorView::contiguous(hidden.data(), DType::bf16, {tokens, cfg.hidden});
    const TensorView o = TensorView::contiguous(out.data(), DType::bf16, {tokens, cfg.hidden});
    if (chunk_tokens > 0)
      detail::experts_reference_chunked(cfg, w, x, plan(), o, threads, chunk_tokens);
    else
      experts_reference(cfg, w, x, plan(), o, threads);
    std::vector<float> f(out.size());
    for (size_t i = 0; i < out.size(); ++i) f[i] = bf16_to_float(out[i]);
    return f;
  }
};

/// Random weights (scaled so that activations stay O(1)) and hidden states; ids: K distinct routed experts per
/// token drawn from `pool` (all E when empty), then the S shared ids with weight 1.0.
Problem make_problem(const ExpertConfig& cfg, int64_t tokens, uint32_t seed, bool biases = false,
                     std::vector<int> pool = {}) {
  Problem p;
  p.cfg = cfg;
  p.tokens = tokens;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  const int64_t e = cfg.weight_experts(), h = cfg.hidden, i = cfg.intermediate;
  auto fill = [&](std::vector<uint16_t>& v, int64_t n, float scale) {
    v.resize(n);
    for (auto& x : v) x = bf16_of(uni(rng) * scale);
  };
  fill(p.w13, e * 2 * i * h, 2.0f / std::sqrt(static_cast<float>(h)));
  fill(p.w2, e * h * i, 2.0f / std::sqrt(static_cast<float>(i)));
  fill(p.hidden, tokens * h, 1.5f);
  if (biases) {
    // Values representable in bf16, so the fp32 and bf16 bias tensors hold the same numbers.
    fill(p.b13_bf16, e * 2 * i, 0.5f);
    fill(p.b2_bf16, e * h, 0.5f);
    for (uint16_t b : p.b13_bf16) p.b13.push_back(bf16_to_float(b));
    for (uint16_t b : p.b2_bf16) p.b2.push_back(bf16_to_float(b));
  }
  if (pool.empty())
    for (int x = 0; x < cfg.num_experts; ++x) pool.push_back(x);
  std::uniform_real_distribution<float> weight(0.05f, 1.0f);
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<int> cand = pool;
    std::shuffle(cand.begin(), cand.end(), rng);
    for (int j = 0; j < cfg.top_k; ++j) {
      p.ids.push_back(cand[j]);
      p.wts.push_back(weight(rng));
    }
    for (int s = 0; s < cfg.num_shared_experts; ++s) {
      p.ids.push_back(cfg.num_experts + s);
      p.wts.push_back(1.0f);
    }
  }
  return p;
}

/// The gated activations in double, written from their definitions.
double act_fp64(Activation a, const ActivationParams& p, double gate, double up) {
  switch (a) {
    case Activation::silu_gated:
      return gate / (1.0 + std::exp(-gate)) * up;
    case Activation::swiglu_clamped: {
      const double g = gate > p.limit ? p.limit : gate;
      const double u = up > p.limit ? p.limit : (up < -p.limit ? -p.limit : up);
      return g * (1.0 / (1.0 + std::exp(-p.alpha * g))) * (u + p.beta);
    }
    case Activation::gelu_gated: {
      const double k = std::sqrt(2.0 / 3.14159265358979323846);
      return 0.5 * gate * (1.0 + std::tanh(k * (gate + 0.044715 * gate * gate * gate))) * up;
    }
  }
  return 0.0;
}

/// Straightforward fp64 layer: per token, per slot, two matrix-vector products and the activation; a routed slot's
/// weight scales the expert's input instead of its output when the config says so.
std::vector<double> layer_fp64(const Problem& p) {
  const ExpertConfig& c = p.cfg;
  const int64_t H = c.hidden, I = c.intermediate;
  const int local = c.local_num_experts < 0 ? c.num_experts : c.local_num_experts;
  std::vector<double> out(p.tokens * H, 0.0), hbuf(2 * I), a(I);
  for (int64_t t = 0; t < p.tokens; ++t)
    for (int j = 0; j < p.slots(); ++j) {
      const int id = p.ids[t * p.slots() + j];
      int64_t le;
      if (id >= c.num_experts)
        le = local + (id - c.num_experts);
      else if (id >= c.local_expert_offset && id < c.local_expert_offset + local)
        le = id - c.local_expert_offset;
      else
        continue;
      const double w = p.wts[t * p.slots() + j];
      const bool on_input = c.routing_weight_on_input && id < c.num_experts;
      const double in_scale = on_input ? w : 1.0, out_scale = on_input ? 1.0 : w;
      for (int64_t n = 0; n < 2 * I; ++n) {
        double s = p.b13.empty() ? 0.0 : p.b13[le * 2 * I + n];
        for (int64_t k = 0; k < H; ++k)
          s += double(bf16_to_float(p.w13[(le * 2 * I + n) * H + k])) *
               (in_scale * double(bf16_to_float(p.hidden[t * H + k])));
        hbuf[n] = s;
      }
      for (int64_t i = 0; i < I; ++i) {
        double g = hbuf[i], u = hbuf[I + i];
        if (c.gate_up == GateUpLayout::up_first) std::swap(g, u);
        if (c.gate_up == GateUpLayout::interleaved) g = hbuf[2 * i], u = hbuf[2 * i + 1];
        a[i] = act_fp64(c.activation, c.act, g, u);
      }
      for (int64_t h = 0; h < H; ++h) {
        double s = p.b2.empty() ? 0.0 : p.b2[le * H + h];
        for (int64_t i = 0; i < I; ++i) s += double(bf16_to_float(p.w2[(le * H + h) * I + i])) * a[i];
        out[t * H + h] += out_scale * s;
      }
    }
  return out;
}

/// bf16 output vs fp64: relative Frobenius error <= 4e-3, and each element within one bf16 rounding
/// (2^-8 relative, generous) plus a small absolute slack for fp32 accumulation near zero.
void expect_close(const std::vector<float>& got, const std::vector<double>& ref) {
  ASSERT_EQ(got.size(), ref.size());
  double num = 0, den = 0, scale = 0;
  for (double r : ref) scale = std::max(scale, std::abs(r));
  int bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = got[i] - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
    if (std::abs(d) > std::ldexp(std::abs(ref[i]), -8) + 1e-5 * scale && bad++ < 5)
      ADD_FAILURE() << "element " << i << ": " << got[i] << " vs fp64 " << ref[i];
  }
  EXPECT_EQ(bad, 0);
  EXPECT_GT(den, 0.0) << "degenerate case: reference output is all zero";
  EXPECT_LE(std::sqrt(num / den), 4e-3);
}

using testing::error_of;

// ---------------------------------------------------------------------------------------------------------------
// Names and activations

TEST(ExpertNames, RoundTripAndErrors) {
  for (Activation a : {Activation::silu_gated, Activation::swiglu_clamped, Activation::gelu_gated})
    EXPECT_EQ(parse_activation(activation_name(a)), a);
  for (GateUpLayout l : {GateUpLayout::gate_first, GateUpLayout::up_first, GateUpLayout::interleaved})
    EXPECT_EQ(parse_gate_up_layout(gate_up_layout_name(l)), l);
  EXPECT_EQ(activation_name(Activation::swiglu_clamped), "swiglu_clamped");
  EXPECT_EQ(gate_up_layout_name(GateUpLayout::interleaved), "interleaved");
  EXPECT_EQ(error_of([] { parse_activation("relu"); }),
            "moekit::experts: unknown activation 'relu' (expected one of: silu_gated, swiglu_clamped, gelu_gated)");
  EXPECT_EQ(error_of([] { parse_gate_up_layout("gate_last"); }),
            "moekit::experts: unknown gate_up layout 'gate_last' (expected one of: gate_first, up_first, "
            "interleaved)");
}

TEST(Activation, SiluGatedAtHandPoints) {
  const ActivationParams p;
  EXPECT_EQ(apply_activation(Activation::silu_gated, p, 0.0f, 5.0f), 0.0f);  // silu(0) = 0
  // silu(1) = 1 / (1 + e^-1) = 0.7310586...; times up = 2.
  EXPECT_NEAR(apply_activation(Activation::silu_gated, p, 1.0f, 2.0f), 2 * 0.7310585786, 2e-6);
  EXPECT_NEAR(apply_activation(Activation::silu_gated, p, -3.0f, 0.5f), -3.0 / (1.0 + std::exp(3.0)) * 0.5, 1e-7);
  EXPECT_NEAR(apply_activation(Activation::silu_gated, p, 20.0f, -1.0f), -20.0 / (1.0 + std::exp(-20.0)), 4e-6);
}

TEST(Activation, SwigluClampedAtHandPoints) {
  const ActivationParams p;  // alpha 1.702, beta 1, limit 7
  auto sig = [](double x) { return 1.0 / (1.0 + std::exp(-x)); };
  // Inside the limits: g * sigmoid(1.702 g) * (u + 1).
  EXPECT_NEAR(apply_activation(Activation::swiglu_clamped, p, 0.5f, 2.0f), 0.5 * sig(0.851) * 3.0, 1e-6);
  // gate 9 is clamped to 7 (from above only); up -10 is clamped to -7: 7 * sigmoid(11.914) * (-6).
  EXPECT_NEAR(apply_activation(Activation::swiglu_clamped, p, 9.0f, -10.0f), 7.0 * sig(11.914) * -6.0, 1e-5);
  // A very negative gate is not clamped from below; up 8 clamps to 7.
  EXPECT_NEAR(apply_activation(Activation::swiglu_clamped, p, -9.0f, 8.0f), -9.0 * sig(-15.318) * 8.0, 1e-7);
  const ActivationParams q{.alpha = 2.0f, .beta = 0.0f, .limit = 1.0f};
  EXPECT_NEAR(apply_activation(Activation::swiglu_clamped, q, 3.0f, 0.25f), 1.0 * sig(2.0) * 0.25, 1e-7);
}

TEST(Activation, GeluGatedAtHandPoints) {
  const ActivationParams p;
  auto gelu = [](double x) { return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); };
  EXPECT_EQ(apply_activation(Activation::gelu_gated, p, 0.0f, 3.0f), 0.0f);
  // gelu_tanh(1) = 0.5 * (1 + tanh(0.7978845608 * 1.044715)) = 0.8411920...
  EXPECT_NEAR(apply_activation(Activation::gelu_gated, p, 1.0f, 1.0f), 0.841192, 1e-6);
  EXPECT_NEAR(apply_activation(Activation::gelu_gated, p, -2.0f, 1.5f), gelu(-2.0) * 1.5, 1e-6);
  EXPECT_NEAR(apply_activation(Activation::gelu_gated, p, 3.0f, -0.5f), gelu(3.0) * -0.5, 2e-6);
}

// ---------------------------------------------------------------------------------------------------------------
// The layer against fp64

class LayerPerActivation : public ::testing::TestWithParam<Activation> {};

TEST_P(LayerPerActivation, MatchesFp64) {
  ExpertConfig c = make_expert_config(8, 2, 64, 32, 0, GetParam());
  // Large enough pre-activations that swiglu's limit clamps some of them.
  if (GetParam() == Activation::swiglu_clamped) c.act.limit = 1.5f;
  const uint32_t seed = 11;
  SCOPED_TRACE("seed " + std::to_string(seed));
  Problem p = make_problem(c, 13, seed);
  expect_close(p.run(), layer_fp64(p));
}

INSTANTIATE_TEST_SUITE_P(Experts, LayerPerActivation,
                         ::testing::Values(Activation::silu_gated, Activation::swiglu_clamped,
                                           Activation::gelu_gated),
                         [](const auto& info) { return std::string(activation_name(info.param)); });

// The same logical gate/up rows (and b13 entries) in every arrangement, rearranged by rearrange_gate_up(): the
// reference reads each arrangement to the same result, bit for bit.
TEST(ExpertsReference, EveryGateUpLayoutGivesTheSameResult) {
  ExpertConfig c = make_expert_config(4, 2, 32, 24);
  Problem p = make_problem(c, 9, 5, /*biases=*/true);
  const std::vector<double> ref = layer_fp64(p);
  const std::vector<float> base = p.run();
  expect_close(base, ref);
  const int64_t E = c.weight_experts(), I = c.intermediate, H = c.hidden;
  for (GateUpLayout layout : {GateUpLayout::up_first, GateUpLayout::interleaved}) {
    SCOPED_TRACE(std::string(gate_up_layout_name(layout)));
    Problem q = p;
    q.cfg.gate_up = layout;
    rearrange_gate_up(TensorView::contiguous(p.w13.data(), DType::bf16, {E, 2 * I, H}), GateUpLayout::gate_first,
                      TensorView::contiguous(q.w13.data(), DType::bf16, {E, 2 * I, H}), layout);
    rearrange_gate_up(TensorView::contiguous(p.b13.data(), DType::f32, {E, 2 * I}), GateUpLayout::gate_first,
                      TensorView::contiguous(q.b13.data(), DType::f32, {E, 2 * I}), layout);
    EXPECT_NE(q.w13, p.w13);
    EXPECT_EQ(q.run(), base);
    expect_close(q.run(), layer_fp64(q));  // the fp64 layer reads the layout itself
  }
}

// Rows move as DESIGN §5 arranges them (gate rows then up rows; up then gate; gate, up, gate, up, ...), whole rows
// of any element size, expert by expert; a round trip through every arrangement restores the input.
TEST(RearrangeGateUp, RowsByHandAndRoundTrip) {
  // One expert, I = 2, rows of 3 floats: gate rows g0 g1, up rows u0 u1 (gate_first).
  std::vector<float> src = {1, 1, 1, 2, 2, 2, 10, 10, 10, 20, 20, 20}, dst(12);
  const TensorView s = TensorView::contiguous(src.data(), DType::f32, {1, 4, 3});
  const TensorView d = TensorView::contiguous(dst.data(), DType::f32, {1, 4, 3});
  rearrange_gate_up(s, GateUpLayout::gate_first, d, GateUpLayout::interleaved);
  EXPECT_EQ(dst, (std::vector<float>{1, 1, 1, 10, 10, 10, 2, 2, 2, 20, 20, 20}));
  rearrange_gate_up(s, GateUpLayout::gate_first, d, GateUpLayout::up_first);
  EXPECT_EQ(dst, (std::vector<float>{10, 10, 10, 20, 20, 20, 1, 1, 1, 2, 2, 2}));

  // Three experts of I = 5 bf16 rows of 7, and their [E', 2I] bias: gate_first -> interleaved -> up_first -> back.
  std::vector<uint16_t> w(3 * 10 * 7);
  for (size_t k = 0; k < w.size(); ++k) w[k] = static_cast<uint16_t>(k * 2654435761u >> 7);
  std::vector<uint16_t> a(w.size()), b(w.size()), back(w.size());
  auto view = [](std::vector<uint16_t>& v) { return TensorView::contiguous(v.data(), DType::bf16, {3, 10, 7}); };
  rearrange_gate_up(view(w), GateUpLayout::gate_first, view(a), GateUpLayout::interleaved);
  rearrange_gate_up(view(a), GateUpLayout::interleaved, view(b), GateUpLayout::up_first);
  rearrange_gate_up(view(b), GateUpLayout::up_first, view(back), GateUpLayout::gate_first);
  EXPECT_NE(a, w);
  EXPECT_NE(b, w);
  EXPECT_EQ(back, w);
  // Expert 2's gate(4) (row 2 * 10 + 4 of gate_first) is row 2 * 10 + 8 interleaved and 2 * 10 + 9 up_first.
  EXPECT_TRUE(std::equal(w.begin() + 24 * 7, w.begin() + 25 * 7, a.begin() + 28 * 7));
  EXPECT_TRUE(std::equal(w.begin() + 24 * 7, w.begin() + 25 * 7, b.begin() + 29 * 7));
  rearrange_gate_up(view(w), GateUpLayout::gate_first, view(a), GateUpLayout::gate_first);  // same arrangement: copy
  EXPECT_EQ(a, w);
}

TEST(RearrangeGateUp, RejectsBadViews) {
  std::vector<float> x(2 * 4 * 3), y(2 * 4 * 3);
  const TensorView src = TensorView::contiguous(x.data(), DType::f32, {2, 4, 3});
  const TensorView dst = TensorView::contiguous(y.data(), DType::f32, {2, 4, 3});
  const GateUpLayout g = GateUpLayout::gate_first, il = GateUpLayout::interleaved;
  auto message = [&](const TensorView& s, const TensorView& d) {
    return error_of([&] { rearrange_gate_up(s, g, d, il); });
  };
  EXPECT_EQ(message(TensorView{}, dst), "moekit::experts: src must be present");
  EXPECT_EQ(message(src, TensorView::contiguous(y.data(), DType::f32, {2, 4, 3}, Device::cuda(0))),
            "moekit::experts: dst ([2, 4, 3] fp32 cuda:0) must be in host memory");
  EXPECT_EQ(message(TensorView::contiguous(x.data(), DType::f32, {24}), dst),
            "moekit::experts: src ([24] fp32 cpu) must be [E', 2I, H] or [E', 2I]");
  EXPECT_EQ(message(TensorView::contiguous(x.data(), DType::f32, {2, 3, 4}), dst),
            "moekit::experts: src ([2, 3, 4] fp32 cpu) must have an even dim 1 (2I)");
  EXPECT_EQ(message(src, TensorView::contiguous(y.data(), DType::f32, {2, 4, 2})),
            "moekit::experts: dst ([2, 4, 2] fp32 cpu) must have the shape and dtype of src ([2, 4, 3] fp32 cpu)");
  EXPECT_EQ(message(src, TensorView::contiguous(y.data(), DType::i32, {2, 4, 3})),
            "moekit::experts: dst ([2, 4, 3] int32 cpu) must have the shape and dtype of src ([2, 4, 3] fp32 cpu)");
  EXPECT_EQ(message(src, TensorView::contiguous(x.data() + 3, DType::f32, {2, 4, 3})),
            "moekit::experts: dst must not overlap src");
  TensorView strided = src;
  strided.strides[0] = 24;
  EXPECT_EQ(message(strided, dst), "moekit::experts: src ([2, 4, 3] fp32 cpu) must be contiguous");
  EXPECT_EQ(message(src, TensorView::contiguous(nullptr, DType::f32, {2, 4, 3})),
            "moekit::experts: dst ([2, 4, 3] fp32 cpu) must not be null");
  EXPECT_EQ(message(src, dst), testing::kNoThrow);
  // A layout value outside the enum was read as gate_first.
  try {
    rearrange_gate_up(src, g, dst, static_cast<GateUpLayout>(5));
    ADD_FAILURE() << "no error for an unknown layout";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "moekit::experts: to (5) must be a known gate/up layout");
  }
}

TEST(ExpertsReference, BiasesFp32AndBf16) {
  ExpertConfig c = make_expert_config(6, 3, 48, 16, 0, Activation::swiglu_clamped);
  c.gate_up = GateUpLayout::interleaved;
  Problem p = make_problem(c, 10, 21, /*biases=*/true);
  const std::vector<float> with_fp32 = p.run();
  expect_close(with_fp32, layer_fp64(p));
  p.bias_as_bf16 = true;
  EXPECT_EQ(p.run(), with_fp32);  // same values, other storage type
  Problem no_bias = p;
  no_bias.b13.clear();
  no_bias.b2.clear();
  EXPECT_NE(no_bias.run(), with_fp32);  // the biases are really applied
}

TEST(ExpertsReference, SharedExperts) {
  ExpertConfig c = make_expert_config(8, 2, 32, 16, 2);
  Problem p = make_problem(c, 7, 3);
  ASSERT_EQ(p.ids[2], 8);
  ASSERT_EQ(p.ids[3], 9);
  expect_close(p.run(), layer_fp64(p));
  // The shared slots matter: dropping their weight to zero changes the output.
  Problem q = p;
  for (int64_t t = 0; t < q.tokens; ++t) q.wts[t * 4 + 2] = q.wts[t * 4 + 3] = 0.0f;
  EXPECT_NE(q.run(), p.run());
}

// Llama-4's form: a routed slot's weight scales the expert's input, the combine adds its output unweighted; shared
// slots keep their weight on the output. Not the output-weighted layer (the activation is not linear), but the same
// layer where every weight is 1.
TEST(ExpertsReference, RoutingWeightOnInput) {
  for (const Activation a : {Activation::silu_gated, Activation::swiglu_clamped, Activation::gelu_gated}) {
    ExpertConfig c = make_expert_config(8, 2, 32, 16, 1, a);
    c.routing_weight_on_input = true;
    Problem p = make_problem(c, 9, 21, /*biases=*/true);
    const std::vector<float> on_input = p.run();
    expect_close(on_input, layer_fp64(p));
    Problem on_output = p;
    on_output.cfg.routing_weight_on_input = false;
    EXPECT_NE(on_output.run(), on_input) << activation_name(a);
    for (float& w : p.wts) w = 1.0f;
    on_output.wts = p.wts;
    EXPECT_EQ(p.run(), on_output.run()) << activation_name(a);
  }
  // A shared slot's weight stays on its output (a plan made by hand may hold any weight there).
  ExpertConfig c = make_expert_config(8, 2, 32, 16, 1);
  c.routing_weight_on_input = true;
  Problem p = make_problem(c, 5, 22);
  for (int64_t t = 0; t < p.tokens; ++t) p.wts[t * 3 + 2] = 0.5f;
  expect_close(p.run(), layer_fp64(p));
}

TEST(ExpertsReference, ExpertParallelSkipsOtherRanks) {
  // Global E = 8; this rank holds experts 2..4 plus one shared expert: E' = 4.
  ExpertConfig full = make_expert_config(8, 3, 32, 16, 1);
  Problem all = make_problem(full, 12, 8);
  // Token 0 goes only to other ranks' experts (and the shared one, zero-weighted here).
  all.ids[0] = 0;
  all.ids[1] = 6;
  all.ids[2] = 7;
  all.wts[3] = 0.0f;
  ExpertConfig ep = full;
  ep.local_num_experts = 3;
  ep.local_expert_offset = 2;
  Problem rank = all;
  rank.cfg = ep;
  const int64_t per13 = 2 * 16 * 32, per2 = 32 * 16;
  rank.w13.assign(all.w13.begin() + 2 * per13, all.w13.begin() + 5 * per13);
  rank.w13.insert(rank.w13.end(), all.w13.begin() + 8 * per13, all.w13.end());
  rank.w2.assign(all.w2.begin() + 2 * per2, all.w2.begin() + 5 * per2);
  rank.w2.insert(rank.w2.end(), all.w2.begin() + 8 * per2, all.w2.end());
  const std::vector<float> got = rank.run(2);
  expect_close(got, layer_fp64(rank));
  for (int64_t h = 0; h < 32; ++h) EXPECT_EQ(got[h], 0.0f) << h;
  // Same as the full layer with other ranks' slots weighted zero (adding 0 * y leaves the fp32 sum unchanged).
  Problem masked = all;
  for (size_t s = 0; s < masked.ids.size(); ++s)
    if (masked.ids[s] < 8 && (masked.ids[s] < 2 || masked.ids[s] > 4)) masked.wts[s] = 0.0f;
  EXPECT_EQ(masked.run(), got);
}

TEST(ExpertsReference, EmptyAndHotExperts) {
  ExpertConfig c = make_expert_config(16, 2, 40, 24);
  // Only experts 3, 7 and 12 receive tokens; 9 tokens give row groups with a tail.
  Problem p = make_problem(c, 9, 17, false, {3, 7, 12});
  expect_close(p.run(), layer_fp64(p));
  // Every token to expert 5 (K = 1): one hot expert, all others empty.
  ExpertConfig k1 = make_expert_config(16, 1, 40, 24);
  Problem hot = make_problem(k1, 11, 19, false, {5});
  expect_close(hot.run(), layer_fp64(hot));
}

TEST(ExpertsReference, OneTokenAndNoTokens) {
  ExpertConfig c = make_expert_config(8, 4, 64, 40, 1, Activation::gelu_gated);
  Problem p = make_problem(c, 1, 23);
  expect_close(p.run(), layer_fp64(p));
  Problem none = make_problem(c, 0, 23);
  EXPECT_TRUE(none.run().empty());
}

TEST(ExpertsReference, ResultIndependentOfThreadCount) {
  ExpertConfig c = make_expert_config(8, 3, 96, 48, 1);
  Problem p = make_problem(c, 37, 29, true);
  const std::vector<float> one = p.run(1);
  EXPECT_EQ(p.run(2), one);
  EXPECT_EQ(p.run(3), one);
  EXPECT_EQ(p.run(0), one);
  expect_close(one, layer_fp64(p));
}

TEST(ExpertsReference, ResultIndependentOfTokenChunks) {
  ExpertConfig c = make_expert_config(6, 2, 32, 16, 1);
  Problem p = make_problem(c, 11, 31);
  const std::vector<float> whole = p.run(2);
  for (int64_t chunk : {1, 3, 4, 10}) EXPECT_EQ(p.run(2, chunk), whole) << "chunk " << chunk;
  expect_close(whole, layer_fp64(p));
}

// out may be hidden itself: each chunk reads its rows of hidden before it writes them, and later chunks read rows
// no earlier chunk wrote. An out that overlaps hidden otherwise is rejected, before anything is written.
TEST(ExpertsReference, InPlaceGivesTheSameResult) {
  ExpertConfig c = make_expert_config(6, 2, 32, 16, 1);
  Problem p = make_problem(c, 11, 37, true);
  const std::vector<float> apart = p.run(2);
  const std::vector<uint16_t> hidden = p.hidden;
  for (int64_t chunk : {0, 1, 4}) {
    std::vector<uint16_t> buf = hidden;
    const TensorView v = TensorView::contiguous(buf.data(), DType::bf16, {11, 32});
    if (chunk > 0)
      detail::experts_reference_chunked(c, p.weights(), v, p.plan(), v, 2, chunk);
    else
      experts_reference(c, p.weights(), v, p.plan(), v, 2);
    std::vector<float> got(buf.size());
    for (size_t i = 0; i < buf.size(); ++i) got[i] = bf16_to_float(buf[i]);
    EXPECT_EQ(got, apart) << "chunk " << chunk;
  }
  std::vector<uint16_t> wide(hidden.size() + 64);
  std::copy(hidden.begin(), hidden.end(), wide.begin());
  const TensorView h = TensorView::contiguous(wide.data(), DType::bf16, {11, 32});
  const TensorView later = TensorView::contiguous(wide.data() + 32, DType::bf16, {11, 32});
  EXPECT_EQ(error_of([&] { experts_reference(c, p.weights(), h, p.plan(), later, 2); }),
            "moekit::experts: out ([11, 32] bf16 cpu) must be hidden itself (in place) or share no byte with it; "
            "it starts 64 bytes after hidden");
  EXPECT_EQ(error_of([&] { experts_reference(c, p.weights(), later, p.plan(), h, 2); }),
            "moekit::experts: out ([11, 32] bf16 cpu) must be hidden itself (in place) or share no byte with it; "
            "it starts 64 bytes before hidden");
  EXPECT_TRUE(std::equal(hidden.begin(), hidden.end(), wide.begin()));
}

// ---------------------------------------------------------------------------------------------------------------
// Validation

TEST(ExpertConfigValidate, EveryField) {
  auto msg = [](const std::function<void(ExpertConfig&)>& edit) {
    ExpertConfig c = make_expert_config(8, 2, 64, 32, 1);
    edit(c);
    return error_of([&] { c.validate(); });
  };
  EXPECT_EQ(msg([](ExpertConfig&) {}), testing::kNoThrow);
  EXPECT_EQ(msg([](ExpertConfig& c) { c.num_experts = 0; }), "moekit::experts: num_experts (0) must be in 1..1024");
  EXPECT_EQ(msg([](ExpertConfig& c) { c.num_experts = 1025; }),
            "moekit::experts: num_experts (1025) must be in 1..1024");
  EXPECT_EQ(msg([](ExpertConfig& c) { c.top_k = 0; }), "moekit::experts: top_k (0) must be >= 1");
  EXPECT_EQ(msg([](ExpertConfig& c) { c.top_k = 9; }), "moekit::experts: top_k (9) must be <= num_experts (8)");
  EXPECT_EQ(msg([](ExpertConfig& c) { c.hidden = 0; }),
            "moekit::experts: hidden (0) must be a positive multiple of 8");
  EXPECT_EQ(msg([](ExpertConfig& c) { c.hidden = 100; }),
            "moekit::experts: hidden (100) must be a positive multiple of 8");
  EXPECT_EQ(msg([](ExpertConfig& c) { c.intermediate = -8; }),
            "moekit::experts: intermediate (-8) must be a positive multiple of 8");
  EXPECT_EQ(msg([](ExpertConfig& c) { c.num_shared_experts = -1; }),
            "moekit::experts: num_shared_experts (-1) must be >= 0");
  EXPECT_EQ(msg([](ExpertConfig& c) {
              c.num_experts = 64;
              c.top_k = 30;
              c.num_shared_experts = 3;
            }),
            "moekit::experts: top_k + num_shared_experts (33) must be <= 32");
  EXPECT_EQ(msg([](ExpertConfig& c) { c.num_shared_experts = 2147483647; }),  // the sum would overflow int
            "moekit::experts: top_k + num_shared_experts (2147483649) must be <= 32");
  EXPECT_EQ(msg([](ExpertConfig& c) { c.local_num_experts = 9; }),
            "moekit::experts: local_num_experts (9) must be -1 or in 0..8");
  EXPECT_EQ(msg([](ExpertConfig& c) { c.local_num_experts = -2; }),
            "moekit::experts: local_num_experts (-2) must be -1 or in 0..8");
  EXPECT_EQ(msg([](ExpertConfig& c) {
              c.local_expert_offset = 8;
              c.local_num_experts = 0;
            }),
            "moekit::experts: local_expert_offset (8) must be in 0..7");
  EXPECT_EQ(msg([](ExpertConfig& c) {
              c.local_expert_offset = 5;
              c.local_num_experts = 4;
            }),
            "moekit::experts: local_expert_offset + local experts (5 + 4) must be <= num_experts (8)");
  EXPECT_EQ(msg([](ExpertConfig& c) { c.local_expert_offset = 1; }),
            "moekit::experts: local_expert_offset + local experts (1 + 8) must be <= num_experts (8)");
  EXPECT_EQ(msg([](ExpertConfig& c) {
              c.local_expert_offset = 4;
              c.local_num_experts = 4;
            }),
            testing::kNoThrow);
}

// swiglu_clamped's parameters: NaN or infinite alpha / beta and a limit that is not > 0 (NaN included) are
// rejected; +inf (no clamp) is allowed, and the other activations ignore the parameters.
TEST(ExpertConfigValidate, SwigluClampedParameters) {
  auto msg = [](Activation a, ActivationParams act) {
    ExpertConfig c = make_expert_config(8, 2, 64, 32, 0, a);
    c.act = act;
    return error_of([&] { c.validate(); });
  };
  const Activation sw = Activation::swiglu_clamped;
  EXPECT_EQ(msg(sw, {}), testing::kNoThrow);
  EXPECT_EQ(msg(sw, {.alpha = 1.0f, .beta = 0.0f, .limit = INFINITY}), testing::kNoThrow);
  EXPECT_EQ(msg(sw, {.alpha = NAN}),
            "moekit::experts: act.alpha (nan) and act.beta (1) must be finite for swiglu_clamped");
  EXPECT_EQ(msg(sw, {.beta = -INFINITY}),
            "moekit::experts: act.alpha (1.702) and act.beta (-inf) must be finite for swiglu_clamped");
  for (float limit : {0.0f, -1.0f, NAN})
    EXPECT_EQ(msg(sw, {.limit = limit}),
              fmt::format("moekit::experts: act.limit ({}) must be > 0 for swiglu_clamped (+inf: no clamp)", limit));
  EXPECT_EQ(msg(Activation::silu_gated, {.alpha = NAN, .limit = -1.0f}), testing::kNoThrow);
}

TEST(ExpertWeightsValidate, ShapesDtypesLayoutDevice) {
  ExpertConfig c = make_expert_config(4, 2, 16, 8, 1);  // E' = 5
  Problem p = make_problem(c, 1, 1, true);
  const ExpertWeights good = p.weights();
  auto msg = [&](const std::function<void(ExpertWeights&)>& edit, Device d = Device::cpu()) {
    ExpertWeights w = good;
    edit(w);
    return error_of([&] { validate_expert_weights(c, w, d); });
  };
  void* d13 = p.w13.data();
  EXPECT_EQ(msg([](ExpertWeights&) {}), testing::kNoThrow);
  EXPECT_EQ(msg([](ExpertWeights& w) { w.w13 = {}; }),
            "moekit::experts: w13 (absent) must be [E', 2I, H] = [5, 16, 16]");
  EXPECT_EQ(msg([&](ExpertWeights& w) {
              w.w13 = TensorView::contiguous(d13, DType::bf16, {4, 16, 16});
            }),
            "moekit::experts: w13 ([4, 16, 16] bf16 cpu) must be [E', 2I, H] = [5, 16, 16]");
  EXPECT_EQ(msg([&](ExpertWeights& w) {
              w.w13 = TensorView::contiguous(d13, DType::bf16, {5, 256});
            }),
            "moekit::experts: w13 ([5, 256] bf16 cpu) must be [E', 2I, H] = [5, 16, 16]");
  EXPECT_EQ(msg([&](ExpertWeights& w) {
              w.w13 = TensorView::contiguous(d13, DType::f32, {5, 16, 16});
            }),
            "moekit::experts: w13 ([5, 16, 16] fp32 cpu) must be bf16");
  EXPECT_EQ(msg([](ExpertWeights& w) { std::swap(w.w13.strides[1], w.w13.strides[2]); }),
            "moekit::experts: w13 ([5, 16, 16] bf16 cpu) must be contiguous");
  EXPECT_EQ(msg([](ExpertWeights& w) { w.w13.data = nullptr; }),
            "moekit::experts: w13 ([5, 16, 16] bf16 cpu) must not be null");
  EXPECT_EQ(msg([](ExpertWeights&) {}, Device::cuda(0)),
            "moekit::experts: w13 ([5, 16, 16] bf16 cpu) must be on cuda:0");
  EXPECT_EQ(msg([&](ExpertWeights& w) {
              w.w2 = TensorView::contiguous(p.w2.data(), DType::bf16, {5, 8, 16});
            }),
            "moekit::experts: w2 ([5, 8, 16] bf16 cpu) must be [E', H, I] = [5, 16, 8]");
  EXPECT_EQ(msg([&](ExpertWeights& w) {
              w.w2 = TensorView::contiguous(p.w2.data(), DType::f16, {5, 16, 8});
            }),
            "moekit::experts: w2 ([5, 16, 8] fp16 cpu) must be bf16");
  EXPECT_EQ(msg([&](ExpertWeights& w) {
              w.b13 = TensorView::contiguous(p.b13.data(), DType::f32, {5, 8});
            }),
            "moekit::experts: b13 ([5, 8] fp32 cpu) must be [E', 2I] = [5, 16]");
  EXPECT_EQ(msg([&](ExpertWeights& w) {
              w.b13 = TensorView::contiguous(p.b13.data(), DType::i32, {5, 16});
            }),
            "moekit::experts: b13 ([5, 16] int32 cpu) must be fp32 or bf16");
  EXPECT_EQ(msg([&](ExpertWeights& w) {
              w.b2 = TensorView::contiguous(p.b2.data(), DType::f32, {4, 16});
            }),
            "moekit::experts: b2 ([4, 16] fp32 cpu) must be [E', H] = [5, 16]");
  EXPECT_EQ(msg([](ExpertWeights& w) { w.b2.device = Device::cuda(1); }),
            "moekit::experts: b2 ([5, 16] fp32 cuda:1) must be on cpu");
  EXPECT_EQ(msg([](ExpertWeights& w) {
              w.b13 = {};
              w.b2 = {};
            }),
            testing::kNoThrow);  // biases optional
  // The config is validated first.
  ExpertConfig bad = c;
  bad.hidden = 12;
  EXPECT_EQ(error_of([&] { validate_expert_weights(bad, good, Device::cpu()); }),
            "moekit::experts: hidden (12) must be a positive multiple of 8");
}

TEST(ExpertsReferenceValidate, TensorsPlanAndThreads) {
  ExpertConfig c = make_expert_config(4, 2, 16, 8);
  Problem p = make_problem(c, 3, 2);
  std::vector<uint16_t> out(3 * 16);
  std::vector<float> out_f32(3 * 16);
  const ExpertWeights w = p.weights();
  const TensorView hidden = TensorView::contiguous(p.hidden.data(), DType::bf16, {3, 16});
  const TensorView out_v = TensorView::contiguous(out.data(), DType::bf16, {3, 16});
  auto msg = [&](TensorView h, TensorView o, RoutePlanView plan, int threads = 0) {
    return error_of([&] { experts_reference(c, w, h, plan, o, threads); });
  };
  EXPECT_EQ(msg(hidden, out_v, p.plan()), testing::kNoThrow);
  EXPECT_EQ(msg(TensorView::contiguous(p.hidden.data(), DType::bf16, {2, 16}), out_v, p.plan()),
            "moekit::experts: hidden ([2, 16] bf16 cpu) must be [T, H] = [3, 16]");
  EXPECT_EQ(msg(hidden, TensorView::contiguous(out_f32.data(), DType::f32, {3, 16}), p.plan()),
            "moekit::experts: out ([3, 16] fp32 cpu) must be bf16");
  TensorView on_gpu = out_v;
  on_gpu.device = Device::cuda(0);
  EXPECT_EQ(msg(hidden, on_gpu, p.plan()), "moekit::experts: out ([3, 16] bf16 cuda:0) must be on cpu");
  RoutePlanView plan = p.plan();
  plan.shape.top_k = 3;
  EXPECT_EQ(msg(hidden, out_v, plan), "moekit::experts: plan top_k (3) must equal top_k (2)");
  plan = p.plan();
  plan.shape.num_experts = 5;
  EXPECT_EQ(msg(hidden, out_v, plan), "moekit::experts: plan num_experts (5) must equal num_experts (4)");
  plan = p.plan();
  plan.shape.num_shared_experts = 1;
  EXPECT_EQ(msg(hidden, out_v, plan),
            "moekit::experts: plan num_shared_experts (1) must equal num_shared_experts (0)");
  plan = p.plan();
  plan.tokens = 4;
  EXPECT_EQ(msg(hidden, out_v, plan), "moekit::experts: plan tokens (4) must be in 0..3");
  plan = p.plan();
  plan.topk_weights = nullptr;
  EXPECT_EQ(msg(hidden, out_v, plan), "moekit::experts: plan topk_ids and topk_weights must not be null");
  p.ids[3] = 4;  // token 1, slot 1: no expert 4 when E = 4 and S = 0
  EXPECT_EQ(msg(hidden, out_v, p.plan()), "moekit::experts: topk_ids[1, 1] (4) must be in 0..3");
  p.ids[3] = -1;
  EXPECT_EQ(msg(hidden, out_v, p.plan()), "moekit::experts: topk_ids[1, 1] (-1) must be in 0..3");
  p.ids[3] = 0;
  EXPECT_EQ(msg(hidden, out_v, p.plan(), -1), "moekit::experts: threads (-1) must be >= 0");
}

// ---------------------------------------------------------------------------------------------------------------
// Timing of real shapes at 16 tokens (run with --gtest_also_run_disabled_tests; prints, asserts nothing on time).

// The slices of the GPU gather and activation passes: each row's n elements (H or I) covered exactly once by whole
// passes, no slice empty, as many slices as fit the warp target (the gather's and the activation's), and the
// kernel's per-slice count equal to the launcher's.
TEST(RowSlices, CoverEveryRowOnceWithoutEmptySlices) {
  using namespace detail;
  for (const int64_t target : {int64_t{4096}, int64_t{16384}}) {
    for (int n = 8; n <= 16384; n += 8) {
      const int passes = row_passes(n);
      ASSERT_GE(passes * kRowPass, n);
      ASSERT_LT((passes - 1) * kRowPass, n);
      for (int64_t rows : {int64_t{1}, int64_t{3}, int64_t{17}, int64_t{536}, int64_t{1144}, int64_t{4095},
                           int64_t{16384}, int64_t{200000}}) {
        const int64_t slices = row_slices(passes, rows, target);
        ASSERT_GE(slices, 1);
        ASSERT_LE(slices, passes);
        const int per = row_passes_per_slice(passes, static_cast<int>(slices));
        const int64_t wanted = std::min<int64_t>(passes, std::max<int64_t>(1, (target + rows - 1) / rows));
        EXPECT_LE(slices, wanted) << n << " " << rows << " " << target;
        if (per > 1) {  // per is the fewest passes per slice that fit in the wanted slices
          EXPECT_GT((passes + per - 2) / (per - 1), wanted) << n << " " << rows << " " << target;
        }
        // The kernels' ranges, slice by slice: [begin, end) back to back from 0 to n, none empty.
        int covered = 0;
        for (int64_t y = 0; y < slices; ++y) {
          const auto [begin, end] = row_slice_range(n, static_cast<int>(y), static_cast<int>(slices));
          ASSERT_EQ(end - begin, std::min(per * kRowPass, n - begin)) << n << " " << rows << " slice " << y;
          ASSERT_EQ(begin, covered) << n << " " << rows << " slice " << y;
          ASSERT_LT(begin, end) << n << " " << rows << " slice " << y;
          covered = end;
        }
        ASSERT_EQ(covered, n) << n << " " << rows << " " << target;
      }
    }
  }
  // Many rows: a warp per whole row; few rows: one slice per pass (mixtral's I = 14336 at T = 16; deepseek's H =
  // 7168 gathered at T = 16 and at T = 4096).
  EXPECT_EQ(row_slices(row_passes(14336), 40000, 16384), 1);
  EXPECT_EQ(row_slices(row_passes(14336), 536, 16384), 28);
  EXPECT_EQ(row_slices(row_passes(7168), 16, 4096), 14);
  EXPECT_EQ(row_slices(row_passes(7168), 4096, 4096), 1);
}

TEST(ExpertsReferenceTiming, DISABLED_PresetsAt16Tokens) {
  for (const char* name : {"qwen3-30b-a3b", "mixtral-8x7b"}) {
    const ExpertConfig c = find_preset(name).experts;
    Problem p = make_problem(c, 16, 1);
    for (int threads : {1, 2}) {
      const auto start = std::chrono::steady_clock::now();
      const std::vector<float> out = p.run(threads);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::printf("%s T=16 threads=%d: %.3f s\n", name, threads, s);
      EXPECT_EQ(out.size(), size_t{16} * c.hidden);
    }
  }
}

}  // namespace
}  // namespace moekit

// Fuzz target for moekit::experts_reference(): the expert config (sizes, shared experts, the local range of an
// expert-parallel rank, activation and its parameters, gate/up layout), the weights and optional biases, the plan's
// ids and weights, and the hidden and output views (sometimes one view: in place) are decoded from the input bytes,
// mostly valid, sometimes breaking one rule. Every call must either throw moekit::InvalidArgument naming the
// operation, or write the output that the contract of include/moekit/experts.h gives, computed here again in double
// from the formulas (within the output's bf16 rounding); an input the documented rules call valid must not be
// rejected.
//
// Values are small dyadic numbers (exact in bf16), so that the two computations differ by rounding only.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "experts_oracle.h"
#include "fuzz_targets.h"
#include "moekit/dtype.h"
#include "moekit/error.h"
#include "moekit/experts.h"
#include "moekit/plan.h"
#include "moekit/tensor.h"

namespace {

using namespace moekit;
using fuzz::Bytes;
using fuzz::require;
using fuzz::small_value;

struct Case {
  ExpertConfig cfg;
  int64_t tokens = 0;
  int plan_top_k = 0;  // the plan's K (normally cfg.top_k)
  int b13_kind = 0;    // 0 none, 1 fp32, 2 bf16, 3 int32
  int b2_kind = 0;
  bool w13_wrong = false, w2_wrong = false, hidden_wrong = false, out_fp32 = false;
  bool in_place = false;  // out is hidden itself (a copy of the hidden values)
  bool valid_by_contract = false;
};

Case decode_case(Bytes& in) {
  Case c;
  ExpertConfig& cfg = c.cfg;
  static const int kExperts[] = {1, 2, 3, 4, 5, 8, 0, 1025};
  cfg.num_experts = kExperts[in.chance(95) ? in.pick(6) : in.pick(8)];
  const int E = std::max(cfg.num_experts, 1);
  cfg.top_k = in.chance(95) ? 1 + in.pick(std::min(E, 4)) : in.pick(7) - 1;
  static const int kSizes[] = {8, 16, 24, 32, 0, 12, -8};
  cfg.hidden = kSizes[in.chance(95) ? in.pick(4) : in.pick(7)];
  cfg.intermediate = kSizes[in.chance(95) ? in.pick(4) : in.pick(7)];
  cfg.num_shared_experts = in.chance(60) ? 0 : (in.chance(95) ? 1 + in.pick(2) : (in.chance(50) ? -1 : 2147483647));
  if (in.chance(30)) {  // an expert-parallel rank's slice
    cfg.local_num_experts = in.pick(E + 1) - (in.chance(5) ? 2 : 0);
    cfg.local_expert_offset = in.pick(E) + (in.chance(5) ? E : 0);
  }
  cfg.activation = static_cast<Activation>(in.chance(97) ? in.pick(3) : 3 + in.pick(200));
  cfg.gate_up = static_cast<GateUpLayout>(in.chance(97) ? in.pick(3) : 3 + in.pick(200));
  static const ActivationParams kParams[] = {{},
                                             {1.0f, 0.0f, INFINITY},
                                             {2.0f, 0.5f, 1.5f},
                                             {1.702f, 1.0f, 0.0f},
                                             {NAN, 1.0f, 7.0f},
                                             {1.702f, INFINITY, 7.0f},
                                             {1.702f, 1.0f, NAN},
                                             {1.702f, 1.0f, -1.0f}};
  cfg.act = kParams[in.chance(90) ? in.pick(4) : in.pick(8)];
  cfg.routing_weight_on_input = in.chance(25);

  c.tokens = in.pick(12);
  c.plan_top_k = std::clamp(in.chance(97) ? cfg.top_k : cfg.top_k + 1, 1, E);
  c.b13_kind = in.chance(50) ? 0 : (in.chance(95) ? 1 + in.pick(2) : 3);
  c.b2_kind = in.chance(50) ? 0 : (in.chance(95) ? 1 + in.pick(2) : 3);
  c.w13_wrong = in.chance(3);
  c.w2_wrong = in.chance(3);
  c.hidden_wrong = in.chance(3);
  c.out_fp32 = in.chance(3);
  c.in_place = !c.hidden_wrong && !c.out_fp32 && in.chance(20);

  // The documented rules (include/moekit/experts.h), restated.
  const ExpertConfig& r = cfg;
  const bool local_ok = r.local_num_experts >= -1 && r.local_num_experts <= r.num_experts &&
                        r.local_expert_offset >= 0 && r.local_expert_offset < r.num_experts &&
                        r.local_expert_offset + r.local_experts() <= r.num_experts;
  const bool act_ok = r.activation != Activation::swiglu_clamped ||
                      (std::isfinite(r.act.alpha) && std::isfinite(r.act.beta) && r.act.limit > 0.0f);
  const bool config_ok = r.num_experts >= 1 && r.num_experts <= kMaxExperts && r.top_k >= 1 &&
                         r.top_k <= r.num_experts && r.hidden > 0 && r.hidden % 8 == 0 && r.intermediate > 0 &&
                         r.intermediate % 8 == 0 && r.num_shared_experts >= 0 &&
                         int64_t{r.top_k} + r.num_shared_experts <= kMaxSlots && local_ok &&
                         static_cast<int>(r.activation) < 3 && static_cast<int>(r.gate_up) < 3 && act_ok;
  c.valid_by_contract = config_ok && c.plan_top_k == r.top_k && c.b13_kind != 3 && c.b2_kind != 3 && !c.w13_wrong &&
                        !c.w2_wrong && !c.hidden_wrong && !c.out_fp32;
  return c;
}

std::string describe(const Case& c) {
  const ExpertConfig& r = c.cfg;
  return " (E " + std::to_string(r.num_experts) + ", K " + std::to_string(r.top_k) + ", H " +
         std::to_string(r.hidden) + ", I " + std::to_string(r.intermediate) + ", S " +
         std::to_string(r.num_shared_experts) + ", local " + std::to_string(r.local_num_experts) + " from " +
         std::to_string(r.local_expert_offset) + ", activation " + std::to_string(static_cast<int>(r.activation)) +
         " alpha " + std::to_string(r.act.alpha) + " beta " + std::to_string(r.act.beta) + " limit " +
         std::to_string(r.act.limit) + ", gate_up " + std::to_string(static_cast<int>(r.gate_up)) +
         (r.routing_weight_on_input ? ", weight on input" : "") + ", T " + std::to_string(c.tokens) + ", plan K " +
         std::to_string(c.plan_top_k) + ")";
}

void run_case(const Case& c, Bytes& in) {
  const ExpertConfig& cfg = c.cfg;
  const int64_t T = c.tokens;
  const int64_t H = std::max(cfg.hidden, 1), I = std::max(cfg.intermediate, 1);
  const int64_t Ew = std::clamp<int64_t>(int64_t{cfg.local_experts()} + std::clamp(cfg.num_shared_experts, 0, 2), 0,
                                         kMaxExperts + 3);  // E' of a valid config
  // Buffers hold what the correct views describe; a wrong view is smaller or of another dtype, never larger.
  // Buffers hold what the correct views describe; a wrong view is smaller or of another dtype, never larger.
  std::vector<uint16_t> w13 = fuzz::bf16_values(in, Ew * 2 * I * H), w2 = fuzz::bf16_values(in, Ew * H * I);
  std::vector<uint16_t> x = fuzz::bf16_values(in, T * H);
  std::vector<uint16_t> b13h = fuzz::bf16_values(in, Ew * 2 * I), b2h = fuzz::bf16_values(in, Ew * H);
  std::vector<float> b13f(b13h.size()), b2f(b2h.size());
  for (size_t i = 0; i < b13h.size(); ++i) b13f[i] = bf16_to_float(b13h[i]);
  for (size_t i = 0; i < b2h.size(); ++i) b2f[i] = bf16_to_float(b2h[i]);
  std::vector<uint16_t> out(static_cast<size_t>(std::max<int64_t>(T * H, 1)) * 2, 0x7fc0);  // room for an fp32 view
  if (c.in_place) std::copy(x.begin(), x.end(), out.begin());  // x stays the oracle's input
  try {
    ExpertWeights w;
    w.w13 = TensorView::contiguous(w13.data(), DType::bf16, {Ew, 2 * I, H - (c.w13_wrong ? 8 : 0)});
    w.w2 =
        TensorView::contiguous(w2.data(), c.w2_wrong ? DType::f32 : DType::bf16, {Ew, H, I / (c.w2_wrong ? 2 : 1)});
    auto bias_view = [](int kind, std::vector<float>& f, std::vector<uint16_t>& h, int64_t e, int64_t n) {
      if (kind == 1) return TensorView::contiguous(f.data(), DType::f32, {e, n});
      if (kind == 2) return TensorView::contiguous(h.data(), DType::bf16, {e, n});
      if (kind == 3) return TensorView::contiguous(f.data(), DType::i32, {e, n});
      return TensorView{};
    };
    w.b13 = bias_view(c.b13_kind, b13f, b13h, Ew, 2 * I);
    w.b2 = bias_view(c.b2_kind, b2f, b2h, Ew, H);
    const TensorView hidden = c.in_place
                                  ? TensorView::contiguous(out.data(), DType::bf16, {T, H})
                                  : TensorView::contiguous(x.data(), DType::bf16, {T, c.hidden_wrong ? H / 2 : H});
    const TensorView out_view = TensorView::contiguous(out.data(), c.out_fp32 ? DType::f32 : DType::bf16, {T, H});

    // A plan of T tokens: K distinct routed experts per token and the shared slots, weights from the input.
    const int E = std::max(cfg.num_experts, 1), K = c.plan_top_k;
    const int S = std::clamp(cfg.num_shared_experts, 0, 2), Kt = K + S;
    RoutePlan plan({.max_tokens = std::max<int64_t>(T, 1),
                    .num_experts = E,
                    .top_k = K,
                    .num_shared_experts = S,
                    .block = 1 + in.pick(8)},
                   Device::cpu());
    RoutePlanView& v = plan.mutable_view();
    for (int64_t t = 0; t < T; ++t) {
      std::vector<int32_t> pool(static_cast<size_t>(E));
      for (int e = 0; e < E; ++e) pool[static_cast<size_t>(e)] = e;
      for (int j = 0; j < Kt; ++j) {
        if (j < K) {
          std::swap(pool[static_cast<size_t>(j)], pool[static_cast<size_t>(j + in.pick(E - j))]);
          v.topk_ids[t * Kt + j] = pool[static_cast<size_t>(j)];
        } else {
          v.topk_ids[t * Kt + j] = E + j - K;
        }
        v.topk_weights[t * Kt + j] = small_value(in);
      }
    }
    build_plan_reference(T, v);

    experts_reference(cfg, w, hidden, plan.view(), out_view, 1 + in.pick(3));
    fuzz::accepted(fuzz::outcomes(fuzz::Target::experts), c.valid_by_contract, describe(c));

    // The contract in double (experts_oracle.h); the biases as the fp32 values the views hold.
    std::vector<double> want, bound;
    const fuzz::ContractCall call{.cfg = &cfg,
                                  .w13 = w13.data(),
                                  .w2 = w2.data(),
                                  .b13 = c.b13_kind == 0 ? nullptr : b13f.data(),
                                  .b2 = c.b2_kind == 0 ? nullptr : b2f.data(),
                                  .x = x.data(),
                                  .ids = v.topk_ids,
                                  .weights = v.topk_weights,
                                  .tokens = T};
    fuzz::contract_output(call, 4e-3, want, bound);
    for (int64_t i = 0; i < T * H; ++i) {
      const double got = bf16_to_float(out[i]);
      require(std::abs(got - want[i]) <= bound[i] + 1e-30,
              "out[" + std::to_string(i / H) + ", " + std::to_string(i % H) + "] = " + std::to_string(got) +
                  ", the contract gives " + std::to_string(want[i]) + describe(c));
    }
  } catch (const InvalidArgument& e) {
    fuzz::rejected(fuzz::outcomes(fuzz::Target::experts), c.valid_by_contract, e.what(), describe(c));
  }
}

}  // namespace

void moekit::fuzz::experts_input(const uint8_t* data, size_t size) {
  Bytes in(data, size);
  run_case(decode_case(in), in);
}

MOEKIT_FUZZ_ENTRY(experts_input)

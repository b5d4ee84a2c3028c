// The `reference` runner: the CPU oracle as a backend. execute() routes into a host RoutePlan sized at build time
// (route(), which runs the reference top-k and plan) and runs experts_reference(). It has one tactic per GEMM, so
// tuning it times a single configuration per bucket: there is nothing else to choose.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <optional>
#include <vector>

#include "moekit/error.h"
#include "moekit/layer.h"
#include "moekit/plan.h"
#include "runtime/runners.h"
#include "runtime/synthetic.h"

namespace moekit::detail {
namespace {

// Plan block size: the reference walks rows one by one, so the smallest padding is the cheapest.
constexpr int kReferenceBlock = 1;

const std::array<Tactic, 1> kGemm1Tactics{{{"fp32_rows", "fp32 dot products row by row (CPU reference)"}}};
const std::array<Tactic, 1> kGemm2Tactics{{{"fp32_rows", "fp32 dot products row by row (CPU reference)"}}};

class ReferenceRunner final : public Runner {
 public:
  std::string_view name() const override { return "reference"; }
  std::string_view version() const override { return "1"; }
  std::span<const Tactic> gemm1_tactics() const override { return kGemm1Tactics; }
  std::span<const Tactic> gemm2_tactics() const override { return kGemm2Tactics; }

 protected:
  Support do_check_support(const LayerSpec& spec, Device device) override {
    if (!device.is_cpu()) return Support::no(fmt::format("runs on the CPU only (device {})", device_name(device)));
    if (spec.quant.weight_format != WeightFormat::bf16)
      return Support::no(fmt::format("weight_format ({}) is not supported (bf16 only)",
                                     weight_format_name(spec.quant.weight_format)));
    if (spec.quant.activation_format != ActivationFormat::bf16)
      return Support::no(fmt::format("activation_format ({}) is not supported (bf16 only)",
                                     activation_format_name(spec.quant.activation_format)));
    return Support::yes();
  }

  void do_build(const LayerWeights& weights, int64_t max_tokens) override {
    const ExpertConfig& e = spec().experts;
    weights_ = weights;
    plan_.emplace(PlanShape{max_tokens, e.num_experts, e.top_k, e.num_shared_experts, kReferenceBlock},
                  Device::cpu());
    timing_hidden_.clear();
    timing_logits_.clear();
    timing_out_.clear();
  }

  LayerWeights make_synthetic_weights(uint64_t seed) override {
    const ExpertConfig& e = spec().experts;
    const int64_t ew = e.weight_experts(), h = e.hidden, i = e.intermediate;
    // Scales keep activations O(1) through both GEMMs, like trained weights.
    w13_.resize(static_cast<size_t>(ew * 2 * i * h));
    w2_.resize(static_cast<size_t>(ew * h * i));
    fill_uniform_bf16(w13_, seed, 1.0f / std::sqrt(static_cast<float>(h)));
    fill_uniform_bf16(w2_, seed + 1, 1.0f / std::sqrt(static_cast<float>(i)));
    LayerWeights w;
    w.experts.w13 = TensorView::contiguous(w13_.data(), DType::bf16, {ew, 2 * i, h});
    w.experts.w2 = TensorView::contiguous(w2_.data(), DType::bf16, {ew, h, i});
    if (spec().expert_biases) {
      b13_.resize(static_cast<size_t>(ew * 2 * i));
      b2_.resize(static_cast<size_t>(ew * h));
      fill_uniform_f32(b13_, seed + 2, 0.1f);
      fill_uniform_f32(b2_, seed + 3, 0.1f);
      w.experts.b13 = TensorView::contiguous(b13_.data(), DType::f32, {ew, 2 * i});
      w.experts.b2 = TensorView::contiguous(b2_.data(), DType::f32, {ew, h});
    }
    if (spec().routing_bias) {
      routing_bias_.resize(static_cast<size_t>(e.num_experts));
      const SyntheticStream bias = synthetic_routing_bias(seed);
      fill_uniform_f32(routing_bias_, bias.seed, bias.scale);
      w.routing_bias = TensorView::contiguous(routing_bias_.data(), DType::f32, {e.num_experts});
    }
    return w;
  }

  void do_execute(const LayerInputs& in, const TacticPair&, Stream stream) override {
    route(spec().routing, in.logits, weights_.routing_bias, *plan_, stream, in.replay);
    experts_reference(spec().experts, weights_.experts, in.hidden, plan_->view(), in.out);
  }

  // One run on the timing inputs; CPU runs are long enough that one sample is stable to a few percent.
  double do_time_tactics(const TacticPair& tactics, int64_t tokens) override {
    const int64_t h = spec().experts.hidden, e = spec().routing.num_experts;
    ensure_timing_inputs();
    LayerInputs in;
    in.hidden = TensorView::contiguous(timing_hidden_.data(), DType::bf16, {tokens, h});
    in.logits = TensorView::contiguous(timing_logits_.data(), DType::f32, {tokens, e});
    in.out = TensorView::contiguous(timing_out_.data(), DType::bf16, {tokens, h});
    const auto start = std::chrono::steady_clock::now();
    do_execute(in, tactics, nullptr);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  // The caller's rows, converted to fp32 (the reference routes bf16 logits through the same conversion), repeated
  // to fill max_tokens rows; or the synthetic logits again.
  void do_set_timing_logits(const TensorView& logits) override {
    ensure_timing_inputs();
    const int64_t e = spec().routing.num_experts, cap = max_tokens();
    if (!logits.present()) return fill_uniform_f32(timing_logits_, kTimingLogits.seed, kTimingLogits.scale);
    const int64_t n = std::min(logits.shape[0], cap);
    for (int64_t r = 0; r < cap; ++r)
      for (int64_t j = 0; j < e; ++j) {
        const int64_t at = (r % n) * logits.stride(0) + j;
        timing_logits_[static_cast<size_t>(r * e + j)] =
            logits.dtype == DType::f32 ? logits.as<float>()[at] : bf16_to_float(logits.as<uint16_t>()[at]);
      }
  }

 private:
  // Hidden states, logits (synthetic until set_timing_logits()) and outputs for max_tokens tokens; allocated on the
  // first timing after a build.
  void ensure_timing_inputs() {
    if (!timing_hidden_.empty()) return;
    const int64_t h = spec().experts.hidden, e = spec().routing.num_experts, cap = max_tokens();
    timing_hidden_.resize(static_cast<size_t>(cap * h));
    timing_logits_.resize(static_cast<size_t>(cap * e));
    timing_out_.resize(static_cast<size_t>(cap * h));
    fill_uniform_bf16(timing_hidden_, kTimingHidden.seed, kTimingHidden.scale);
    fill_uniform_f32(timing_logits_, kTimingLogits.seed, kTimingLogits.scale);
  }

  LayerWeights weights_{};
  std::optional<RoutePlan> plan_;
  // Synthetic weights (build_synthetic) and timing inputs, owned here.
  std::vector<uint16_t> w13_, w2_;
  std::vector<float> b13_, b2_, routing_bias_;
  std::vector<uint16_t> timing_hidden_, timing_out_;
  std::vector<float> timing_logits_;
};

}  // namespace

std::unique_ptr<Runner> make_reference_runner() {
  return std::make_unique<ReferenceRunner>();
}

}  // namespace moekit::detail

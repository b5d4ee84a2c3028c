// The runner lifecycle every backend shares: check_support -> build (idempotent) -> execute / time_tactics.
// The public members check the order and the arguments, then call the runner's do_* hooks, so a runner cannot
// forget a check and every backend reports a broken order with the same words.
#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "moekit/error.h"
#include "moekit/layer.h"

namespace moekit {
namespace {

bool same_view(const TensorView& a, const TensorView& b) {
  return a.data == b.data && a.dtype == b.dtype && a.device == b.device && a.ndim == b.ndim && a.shape == b.shape &&
         a.strides == b.strides;
}

bool same_weights(const LayerWeights& a, const LayerWeights& b) {
  return same_view(a.experts.w13, b.experts.w13) && same_view(a.experts.w2, b.experts.w2) &&
         same_view(a.experts.b13, b.experts.b13) && same_view(a.experts.b2, b.experts.b2) &&
         same_view(a.routing_bias, b.routing_bias);
}

// The weights must match what the spec promised the runner (and the tuner key): bias presence, bias shapes.
void check_weights(const LayerSpec& spec, const LayerWeights& w, Device device) {
  if (spec.quant.weight_format == WeightFormat::bf16) validate_expert_weights(spec.experts, w.experts, device);
  const bool has_expert_biases = w.experts.b13.present() || w.experts.b2.present();
  if (has_expert_biases != spec.expert_biases)
    throw InvalidArgument("layer", fmt::format("expert biases present in the weights ({}) must match "
                                               "spec.expert_biases ({})",
                                               has_expert_biases, spec.expert_biases));
  const TensorView& bias = w.routing_bias;
  if (bias.present() != spec.routing_bias)
    throw InvalidArgument("layer", fmt::format("routing_bias present in the weights ({}) must match "
                                               "spec.routing_bias ({})",
                                               bias.present(), spec.routing_bias));
  if (!bias.present()) return;
  const int e = spec.routing.num_experts;
  if (bias.ndim != 1 || bias.shape[0] != e || (bias.dtype != DType::f32 && bias.dtype != DType::bf16))
    throw InvalidArgument("layer", fmt::format("routing_bias must be a 1-D [E] fp32 or bf16 tensor with E = "
                                               "num_experts ({}), got {}",
                                               e, bias.describe()));
  if (!bias.is_contiguous())
    throw InvalidArgument("layer", fmt::format("routing_bias ({}) must be contiguous", bias.describe()));
  if (bias.device != device)
    throw InvalidArgument("layer", fmt::format("routing_bias.device ({}) must be the layer device ({})",
                                               device_name(bias.device), device_name(device)));
  if (bias.data == nullptr) throw InvalidArgument("layer", "routing_bias.data (null) must be non-null");
  if (!bias.starts_aligned(dtype_size(bias.dtype)))
    throw InvalidArgument(
        "layer", fmt::format("routing_bias.data ({:#x}) must be {}-byte aligned (its {} elements)",
                             reinterpret_cast<uintptr_t>(bias.data), dtype_size(bias.dtype), dtype_name(bias.dtype)));
}

}  // namespace

void Runner::fail_step(std::string_view step, std::string_view missing) const {
  if (checked_ && !supported_ && missing == "check_support()")
    throw NotSupported(
        "layer", fmt::format("runner '{}': {} called after check_support() failed ({})", name(), step, reason_));
  throw InvalidArgument("layer", fmt::format("runner '{}': {} called before {}", name(), step, missing));
}

void Runner::require_built(std::string_view step) const {
  if (!supported_) fail_step(step, "check_support()");
  if (!built_) fail_step(step, "build()");
}

Support Runner::check_support(const LayerSpec& spec, Device device) {
  spec.validate();
  // Any new check undoes the build: the workspace was sized and laid out for the previous spec.
  built_ = false;
  max_tokens_ = 0;
  built_weights_ = {};
  checked_ = false;
  supported_ = false;
  Support s = do_check_support(spec, device);
  if (!s.ok && s.reason.empty())
    throw Internal("layer", fmt::format("runner '{}' declined the layer without a reason", name()));
  spec_ = spec;
  device_ = device;
  checked_ = true;
  supported_ = s.ok;
  reason_ = s.ok ? std::string() : s.reason;
  if (s.ok && (gemm1_tactics().empty() || gemm2_tactics().empty()))
    throw Internal("layer", fmt::format("runner '{}' supports the layer but lists no tactics ({} GEMM1, {} GEMM2)",
                                        name(), gemm1_tactics().size(), gemm2_tactics().size()));
  // The tuning cache stores tactics by name: each name must pick one tactic of its list.
  if (s.ok)
    for (const auto& [list, tactics] : {std::pair{"GEMM1", gemm1_tactics()}, {"GEMM2", gemm2_tactics()}})
      for (size_t i = 0; i < tactics.size(); ++i) {
        if (tactics[i].name.empty())
          throw Internal("layer", fmt::format("runner '{}': {} tactic {} has no name", name(), list, i));
        for (size_t j = 0; j < i; ++j)
          if (tactics[j].name == tactics[i].name)
            throw Internal("layer", fmt::format("runner '{}': {} tactics {} and {} share the name '{}'", name(), list,
                                                j, i, tactics[i].name));
      }
  return s;
}

void Runner::build(const LayerWeights& weights, int64_t max_tokens) {
  if (!supported_) fail_step("build()", "check_support()");
  if (max_tokens < 1) throw InvalidArgument("layer", fmt::format("max_tokens ({}) must be >= 1", max_tokens));
  if (built_ && max_tokens == max_tokens_ && same_weights(weights, built_weights_)) return;
  check_weights(spec_, weights, device_);
  built_ = false;
  do_build(weights, max_tokens);
  built_ = true;
  max_tokens_ = max_tokens;
  built_weights_ = weights;
}

void Runner::build_synthetic(int64_t max_tokens, uint64_t seed) {
  if (!supported_) fail_step("build_synthetic()", "check_support()");
  if (max_tokens < 1) throw InvalidArgument("layer", fmt::format("max_tokens ({}) must be >= 1", max_tokens));
  built_ = false;
  LayerWeights w = make_synthetic_weights(seed);
  check_weights(spec_, w, device_);
  do_build(w, max_tokens);
  built_ = true;
  max_tokens_ = max_tokens;
  built_weights_ = w;
}

void Runner::execute(const LayerInputs& inputs, const TacticPair& tactics, Stream stream) {
  require_built("execute()");
  validate_layer_inputs(spec_, inputs, max_tokens_, device_);
  const int n1 = static_cast<int>(gemm1_tactics().size());
  const int n2 = static_cast<int>(gemm2_tactics().size());
  if (tactics.gemm1 < 0 || tactics.gemm1 >= n1)
    throw InvalidArgument(
        "layer", fmt::format("runner '{}': tactics.gemm1 ({}) must be in [0, {})", name(), tactics.gemm1, n1));
  if (tactics.gemm2 < 0 || tactics.gemm2 >= n2)
    throw InvalidArgument(
        "layer", fmt::format("runner '{}': tactics.gemm2 ({}) must be in [0, {})", name(), tactics.gemm2, n2));
  if (inputs.hidden.shape[0] == 0) return;
  do_execute(inputs, tactics, stream);
}

// The arguments of one timing: tokens in [1, max_tokens], tactics in range; `what` names the pair in errors.
void Runner::check_timing_args(std::string_view what, const TacticPair& tactics, int64_t tokens) const {
  if (tokens < 1 || tokens > max_tokens_)
    throw InvalidArgument("layer", fmt::format("runner '{}': tokens ({}) must be in [1, max_tokens ({})]", name(),
                                               tokens, max_tokens_));
  const int n1 = static_cast<int>(gemm1_tactics().size());
  const int n2 = static_cast<int>(gemm2_tactics().size());
  if (tactics.gemm1 < 0 || tactics.gemm1 >= n1 || tactics.gemm2 < 0 || tactics.gemm2 >= n2)
    throw InvalidArgument("layer", fmt::format("runner '{}': {} ({}, {}) must be in [0, {}) x [0, {})", name(), what,
                                               tactics.gemm1, tactics.gemm2, n1, n2));
}

double Runner::time_tactics(const TacticPair& tactics, int64_t tokens) {
  require_built("time_tactics()");
  check_timing_args("tactics", tactics, tokens);
  const double seconds = do_time_tactics(tactics, tokens);
  if (!(std::isfinite(seconds) && seconds > 0))
    throw Internal("layer",
                   fmt::format("runner '{}': timing tactics ({}, {}) on {} tokens gave {} seconds, which must be "
                               "finite and > 0",
                               name(), tactics.gemm1, tactics.gemm2, tokens, seconds));
  return seconds;
}

std::vector<double> Runner::time_schedule(std::span<const TacticPair> order, int64_t tokens,
                                          const std::function<void()>& on_timed) {
  require_built("time_schedule()");
  for (size_t i = 0; i < order.size(); ++i) check_timing_args(fmt::format("order[{}]", i), order[i], tokens);
  if (order.empty()) return {};
  std::vector<double> seconds = do_time_schedule(order, tokens, on_timed);
  if (seconds.size() != order.size())
    throw Internal("layer", fmt::format("runner '{}': timing a schedule of {} entries gave {} timings", name(),
                                        order.size(), seconds.size()));
  for (size_t i = 0; i < order.size(); ++i)
    if (!(std::isfinite(seconds[i]) && seconds[i] > 0))
      throw Internal("layer",
                     fmt::format("runner '{}': timing order[{}] ({}, {}) on {} tokens gave {} seconds, which "
                                 "must be finite and > 0",
                                 name(), i, order[i].gemm1, order[i].gemm2, tokens, seconds[i]));
  return seconds;
}

std::vector<double> Runner::do_time_schedule(std::span<const TacticPair> order, int64_t tokens,
                                             const std::function<void()>& on_timed) {
  std::vector<double> seconds;
  seconds.reserve(order.size());
  for (const TacticPair& p : order) {
    seconds.push_back(do_time_tactics(p, tokens));
    if (on_timed) on_timed();
  }
  return seconds;
}

void Runner::set_timing_logits(const TensorView& logits) {
  require_built("set_timing_logits()");
  if (logits.present()) {
    validate_route_args(spec_.routing, logits, {}, {}, std::numeric_limits<int64_t>::max(), device_);
    if (logits.shape[0] < 1)
      throw InvalidArgument("layer", fmt::format("runner '{}': timing logits ({}) must have at least one row", name(),
                                                 logits.describe()));
  }
  do_set_timing_logits(logits);
}

TacticPair Runner::default_tactics(int64_t tokens) const {
  if (!supported_) fail_step("default_tactics()", "check_support()");
  TacticPair p = do_default_tactics(tokens);
  if (p.gemm1 < 0 || p.gemm1 >= static_cast<int>(gemm1_tactics().size()) || p.gemm2 < 0 ||
      p.gemm2 >= static_cast<int>(gemm2_tactics().size()))
    throw Internal("layer",
                   fmt::format("runner '{}': default tactics ({}, {}) are out of range", name(), p.gemm1, p.gemm2));
  return p;
}

TacticPair Runner::do_default_tactics(int64_t) const {
  return {0, 0};
}

}  // namespace moekit

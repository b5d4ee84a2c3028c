// Expert-compute validation (op "experts"): activation and gate/up layout names, ExpertConfig limits, and the
// shapes, dtypes, contiguity and devices of expert weights. Every backend calls these same checks, so CPU and GPU
// reject the same inputs with the same words; each message names the argument, its value and the rule.
#include <fmt/format.h>

#include <array>
#include <cmath>
#include <string>
#include <utility>

#include "experts/internal.h"
#include "moekit/error.h"
#include "moekit/experts.h"
#include "moekit/routing.h"

namespace moekit {
namespace {

constexpr std::array<std::pair<Activation, std::string_view>, 3> kActivations{{
    {Activation::silu_gated, "silu_gated"},
    {Activation::swiglu_clamped, "swiglu_clamped"},
    {Activation::gelu_gated, "gelu_gated"},
}};

constexpr std::array<std::pair<GateUpLayout, std::string_view>, 3> kLayouts{{
    {GateUpLayout::gate_first, "gate_first"},
    {GateUpLayout::up_first, "up_first"},
    {GateUpLayout::interleaved, "interleaved"},
}};

template <class Enum, size_t N>
std::string_view name_of(const std::array<std::pair<Enum, std::string_view>, N>& table, Enum v) {
  for (const auto& [e, n] : table)
    if (e == v) return n;
  return "unknown";
}

template <class Enum, size_t N>
Enum parse_name(const std::array<std::pair<Enum, std::string_view>, N>& table, std::string_view name,
                std::string_view what) {
  std::string valid;
  for (const auto& [e, n] : table) {
    if (n == name) return e;
    valid += (valid.empty() ? "" : ", ") + std::string(n);
  }
  throw InvalidArgument("experts", fmt::format("unknown {} '{}' (expected one of: {})", what, name, valid));
}

using detail::fail_experts;

std::string shape_string(std::initializer_list<int64_t> dims) {
  std::string s = "[";
  for (int64_t d : dims) s += (s.size() > 1 ? ", " : "") + std::to_string(d);
  return s + "]";
}

}  // namespace

namespace detail {

void fail_experts(const std::string& message) {
  throw InvalidArgument("experts", message);
}

void check_expert_tensor(const TensorView& t, std::string_view name, std::string_view symbols,
                         std::initializer_list<int64_t> dims, bool allow_fp32, Device device) {
  const std::string expected = shape_string(dims);
  if (!t.present()) fail_experts(fmt::format("{} (absent) must be {} = {}", name, symbols, expected));
  bool shape_ok = t.ndim == static_cast<int>(dims.size());
  int d = 0;
  for (int64_t e : dims) shape_ok = shape_ok && t.shape[d++] == e;
  if (!shape_ok) fail_experts(fmt::format("{} ({}) must be {} = {}", name, t.describe(), symbols, expected));
  if (!(t.dtype == DType::bf16 || (allow_fp32 && t.dtype == DType::f32)))
    fail_experts(fmt::format("{} ({}) must be {}", name, t.describe(), allow_fp32 ? "fp32 or bf16" : "bf16"));
  if (!t.is_contiguous()) fail_experts(fmt::format("{} ({}) must be contiguous", name, t.describe()));
  if (t.numel() > 0 && t.data == nullptr) fail_experts(fmt::format("{} ({}) must not be null", name, t.describe()));
  if (!(t.device == device))
    fail_experts(fmt::format("{} ({}) must be on {}", name, t.describe(), device_name(device)));
}

}  // namespace detail

std::string_view activation_name(Activation a) {
  return name_of(kActivations, a);
}
Activation parse_activation(std::string_view name) {
  return parse_name(kActivations, name, "activation");
}
std::string_view gate_up_layout_name(GateUpLayout l) {
  return name_of(kLayouts, l);
}
GateUpLayout parse_gate_up_layout(std::string_view name) {
  return parse_name(kLayouts, name, "gate_up layout");
}

void ExpertConfig::validate() const {
  if (num_experts < 1 || num_experts > kMaxExperts)
    fail_experts(fmt::format("num_experts ({}) must be in 1..{}", num_experts, kMaxExperts));
  if (top_k < 1) fail_experts(fmt::format("top_k ({}) must be >= 1", top_k));
  if (top_k > num_experts) fail_experts(fmt::format("top_k ({}) must be <= num_experts ({})", top_k, num_experts));
  if (hidden <= 0 || hidden % 8 != 0)
    fail_experts(fmt::format("hidden ({}) must be a positive multiple of 8", hidden));
  if (intermediate <= 0 || intermediate % 8 != 0)
    fail_experts(fmt::format("intermediate ({}) must be a positive multiple of 8", intermediate));
  if (num_shared_experts < 0) fail_experts(fmt::format("num_shared_experts ({}) must be >= 0", num_shared_experts));
  if (top_k > kMaxSlots - num_shared_experts)  // not top_k + S: a huge S would overflow the sum
    fail_experts(
        fmt::format("top_k + num_shared_experts ({}) must be <= {}", int64_t{top_k} + num_shared_experts, kMaxSlots));
  if (local_num_experts < -1 || local_num_experts > num_experts)
    fail_experts(fmt::format("local_num_experts ({}) must be -1 or in 0..{}", local_num_experts, num_experts));
  if (local_expert_offset < 0 || local_expert_offset >= num_experts)
    fail_experts(fmt::format("local_expert_offset ({}) must be in 0..{}", local_expert_offset, num_experts - 1));
  if (local_expert_offset + local_experts() > num_experts)
    fail_experts(fmt::format("local_expert_offset + local experts ({} + {}) must be <= num_experts ({})",
                             local_expert_offset, local_experts(), num_experts));
  if (name_of(kActivations, activation) == "unknown")
    fail_experts(fmt::format("activation ({}) must be a known activation", static_cast<int>(activation)));
  if (activation == Activation::swiglu_clamped) {  // the others ignore act
    if (!std::isfinite(act.alpha) || !std::isfinite(act.beta))
      fail_experts(
          fmt::format("act.alpha ({}) and act.beta ({}) must be finite for swiglu_clamped", act.alpha, act.beta));
    if (!(act.limit > 0.0f))
      fail_experts(fmt::format("act.limit ({}) must be > 0 for swiglu_clamped (+inf: no clamp)", act.limit));
  }
  if (name_of(kLayouts, gate_up) == "unknown")
    fail_experts(fmt::format("gate_up ({}) must be a known gate/up layout", static_cast<int>(gate_up)));
}

void validate_expert_weights(const ExpertConfig& cfg, const ExpertWeights& w, Device device) {
  cfg.validate();
  const int64_t e = cfg.weight_experts(), h = cfg.hidden, i = cfg.intermediate;
  detail::check_expert_tensor(w.w13, "w13", "[E', 2I, H]", {e, 2 * i, h}, false, device);
  detail::check_expert_tensor(w.w2, "w2", "[E', H, I]", {e, h, i}, false, device);
  if (w.b13.present()) detail::check_expert_tensor(w.b13, "b13", "[E', 2I]", {e, 2 * i}, true, device);
  if (w.b2.present()) detail::check_expert_tensor(w.b2, "b2", "[E', H]", {e, h}, true, device);
}

}  // namespace moekit

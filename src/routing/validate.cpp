// Routing method names and the one validation every routing backend shares (DESIGN §3, §8): the limits of a
// RoutingConfig and the shapes, dtypes, strides and devices of one call's tensors. Each rule throws
// InvalidArgument("route", "<arg> (<value>) must be <rule>") so the CPU and GPU paths reject the same inputs
// with the same words.
#include <fmt/format.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#include "core/in_place.h"
#include "moekit/error.h"
#include "moekit/routing.h"

namespace moekit {
namespace {

constexpr std::array<std::pair<RoutingMethod, std::string_view>, 5> kMethodNames{{
    {RoutingMethod::softmax_topk, "softmax_topk"},
    {RoutingMethod::topk_softmax, "topk_softmax"},
    {RoutingMethod::sigmoid_grouped, "sigmoid_grouped"},
    {RoutingMethod::llama4, "llama4"},
    {RoutingMethod::pre_scored, "pre_scored"},
}};

// Replay ids are int16, so every routed id (< E) must fit.
constexpr int kMaxReplayExperts = 32768;

[[noreturn]] void fail(const std::string& message) {
  throw InvalidArgument("route", message);
}

bool is_float_input(DType t) {
  return t == DType::f32 || t == DType::bf16;
}

void check_device(const char* name, const TensorView& v, Device device) {
  if (v.device != device)
    fail(fmt::format("{}.device ({}) must be the routing device ({})", name, device_name(v.device),
                     device_name(device)));
}

// Non-null where the view has elements, and aligned to its element size: the router and the reference read and
// write elements in place, and a misaligned access faults on the GPU (which loses the context) and is undefined on
// the CPU.
void check_data(const char* name, const TensorView& v) {
  if (v.numel() > 0 && v.data == nullptr) fail(fmt::format("{}.data (null) must be non-null", name));
  if (!v.starts_aligned(dtype_size(v.dtype)))
    fail(fmt::format("{}.data ({:#x}) must be {}-byte aligned (its {} elements)", name,
                     reinterpret_cast<uintptr_t>(v.data), dtype_size(v.dtype), dtype_name(v.dtype)));
}

void validate_bias(const RoutingConfig& cfg, const TensorView& bias, Device device) {
  if (bias.ndim != 1 || bias.shape[0] != cfg.num_experts)
    fail(fmt::format("bias must be 1-D [E] with E = num_experts ({}), got {}", cfg.num_experts, bias.describe()));
  if (!is_float_input(bias.dtype)) fail(fmt::format("bias dtype ({}) must be fp32 or bf16", dtype_name(bias.dtype)));
  if (!bias.is_contiguous()) fail(fmt::format("bias.stride[0] ({}) must be 1", bias.stride(0)));
  check_device("bias", bias, device);
  check_data("bias", bias);
}

void validate_replay(const RoutingConfig& cfg, const TensorView& replay, int64_t tokens, Device device) {
  if (replay.ndim != 2)
    fail(fmt::format("replay must be 2-D [R, K] with K = top_k ({}), got {}", cfg.top_k, replay.describe()));
  if (replay.dtype != DType::i16) fail(fmt::format("replay dtype ({}) must be int16", dtype_name(replay.dtype)));
  if (replay.shape[1] != cfg.top_k)
    fail(fmt::format("replay.shape[1] ({}) must equal top_k ({})", replay.shape[1], cfg.top_k));
  if (replay.shape[0] < tokens) fail(fmt::format("replay rows ({}) must be >= tokens ({})", replay.shape[0], tokens));
  if (!replay.is_contiguous())
    fail(fmt::format("replay strides ([{}, {}]) must be contiguous ([{}, 1])", replay.stride(0), replay.stride(1),
                     cfg.top_k));
  check_device("replay", replay, device);
  check_data("replay", replay);
  // Unreachable while kMaxExperts <= 1024, kept so the rule stays enforced if that limit grows.
  if (cfg.num_experts >= kMaxReplayExperts)
    fail(fmt::format("num_experts ({}) must be < {} when replay is given (replay ids are int16)", cfg.num_experts,
                     kMaxReplayExperts));
}

}  // namespace

std::string_view routing_method_name(RoutingMethod m) {
  for (const auto& [method, name] : kMethodNames)
    if (method == m) return name;
  return "unknown";
}

RoutingMethod parse_routing_method(std::string_view name) {
  std::string valid;
  for (const auto& [method, n] : kMethodNames) {
    if (n == name) return method;
    valid += (valid.empty() ? "" : ", ") + std::string(n);
  }
  fail(fmt::format("unknown routing method '{}' (expected one of: {})", name, valid));
}

void RoutingConfig::validate() const {
  const int e = num_experts;
  const int k = top_k;
  const int s = num_shared_experts;
  if (routing_method_name(method) == "unknown")
    fail(fmt::format("method ({}) must be a known routing method", static_cast<int>(method)));
  if (e < 1 || e > kMaxExperts) fail(fmt::format("num_experts ({}) must be in [1, {}]", e, kMaxExperts));
  if (k < 1) fail(fmt::format("top_k ({}) must be >= 1", k));
  if (k > e) fail(fmt::format("top_k ({}) must be <= num_experts ({})", k, e));
  if (k > kMaxSlots) fail(fmt::format("top_k ({}) must be <= {}", k, kMaxSlots));
  if (s < 0) fail(fmt::format("num_shared_experts ({}) must be >= 0", s));
  // Written as k > kMaxSlots - s so that a huge S cannot overflow the sum.
  if (k > kMaxSlots - s)
    fail(fmt::format("top_k + num_shared_experts ({}) must be <= {}", static_cast<int64_t>(k) + s, kMaxSlots));
  if (n_group < 1) fail(fmt::format("n_group ({}) must be >= 1", n_group));
  if (n_group != 1 && method != RoutingMethod::sigmoid_grouped)
    fail(fmt::format("n_group ({}) must be 1 for routing method {} (only sigmoid_grouped uses groups)", n_group,
                     routing_method_name(method)));
  if (e % n_group != 0) fail(fmt::format("n_group ({}) must divide num_experts ({})", n_group, e));
  if (topk_group < 1 || topk_group > n_group)
    fail(fmt::format("topk_group ({}) must be in [1, n_group ({})]", topk_group, n_group));
  const int kept_experts = topk_group * (e / n_group);
  if (k > kept_experts)
    fail(
        fmt::format("top_k ({}) must be <= the experts in the kept groups, topk_group * num_experts / n_group "
                    "({} * {} / {} = {})",
                    k, topk_group, e, n_group, kept_experts));
  if (method == RoutingMethod::llama4 && k != 1)
    fail(fmt::format("top_k ({}) must be 1 for routing method llama4", k));
  if (!std::isfinite(routed_scaling_factor) || !(routed_scaling_factor > 0.0f))
    fail(fmt::format("routed_scaling_factor ({}) must be finite and > 0", routed_scaling_factor));
}

void validate_route_args(const RoutingConfig& cfg, const TensorView& logits, const TensorView& bias,
                         const TensorView& replay, int64_t max_tokens, Device device) {
  cfg.validate();
  const int e = cfg.num_experts;
  if (logits.ndim != 2) fail(fmt::format("logits must be 2-D [T, E], got {}", logits.describe()));
  if (!is_float_input(logits.dtype))
    fail(fmt::format("logits dtype ({}) must be fp32 or bf16", dtype_name(logits.dtype)));
  if (logits.shape[0] < 0) fail(fmt::format("logits.shape[0] ({}) must be >= 0", logits.shape[0]));
  if (logits.shape[1] != e) fail(fmt::format("logits.shape[1] ({}) must equal num_experts ({})", logits.shape[1], e));
  if (logits.stride(1) != 1) fail(fmt::format("logits.stride[1] ({}) must be 1", logits.stride(1)));
  if (logits.stride(0) < e)
    fail(fmt::format("logits.stride[0] ({}) must be >= num_experts ({})", logits.stride(0), e));
  check_device("logits", logits, device);
  check_data("logits", logits);
  const int64_t tokens = logits.shape[0];
  if (tokens > max_tokens) fail(fmt::format("tokens ({}) must be <= max_tokens ({})", tokens, max_tokens));
  if (bias.present()) validate_bias(cfg, bias, device);
  if (replay.present()) {
    validate_replay(cfg, replay, tokens, device);
    // The router writes replay while it reads logits and bias: a shared byte would change what it reads.
    for (const auto& [name, v] : {std::pair{"logits", &logits}, std::pair{"bias", &bias}})
      if (std::string why = detail::shared_bytes_problem(replay, "replay", *v, name); !why.empty()) fail(why);
  }
}

}  // namespace moekit

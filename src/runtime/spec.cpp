// Layer configuration checks shared by every runner: quantization format names and rules, the agreement between
// the routing and expert configs, and one forward call's tensors. Errors name the field, its value and the rule.
#include <fmt/format.h>

#include <array>
#include <string>
#include <utility>

#include "core/in_place.h"
#include "moekit/error.h"
#include "moekit/layer.h"

namespace moekit {
namespace {

constexpr std::array<std::pair<WeightFormat, std::string_view>, 6> kWeightFormats{{
    {WeightFormat::bf16, "bf16"},
    {WeightFormat::fp8_e4m3_block, "fp8_e4m3_block"},
    {WeightFormat::fp8_e4m3_tensor, "fp8_e4m3_tensor"},
    {WeightFormat::fp8_e4m3_channel, "fp8_e4m3_channel"},
    {WeightFormat::int4_group, "int4_group"},
    {WeightFormat::mxfp4, "mxfp4"},
}};
constexpr std::array<std::pair<ActivationFormat, std::string_view>, 3> kActivationFormats{{
    {ActivationFormat::bf16, "bf16"},
    {ActivationFormat::fp8_e4m3_token_block, "fp8_e4m3_token_block"},
    {ActivationFormat::fp8_e4m3_tensor, "fp8_e4m3_tensor"},
}};

template <class Enum, size_t N>
std::string_view name_of(const std::array<std::pair<Enum, std::string_view>, N>& table, Enum v) {
  for (const auto& [e, name] : table)
    if (e == v) return name;
  return "unknown";
}

template <class Enum, size_t N>
Enum parse_name(const std::array<std::pair<Enum, std::string_view>, N>& table, std::string_view name,
                std::string_view what) {
  std::string names;
  for (const auto& [e, n] : table) {
    if (n == name) return e;
    names += (names.empty() ? "" : ", ") + std::string(n);
  }
  throw InvalidArgument("quant", fmt::format("unknown {} '{}' (expected one of: {})", what, name, names));
}

bool is_fp8_weight(WeightFormat f) {
  return f == WeightFormat::fp8_e4m3_block || f == WeightFormat::fp8_e4m3_tensor ||
         f == WeightFormat::fp8_e4m3_channel;
}

void check_block(std::string_view field, int value) {
  const bool power_of_two = value > 0 && (value & (value - 1)) == 0;
  if (!power_of_two || value < 16 || value > 1024)
    throw InvalidArgument("quant", fmt::format("{} ({}) must be a power of 2 in 16..1024", field, value));
}

[[noreturn]] void fail(const std::string& message) {
  throw InvalidArgument("layer", message);
}

// hidden/out: [T, H] bf16, contiguous, on `device`, with data when T > 0.
void check_rows(const char* name, const TensorView& v, int64_t tokens, int hidden, Device device) {
  if (v.ndim != 2 || v.dtype != DType::bf16)
    fail(fmt::format("{} must be a 2-D [T, H] bf16 tensor, got {}", name, v.present() ? v.describe() : "none"));
  if (v.shape[0] != tokens || v.shape[1] != hidden)
    fail(fmt::format("{} shape ([{}, {}]) must be [T, H] = [{}, {}]", name, v.shape[0], v.shape[1], tokens, hidden));
  if (!v.is_contiguous()) fail(fmt::format("{} ({}) must be contiguous", name, v.describe()));
  if (v.device != device)
    fail(fmt::format("{}.device ({}) must be the layer device ({})", name, device_name(v.device),
                     device_name(device)));
  if (tokens > 0 && v.data == nullptr) fail(fmt::format("{}.data (null) must be non-null", name));
}

}  // namespace

std::string_view weight_format_name(WeightFormat f) {
  return name_of(kWeightFormats, f);
}
WeightFormat parse_weight_format(std::string_view name) {
  return parse_name(kWeightFormats, name, "weight_format");
}
std::string_view activation_format_name(ActivationFormat f) {
  return name_of(kActivationFormats, f);
}
ActivationFormat parse_activation_format(std::string_view name) {
  return parse_name(kActivationFormats, name, "activation_format");
}

void QuantConfig::validate() const {
  if (weight_format_name(weight_format) == "unknown")
    throw InvalidArgument(
        "quant", fmt::format("weight_format ({}) must be a known weight format", static_cast<int>(weight_format)));
  if (activation_format_name(activation_format) == "unknown")
    throw InvalidArgument("quant", fmt::format("activation_format ({}) must be a known activation format",
                                               static_cast<int>(activation_format)));
  check_block("block_n", block_n);
  check_block("block_k", block_k);
  check_block("activation_block", activation_block);
  const bool weight_only = weight_format == WeightFormat::int4_group || weight_format == WeightFormat::mxfp4;
  if (activation_format != ActivationFormat::bf16 && !is_fp8_weight(weight_format))
    throw InvalidArgument("quant",
                          fmt::format("activation_format ({}) must be bf16 unless weight_format is fp8 "
                                      "(weight_format is {}{})",
                                      activation_format_name(activation_format), weight_format_name(weight_format),
                                      weight_only ? ", a weight-only format" : ""));
}

LayerSpec preset_layer_spec(const Preset& preset) {
  LayerSpec s;
  s.experts = preset.experts;
  s.routing = preset.routing;
  s.expert_biases = preset.has_expert_biases;
  s.routing_bias = preset.has_bias;
  return s;
}

void LayerSpec::validate() const {
  experts.validate();
  routing.validate();
  quant.validate();
  auto agree = [](std::string_view field, int routing_value, int experts_value) {
    if (routing_value != experts_value)
      fail(fmt::format("routing {} ({}) must equal the expert config's {} ({})", field, routing_value, field,
                       experts_value));
  };
  agree("num_experts", routing.num_experts, experts.num_experts);
  agree("top_k", routing.top_k, experts.top_k);
  agree("num_shared_experts", routing.num_shared_experts, experts.num_shared_experts);
}

void validate_layer_inputs(const LayerSpec& spec, const LayerInputs& in, int64_t max_tokens, Device device) {
  if (in.hidden.ndim != 2)
    fail(fmt::format("hidden must be a 2-D [T, H] bf16 tensor, got {}",
                     in.hidden.present() ? in.hidden.describe() : "none"));
  const int64_t tokens = in.hidden.shape[0];
  if (tokens > max_tokens) fail(fmt::format("tokens ({}) must be <= max_tokens ({})", tokens, max_tokens));
  check_rows("hidden", in.hidden, tokens, spec.experts.hidden, device);
  check_rows("out", in.out, tokens, spec.experts.hidden, device);
  if (std::string why = detail::in_place_problem(in.out, "out", in.hidden, "hidden"); !why.empty()) fail(why);
  validate_route_args(spec.routing, in.logits, TensorView{}, in.replay, max_tokens, device);
  // Routing writes replay before the experts read hidden and write out.
  for (const auto& [name, v] : {std::pair{"hidden", &in.hidden}, std::pair{"out", &in.out}})
    if (std::string why = detail::shared_bytes_problem(in.replay, "replay", *v, name); !why.empty()) fail(why);
  if (in.logits.shape[0] != tokens)
    fail(fmt::format("logits.shape[0] ({}) must equal hidden.shape[0] ({})", in.logits.shape[0], tokens));
}

}  // namespace moekit

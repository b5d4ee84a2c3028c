// Routing: logits [T, E] -> for each token K routed slots (descending selection key) then S fused shared slots
// (DESIGN §3). The semantics below are the contract every backend implements bit-for-bit in its ids.
//
//   method           selection key (before bias)   weight of a selected expert
//   softmax_topk     logit (softmax is monotonic)  softmax(logits)[e] over all E; if renormalize, the softmax over
//                                                  the K selected logits (that sum's value in exact arithmetic)
//   topk_softmax     logit                         softmax over the K selected logits
//   sigmoid_grouped  sigmoid(logit)                sigmoid(logit); / sum over the K if renormalize
//   llama4 (K = 1)   logit                         sigmoid(logit)
//   pre_scored       score                         score; / sum over the K if renormalize
//
// - bias [E] (optional) is added to the selection key only, never to a weight.
// - sigmoid_grouped groups: E is split into n_group contiguous groups of E/n_group; a group's score is the sum of
//   its two best keys (its one key when a group has a single expert); the topk_group best groups are kept and the
//   K experts are chosen among them.
// - Order: higher key first; equal keys go to the lower expert id (groups: the lower group id). A NaN key ranks
//   below every number (as -inf, and after a real -inf).
// - routed_scaling_factor multiplies every routed weight (after renormalization) for every method.
// - Renormalization divides sigmoid_grouped and pre_scored weights by the sum of the K routed weights when that sum
//   is non-zero; softmax_topk takes the softmax over the K selected logits instead, so that no selected term is lost
//   to an fp32 underflow against a row max the bias left unselected; topk_softmax weights already sum to 1 and
//   llama4 (K = 1) ignores the flag.
// - Where the experts apply a weight is theirs to say: Llama-4 scales the expert's input by it, not its output
//   (ExpertConfig::routing_weight_on_input, set by the llama4-scout preset).
// - Non-finite logits have defined weights, the same on every backend. A softmax term is exp(l - max), with the max
//   over the non-NaN logits (of the row for softmax_topk, of the K selected for topk_softmax and renormalized
//   softmax_topk): a NaN logit weighs 0, +inf logits share the mass equally (each term is exp(0) = 1), a row of only
//   -inf is uniform, and a row of only NaN weighs 0 everywhere. sigmoid(+inf) = 1, sigmoid(-inf) = 0,
//   sigmoid(NaN) = NaN; a pre_scored NaN stays NaN.
// - Fused shared experts: slots K..K+S-1 get ids E..E+S-1 and weight exactly 1.0f.
// - Routing replay: optional int16 [R, K] contiguous buffer, R >= T; row t receives token t's K routed ids in slot
//   order; rows >= T are not touched. Requires E < 32768.
// - Arithmetic is fp32; sigmoid and exp use moekit's own portable functions so that keys are bitwise identical on
//   every backend.
#pragma once

#include <cstdint>
#include <string_view>

#include "moekit/tensor.h"

namespace moekit {

/// The routing methods of the table above.
enum class RoutingMethod : uint8_t { softmax_topk, topk_softmax, sigmoid_grouped, llama4, pre_scored };

/// "softmax_topk", "topk_softmax", "sigmoid_grouped", "llama4", "pre_scored".
std::string_view routing_method_name(RoutingMethod m);

/// Parses a routing_method_name(). Throws InvalidArgument listing the valid names.
RoutingMethod parse_routing_method(std::string_view name);

inline constexpr int kMaxExperts = 1024;
inline constexpr int kMaxSlots = 32;  // K + S

struct RoutingConfig {
  RoutingMethod method = RoutingMethod::softmax_topk;
  int num_experts = 0;         // E, 1..1024
  int top_k = 0;               // K, 1..min(E, 32)
  int num_shared_experts = 0;  // S >= 0, K + S <= 32
  bool renormalize = false;
  int n_group = 1;     // sigmoid_grouped only: divides E
  int topk_group = 1;  // sigmoid_grouped only: 1..n_group; K <= topk_group * E / n_group
  float routed_scaling_factor = 1.0f;

  int slots() const { return top_k + num_shared_experts; }

  /// Checks every limit above. Throws InvalidArgument, e.g. "moekit::route: top_k (9) must be <= num_experts (8)".
  void validate() const;
};

/// A routing config from its fields in declaration order (for tables of configurations); the same as the
/// designated initializer RoutingConfig{.method = ..., .num_experts = ..., ...}. Not validated.
constexpr RoutingConfig make_routing_config(RoutingMethod method, int num_experts, int top_k,
                                            int num_shared_experts = 0, bool renormalize = false, int n_group = 1,
                                            int topk_group = 1, float routed_scaling_factor = 1.0f) {
  return {.method = method,
          .num_experts = num_experts,
          .top_k = top_k,
          .num_shared_experts = num_shared_experts,
          .renormalize = renormalize,
          .n_group = n_group,
          .topk_group = topk_group,
          .routed_scaling_factor = routed_scaling_factor};
}

/// Validates one routing call's tensors against `cfg` (which is validated too):
///   logits [T, E] fp32/bf16, unit stride in E, row stride >= E, on `device`;
///   bias absent or [E] fp32/bf16 contiguous on `device`;
///   replay absent or [R, K] int16 contiguous with R >= T, on `device`, sharing no byte with logits or bias, and
///   E < 32768.
/// `max_tokens` is the capacity of the output buffers (T must not exceed it). Throws InvalidArgument.
void validate_route_args(const RoutingConfig& cfg, const TensorView& logits, const TensorView& bias,
                         const TensorView& replay, int64_t max_tokens, Device device);

/// CPU reference top-k: fills topk_ids [T, K+S] int32 and topk_weights [T, K+S] fp32 (both contiguous host
/// arrays of at least T*(K+S) elements) and the replay rows. Validates first. Does not allocate per token.
void route_topk_reference(const RoutingConfig& cfg, const TensorView& logits, const TensorView& bias,
                          int32_t* topk_ids, float* topk_weights, const TensorView& replay = {});

}  // namespace moekit

// Expert compute (DESIGN §5): from a route plan and hidden states [T, H] bf16 to the combined output [T, H] bf16:
//   gather rows by plan -> GEMM1 (w13, [2I, H] per expert) + b13 -> gated activation -> [rows, I]
//   -> GEMM2 (w2, [H, I] per expert) + b2 -> [rows, H] -> out[t] = sum_j w[t,j] * y[slot_rows[t,j]]
// in fp32 with j in slot order and one rounding to bf16 at the end. With routing_weight_on_input (Llama-4) a routed
// slot's weight scales the expert's input instead: GEMM1 sees w[t,j] * hidden[t] and the combine adds y unweighted.
// Expert ids in the plan are global: 0..E-1 routed, E..E+S-1 fused shared experts. Weights hold E' = local experts
// + S shared experts: global routed id e maps to local e - local_expert_offset when it lies in
// [offset, offset + local_num_experts), shared id E+s maps to local_num_experts + s; slots of other ranks'
// experts contribute nothing.
#pragma once

#include <cstdint>
#include <string_view>

#include "moekit/plan.h"
#include "moekit/tensor.h"

namespace moekit {

/// The gated activation applied to GEMM1's gate / up outputs (formulas under ActivationParams).
enum class Activation : uint8_t { silu_gated, swiglu_clamped, gelu_gated };
/// Arrangement of gate and up rows inside w13 [E', 2I, H]: gate rows then up rows, up then gate, or interleaved
/// row by row (gate, up, gate, up, ... as in GPT-OSS checkpoints).
enum class GateUpLayout : uint8_t { gate_first, up_first, interleaved };

std::string_view activation_name(Activation a);            // "silu_gated", "swiglu_clamped", "gelu_gated"
Activation parse_activation(std::string_view name);        // throws InvalidArgument listing the names
std::string_view gate_up_layout_name(GateUpLayout l);      // "gate_first", "up_first", "interleaved"
GateUpLayout parse_gate_up_layout(std::string_view name);  // throws InvalidArgument listing the names

/// Parameters of the gated activations.
///   silu_gated:     silu(gate) * up
///   swiglu_clamped: g = min(gate, limit), u = clamp(up, -limit, limit), g * sigmoid(alpha * g) * (u + beta);
///                   alpha and beta finite, limit > 0 (+inf: no clamp)
///   gelu_gated:     gelu_tanh(gate) * up
struct ActivationParams {
  float alpha = 1.702f;
  float beta = 1.0f;
  float limit = 7.0f;
};

struct ExpertConfig {
  int num_experts = 0;          // E (global routed experts)
  int top_k = 0;                // K
  int hidden = 0;               // H
  int intermediate = 0;         // I
  int num_shared_experts = 0;   // S, fused as extra experts E..E+S-1 (replicated on every rank)
  int local_num_experts = -1;   // experts held here; -1 means all E
  int local_expert_offset = 0;  // first global routed expert held here
  Activation activation = Activation::silu_gated;
  GateUpLayout gate_up = GateUpLayout::gate_first;
  ActivationParams act{};
  // Where a routed slot's weight w applies: false, to the expert's output (out[t] += w * y, DESIGN §5); true, to its
  // input (y = expert(w * hidden[t]) and out[t] += y), as Llama-4 defines its MoE layer. The two differ: the
  // gated activation is not linear. Shared slots keep their weight on the output either way.
  bool routing_weight_on_input = false;

  /// Routed experts held here: local_num_experts, or E when it is -1.
  int local_experts() const { return local_num_experts < 0 ? num_experts : local_num_experts; }
  /// E' = local routed experts + shared experts: the leading dimension of the weights.
  int weight_experts() const { return local_experts() + num_shared_experts; }

  /// Throws InvalidArgument naming the field (op "experts"): positive sizes, H and I multiples of 8 (16-byte rows
  /// in bf16), K + S <= 32, a local range inside [0, E), a known activation and layout, and for swiglu_clamped the
  /// parameter rules of ActivationParams.
  void validate() const;
};

/// An expert config holding all E experts from its main fields in declaration order (for tables of
/// configurations); the same as the designated initializer ExpertConfig{.num_experts = ..., ...}. Not validated.
constexpr ExpertConfig make_expert_config(int num_experts, int top_k, int hidden, int intermediate,
                                          int num_shared_experts = 0, Activation activation = Activation::silu_gated,
                                          GateUpLayout gate_up = GateUpLayout::gate_first,
                                          bool routing_weight_on_input = false) {
  return {.num_experts = num_experts,
          .top_k = top_k,
          .hidden = hidden,
          .intermediate = intermediate,
          .num_shared_experts = num_shared_experts,
          .activation = activation,
          .gate_up = gate_up,
          .routing_weight_on_input = routing_weight_on_input};
}

/// Expert weights, bf16, K-contiguous. Optional biases are fp32 or bf16.
struct ExpertWeights {
  TensorView w13;  // [E', 2I, H] bf16
  TensorView w2;   // [E', H, I] bf16
  TensorView b13;  // optional [E', 2I]
  TensorView b2;   // optional [E', H]
};

/// Checks shapes, dtypes, contiguity and devices of weights against cfg. Throws InvalidArgument.
void validate_expert_weights(const ExpertConfig& cfg, const ExpertWeights& w, Device device);

/// Copies w13 [E', 2I, H] or b13 [E', 2I] (contiguous, host memory, any dtype) from the gate/up arrangement `from`
/// into `to`, writing `dst` (same shape and dtype, not overlapping `src`): e.g. a gate-first checkpoint interleaved
/// at load time, so that the CUDA backend's GEMM1 applies bias + activation in its epilogue on more of its tactics
/// than it does for gate-first w13 (see cuda_experts.h).
/// Throws InvalidArgument (op "experts") naming the bad argument.
void rearrange_gate_up(const TensorView& src, GateUpLayout from, const TensorView& dst, GateUpLayout to);

/// One gated activation in fp32 (the reference definition every backend follows).
float apply_activation(Activation a, const ActivationParams& p, float gate, float up);

/// CPU reference for the experts: hidden [T, H] bf16 and a host plan (T = plan.tokens) -> out [T, H] bf16.
/// Accumulates in fp32 and keeps intermediates in fp32. `threads` = 0 uses every hardware thread. `out` may be
/// `hidden` itself (in place); an out that overlaps hidden otherwise is rejected.
/// Throws InvalidArgument on a mismatch between cfg, weights, plan and tensors.
void experts_reference(const ExpertConfig& cfg, const ExpertWeights& weights, const TensorView& hidden,
                       const RoutePlanView& plan, const TensorView& out, int threads = 0);

}  // namespace moekit

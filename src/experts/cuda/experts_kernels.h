// Launchers of the expert pipeline's kernels (host-only declarations, no CUDA headers): problem-array fill,
// gather, activation, decode GEMV, combine, and the CUTLASS grouped GEMMs. Each launcher takes a Params struct of
// raw device pointers and sizes, launches on the given stream (a cudaStream_t), checks the launch and never
// allocates or synchronizes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "moekit/experts.h"
#include "moekit/tensor.h"

namespace moekit::detail {

/// Global expert id -> index into the weights' leading dimension, or -1 for another rank's expert.
struct ExpertMap {
  int num_experts = 0;   // E: ids >= E are shared experts
  int local_offset = 0;  // first local routed id
  int local_count = 0;   // local routed experts
};

/// The plan's device arrays every kernel reads.
struct PlanArrays {
  const int32_t* topk_ids = nullptr;        // [T, Kt]
  const float* topk_weights = nullptr;      // [T, Kt]
  const int32_t* expert_counts = nullptr;   // [G]
  const int32_t* expert_offsets = nullptr;  // [G+1]
  const int32_t* sorted_slots = nullptr;    // [cap]
  const int32_t* slot_rows = nullptr;       // [T, Kt]
  const int32_t* block_experts = nullptr;   // [cap/B]
  int64_t tokens = 0;                       // T
  int slots = 0;                            // Kt = K + S
  int groups = 0;                           // G = E + S
  int block = 0;                            // B
  int64_t capacity = 0;                     // rows of sorted_slots written for this T (host bound)
};

/// Optional per-expert bias: fp32 or bf16, [E', n] contiguous; data == nullptr when absent.
struct BiasRef {
  const void* data = nullptr;
  bool is_bf16 = false;
};

/// GEMM1 with the gated activation in its epilogue (w13 rows interleaved gate, up, ..., or in two blocks through the
/// halves instantiations): instead of D, each group writes act rows through out[g] (the pointers GEMM2 reads act
/// through: its A array, or its B array when GEMM2 runs swapped), adding b13 of the group's local expert.
struct GatedEpilogueArgs {
  const void* const* ptr_out = nullptr;  // [G] bf16* on the device
  int64_t ld_out = 0;                    // I
  BiasRef bias;                          // b13 [E', 2I]
  ExpertMap map;
  Activation activation = Activation::silu_gated;
  ActivationParams act;
  bool up_first = false;  // halves instantiations: w13's first block holds the up rows (up_first layout)
};

/// Argument arrays of one CUTLASS ptr-array grouped GEMM, D[g] = A[g] * B[g]^T with A [M, K] row-major,
/// B [N, K] row-major (K-contiguous), D [M, N] row-major; all arrays [G] on the device.
struct GroupedGemmArgs {
  int groups = 0;
  void* problem_shapes = nullptr;  // [G] (M, N, K) int32 triples
  const void** ptr_a = nullptr;    // [G] bf16*
  const void** ptr_b = nullptr;    // [G] bf16*
  void** ptr_d = nullptr;          // [G] bf16*
  void* stride_a = nullptr;        // [G] CUTLASS stride objects
  void* stride_b = nullptr;
  void* stride_d = nullptr;
  void* workspace = nullptr;  // workspace_size() bytes
  int sm_count = 0;
  GatedEpilogueArgs gated;  // read by the gated instantiations only (ptr_d and stride_d unused there)
};

/// Byte sizes of one entry of each per-group array (for allocation).
struct GroupedArraySizes {
  size_t problem_shape, stride_a, stride_b, stride_d;
};
GroupedArraySizes grouped_array_sizes();

/// One grouped-GEMM instantiation: its workspace size and its launcher.
struct GroupedGemmOps {
  size_t (*workspace_size)(int groups, int sm_count);
  void (*run)(const GroupedGemmArgs& args, Stream stream);
};
GroupedGemmOps sm90_grouped_gemm_cooperative_128x128x64();
GroupedGemmOps sm90_grouped_gemm_pingpong_64x128x64();
GroupedGemmOps sm90_grouped_gemm_cooperative_128x256x64();
GroupedGemmOps sm90_grouped_gemm_pingpong_64x256x64();
// GEMM1 with the gated activation fused (GatedEpilogueArgs), for interleaved w13.
GroupedGemmOps sm90_grouped_gemm_gated_pingpong_64x256x64();
GroupedGemmOps sm90_grouped_gemm_gated_cooperative_128x256x64();
// Swapped operands (A = weights [N, K], B = the plan's rows, D column-major): the fill kernel sets such a GEMM's
// groups up with FillProblemsParams::swap1 / swap2.
GroupedGemmOps sm90_grouped_gemm_swap_ab_cooperative_128x32x64();
GroupedGemmOps sm90_grouped_gemm_swap_ab_cooperative_256x96x64();
// Swapped, with the gated activation fused (interleaved w13).
GroupedGemmOps sm90_grouped_gemm_gated_swap_ab_cooperative_128x32x64();
// GEMM1 with the gated activation fused for w13 in two blocks (gate-first or up-first, I a multiple of 128): each
// 256-column tile pairs 128 rows of one block with the same rows of the other (sm90_halves_mainloop.cuh).
GroupedGemmOps sm90_grouped_gemm_gated_halves_pingpong_64x256x64();
// The same on the swapped 128x32 tile: each 128-row weight tile pairs 64 rows of one block with the same rows of the
// other.
GroupedGemmOps sm90_grouped_gemm_gated_halves_swap_ab_cooperative_128x32x64();

/// Fills both GEMMs' problem shapes, pointers and strides for every group from the plan's counts and offsets:
/// GEMM1 group g: M = count (0 for another rank's expert), N = 2I, K = H, A = a1 + off*H, B = w13[local], D = c1 +
/// off*2I; GEMM2: M = count, N = H, K = I, A = act + off*I, B = w2[local], D = y + off*H. A swapped GEMM (swap1 /
/// swap2) gets (N, count, K), A and B exchanged, and D's column-major stride. One small launch.
struct FillProblemsParams {
  PlanArrays plan;
  ExpertMap map;
  int hidden = 0, intermediate = 0;
  const void* w13 = nullptr;  // [E', 2I, H] bf16
  const void* w2 = nullptr;   // [E', H, I] bf16
  const void* a1 = nullptr;   // [cap, H] bf16 gathered rows
  void* c1 = nullptr;         // [cap, 2I] bf16 GEMM1 output
  const void* act = nullptr;  // [cap, I] bf16 activation output
  void* y = nullptr;          // [cap, H] bf16 GEMM2 output
  GroupedGemmArgs gemm1, gemm2;
  bool swap1 = false, swap2 = false;  // the GEMM runs a GroupedForm::swap_ab instantiation
};
void launch_fill_problems(const FillProblemsParams& p, Stream stream);

/// a1[slot_rows[t, j]] = hidden[t] for every token t and local slot j (each hidden row read once; with
/// weight_on_input a routed slot's row is w[t, j] * hidden[t], rounded to bf16), and, in one extra CTA of the same
/// launch, what launch_fill_problems(fill) does.
struct GatherParams {
  PlanArrays plan;
  ExpertMap map;
  const void* hidden = nullptr;  // [T, H] bf16
  void* a1 = nullptr;            // [cap, H] bf16
  int hidden_size = 0;
  FillProblemsParams fill;
  bool weight_on_input = false;  // ExpertConfig::routing_weight_on_input
};
void launch_gather(const GatherParams& p, Stream stream);

/// act[r, i] = activation(c1[r, gate(i)] + b13[gate(i)], c1[r, up(i)] + b13[up(i)]) for every used local row.
struct ActivationKernelParams {
  PlanArrays plan;
  ExpertMap map;
  const void* c1 = nullptr;  // [cap, 2I] bf16
  void* act = nullptr;       // [cap, I] bf16
  BiasRef b13;               // [E', 2I]
  int intermediate = 0;
  Activation activation = Activation::silu_gated;
  GateUpLayout layout = GateUpLayout::gate_first;
  ActivationParams act_params;
};
void launch_activation(const ActivationKernelParams& p, Stream stream);

/// Decode GEMV over the plan's blocks. gated (GEMM1): x rows are hidden[token] (or, with x_per_row, rows the gather
/// wrote in plan order: routed rows scaled by their weight under routing_weight_on_input), weights w13 [E', 2I, H],
/// output act [cap, I] with b13 and the activation fused; plain (GEMM2, x_per_row): x rows are act, weights w2
/// [E', H, I], output y [cap, H].
struct GemvParams {
  PlanArrays plan;
  ExpertMap map;
  bool gated = false;
  const void* x = nullptr;  // gated: hidden [T, H]; plain: act [cap, I]
  const void* w = nullptr;
  void* out = nullptr;
  int k = 0;      // reduction length (H or I)
  int n_out = 0;  // output columns (I or H)
  BiasRef b13;
  Activation activation = Activation::silu_gated;
  GateUpLayout layout = GateUpLayout::gate_first;
  ActivationParams act_params;
  bool x_per_row = false;  // x holds a row per plan row (else GEMM1's hidden [T, H], a row per token)
};
void launch_gemv(const GemvParams& p, Stream stream);

/// out[t] = sum_j w[t,j] * (y[slot_rows[t,j]] + b2[local(id)]) over local slots j in order, fp32, one bf16 rounding;
/// w = 1 for routed slots with weight_on_input (their weight scaled the input).
struct CombineParams {
  PlanArrays plan;
  ExpertMap map;
  const void* y = nullptr;  // [cap, H] bf16
  BiasRef b2;               // [E', H]
  void* out = nullptr;      // [T, H] bf16
  int hidden = 0;
  bool weight_on_input = false;  // ExpertConfig::routing_weight_on_input
};
void launch_combine(const CombineParams& p, Stream stream);

/// Throws CudaError("experts", "<what> failed: <cuda error>") when the last launch failed.
void check_launch(const char* what);

}  // namespace moekit::detail

// Internal entry of the fused CUDA router, called by moekit::route() for plans on a CUDA device after the shared
// validation (validate_route_args and the plan-shape checks) has passed. Host-only declarations: no CUDA headers.
// The router needs a small device workspace per plan (per-CTA expert counts, double-buffered expert totals and the
// grid barrier's epoch and arrival words); route_cuda_workspace_ints() gives its size so that RoutePlan can own it.
#pragma once

#include <cstdint>

#include "moekit/plan.h"
#include "moekit/routing.h"
#include "moekit/tensor.h"

namespace moekit::detail {

/// Fills `plan` (device buffers) for logits [T, E] with one kernel launch on `stream` (a cudaStream_t) and
/// sets plan.tokens = T. `capacity` is plan_capacity() for T: the rows of sorted_slots (and, / B, the entries of
/// block_experts) the call writes. No allocation, no host synchronization. Throws CudaError if the launch fails.
/// Uses plan.workspace (route_cuda_workspace_ints() int32, zeroed when RoutePlan allocated it). `device` is the
/// plan's CUDA device, which the caller has made current.
void route_cuda(const RoutingConfig& cfg, const TensorView& logits, const TensorView& bias, RoutePlanView& plan,
                int64_t capacity, Stream stream, const TensorView& replay, int device);

/// int32 elements of device workspace the fused router needs for a plan of this shape. The memory must be zeroed
/// once when it is allocated (every call leaves it ready for the next).
int64_t route_cuda_workspace_ints(const PlanShape& shape);
/// Workspace words of the grid barrier (uint32): its epoch (the arrival count when the call starts, with the call's
/// parity in bit 0) and its arrival count (+2 per CTA, mod 2^32). A zeroed workspace holds a valid state, and so
/// does the same even count in both words.
inline constexpr int kRouteEpochWord = 0, kRouteArrivalsWord = 1;

/// When the fused router routes two tokens per warp (teams of 16 lanes): by the heuristic (route_cuda_pairs_pay()),
/// never, or always where the kernel instance allows it (tests: every call size).
enum class RoutePairs { heuristic, never, always };

/// Launch geometry of the fused router, for benchmarks that compare alternatives. ctas = 0 (the default) lets the
/// heuristic choose; otherwise the grid is clamped to what can be co-resident. Not thread-safe; process-wide.
struct RouteCudaTuning {
  int ctas = 0;
  /// Null, or device memory for route_cuda_trace_words() uint64: thread 0 of every CTA stores (%globaltimer ns,
  /// clock64) at kRouteTracePoints phase boundaries: entry, setup done, tokens routed, counts published, totals
  /// and earlier-CTA bases known (after the grid barrier when there is one), offsets scanned, slots scattered,
  /// the groups' blocks written (padding rows and blocks past the extent are written earlier, by the prefill during
  /// setup or routing). Layout [cta][point][2]. Calls with at most 32 slots (T * Kt <= 32) build their plan in one
  /// step instead: points 3-5 coincide (slots ranked and scattered), 6 follows counts and offsets, 7 the segments'
  /// blocks.
  /// In the decode instances (T <= 8, one CTA), the crew's first thread stamps 2: when the routing warps'
  /// selections reach the warps without tokens (whose counts then precede point 3). With T * Kt <= 32 it stamps 3-7
  /// too, the plan's steps as above (with one token, 3-5 coincide, 6 follows counts and offsets, 7 the slots' rows
  /// and blocks); the routing warps' weights and slots, meanwhile, are not stamped.
  uint64_t* trace = nullptr;
  /// true: calls of one token per warp take the general kernel instance instead of a decode instance (one CTA, at
  /// most 8 tokens) or the token-mask instance (tests).
  bool general_only = false;
  /// Two tokens per warp (RoutePairs). Possible for logits of at most 256 experts, at most 16 slots per token and,
  /// with group limiting, groups of whole lanes (1-16 lanes) and at most 16 groups; elsewhere ignored.
  RoutePairs pairs = RoutePairs::heuristic;
};
inline constexpr int kRouteTracePoints = 8;
int64_t route_cuda_trace_words();
void set_route_cuda_tuning(const RouteCudaTuning& tuning);

/// Grid size the last route_cuda() call used (for benchmark reports).
int route_cuda_last_ctas();
/// Whether the last route_cuda() call built its plan in one step (one CTA and T * Kt <= 32; its trace points 3-7
/// mean other things, see RouteCudaTuning::trace).
bool route_cuda_last_tiny_plan();
/// Whether the last route_cuda() call routed two tokens per warp (RoutePairs).
bool route_cuda_last_pairs();
/// Whether the last route_cuda() call took the token-mask instance (one token per warp, more than 32 slots or more
/// than one CTA, not a decode call).
bool route_cuda_last_token_masks();
/// The heuristic's rule for two tokens per warp (RoutePairs::heuristic), where the kernel instance allows it: a call
/// of `tokens` whose one-token-per-warp grid is `ctas` CTAs on a GPU of `sms` SMs takes it when that grid gives a
/// warp more than one token and, for sigmoid_grouped (whose lanes then hold twice the sigmoids), when the grid takes
/// more than one CTA per SM.
bool route_cuda_pairs_pay(bool sigmoid_grouped, int64_t tokens, int ctas, int sms);

}  // namespace moekit::detail

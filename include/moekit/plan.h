// The route plan (DESIGN §4): everything a grouped GEMM needs to run the routed slots expert by expert, built by
// one call from preallocated buffers. With Kt = K+S slots per token, G = E+S experts and block size B:
//
//   topk_ids       [T, Kt] int32   expert of each slot
//   topk_weights   [T, Kt] fp32    weight of each slot
//   expert_counts  [G] int32       slots routed to each expert
//   expert_offsets [G+1] int32     exclusive prefix sum of counts rounded up to B (padded segments)
//   sorted_slots   [cap] int32     flat slot t*Kt+j at each row of the expert-grouped order; padding = T*Kt
//   slot_rows      [T, Kt] int32   row of each slot in that order (inverse of sorted_slots)
//   block_experts  [cap/B] int32   expert owning each block of B rows; -1 past the extent
//   extent         [2] int32       {padded rows used, blocks used} = {offsets[G], offsets[G]/B}
//
// Within an expert, rows are in ascending slot order (so ascending token): the plan is deterministic.
// Entries of sorted_slots and block_experts past the extent are written too (padding / -1), up to the capacity
// for the call's T, so consumers may read whole capacity-sized arrays.
#pragma once

#include <cstdint>
#include <memory>

#include "moekit/routing.h"
#include "moekit/tensor.h"

namespace moekit {

inline constexpr int kMaxBlock = 256;

/// Rows needed by sorted_slots for T tokens: every slot once, plus at most B-1 padding rows for each expert that
/// receives a slot (at most min(G, T*Kt) of them), rounded up to B. Throws InvalidArgument for E outside
/// 1..kMaxExperts, K < 1, S < 0, K + S > kMaxSlots, B outside 1..256, negative tokens, or a result that does not
/// fit int32.
int64_t plan_capacity(int64_t tokens, int num_experts, int top_k, int num_shared_experts, int block);

/// Sizes of one plan's buffers.
struct PlanShape {
  int64_t max_tokens = 0;
  int num_experts = 0;         // E
  int top_k = 0;               // K
  int num_shared_experts = 0;  // S
  int block = 1;               // B, 1..256

  int slots() const { return top_k + num_shared_experts; }
  int groups() const { return num_experts + num_shared_experts; }
  int64_t capacity() const { return plan_capacity(max_tokens, num_experts, top_k, num_shared_experts, block); }
  /// Throws InvalidArgument naming the bad field (op "plan").
  void validate() const;
};

/// Raw pointers into a plan's buffers (all on one device) and the token count of the last call.
struct RoutePlanView {
  PlanShape shape;
  int64_t tokens = 0;                 // T of the last call
  int32_t* topk_ids = nullptr;        // [max_tokens, Kt]
  float* topk_weights = nullptr;      // [max_tokens, Kt]
  int32_t* expert_counts = nullptr;   // [G]
  int32_t* expert_offsets = nullptr;  // [G+1]
  int32_t* sorted_slots = nullptr;    // [cap]
  int32_t* slot_rows = nullptr;       // [max_tokens, Kt]
  int32_t* block_experts = nullptr;   // [cap/B]
  int32_t* extent = nullptr;          // [2]
  int32_t* workspace = nullptr;       // CUDA plans: the fused router's scratch, zeroed at allocation; CPU: null
};

/// Owns a plan's buffers on one device. Allocated once (cudaMalloc on a GPU), reused by every call and by
/// CUDA-graph replays; moving is allowed, copying is not. Calls that write one plan (route() on different streams)
/// must be ordered by the caller: they share its arrays and the router's grid-barrier workspace.
class RoutePlan {
 public:
  /// Allocates for `shape` on `device` and zeroes the buffers; on a GPU it returns once the zeros are in place, so
  /// that the first route() may run on any stream, non-blocking ones included. Throws InvalidArgument for a bad
  /// shape, NotSupported for a CUDA device in a build without CUDA, CudaError when allocation fails.
  RoutePlan(const PlanShape& shape, Device device);
  ~RoutePlan();
  RoutePlan(RoutePlan&&) noexcept;
  RoutePlan& operator=(RoutePlan&&) noexcept;
  RoutePlan(const RoutePlan&) = delete;
  RoutePlan& operator=(const RoutePlan&) = delete;

  /// The shape it was allocated for, its device, and its arrays with the last call's token count.
  const PlanShape& shape() const { return view_.shape; }
  Device device() const { return device_; }
  const RoutePlanView& view() const { return view_; }
  /// The same arrays for writing: route() and copy_plan() fill them; a caller that writes them itself (e.g. a CPU
  /// plan built with build_plan_reference) must leave a complete plan of DESIGN §4 for the experts to read.
  RoutePlanView& mutable_view() { return view_; }

 private:
  Device device_;
  RoutePlanView view_;
  void* storage_ = nullptr;
};

/// Copies the plan arrays of src's last call (src.view().tokens tokens: every array of RoutePlanView except the
/// router's workspace) into `dst` and sets dst's token count. Host to host, host to CUDA and CUDA to host;
/// synchronous. Throws InvalidArgument when either plan was moved from, when E, K, S or B differ or dst.max_tokens <
/// src's tokens, NotSupported for two CUDA plans or without CUDA, CudaError when a copy fails.
void copy_plan(const RoutePlan& src, RoutePlan& dst);

/// CPU reference plan from topk ids: fills every field of `plan` except topk_ids/topk_weights (read from it) for
/// `tokens` tokens. `plan` must be a host plan with every buffer set (InvalidArgument otherwise, e.g. for the view
/// of a moved-from plan). Deterministic.
void build_plan_reference(int64_t tokens, RoutePlanView& plan);

/// Routes `logits` [T, E] into `plan`: top-k ids and weights, then the whole plan, and the replay rows.
/// On a CPU plan this runs the reference; on a CUDA plan it is one kernel launch on `stream`, with no allocation
/// and no host synchronization (capturable in a CUDA graph), on the plan's GPU whichever device is current (the
/// caller's current device is restored; `stream` must belong to the plan's GPU). Inputs must live on the plan's
/// device, each starting on a multiple of its element size. The kernel
/// lets programmatic dependents start early: a kernel launched after it with programmatic stream serialization
/// must execute griddepcontrol.wait (cudaGridDependencySynchronize) before it reads the plan.
/// Throws InvalidArgument (validate_route_args, a moved-from plan, or a plan shape that does not match cfg),
/// CudaError.
void route(const RoutingConfig& cfg, const TensorView& logits, const TensorView& bias, RoutePlan& plan,
           Stream stream = nullptr, const TensorView& replay = {});

}  // namespace moekit

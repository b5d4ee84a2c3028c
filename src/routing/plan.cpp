// The route plan's sizes, its buffers and the route() entry point (DESIGN §4).
// plan_capacity bounds the padded row count: every slot once, plus at most B-1 padding rows for each expert that
// receives a slot (at most min(G, T*Kt) experts do). RoutePlan carves all buffers out of one allocation, each
// 256-byte aligned (host memory on the CPU, cudaMalloc on a GPU), once; route() then only writes into them, so a
// CUDA plan can be filled inside a captured graph. route() runs the shared validation and dispatches on the device.
#include "moekit/plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <new>
#include <utility>

#include "moekit/device.h"
#include "moekit/error.h"

#if MOEKIT_HAS_CUDA
#include <cuda_runtime_api.h>

#include "core/device_scope.h"
#include "routing/cuda/route_cuda.h"
#endif

namespace moekit {
namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kBufferAlign = 256;  // bytes; matches cudaMalloc's alignment, enough for TMA and vector loads

int64_t round_up(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}

// Checks the fields a plan's size depends on; `tokens_name`/`min_tokens` distinguish a plan's max_tokens (>= 1)
// from a call's token count (>= 0).
void check_plan_sizes(std::string_view tokens_name, int64_t tokens, int64_t min_tokens, int num_experts, int top_k,
                      int num_shared_experts, int block) {
  if (tokens < min_tokens)
    throw InvalidArgument("plan", fmt::format("{} ({}) must be >= {}", tokens_name, tokens, min_tokens));
  if (num_experts < 1 || num_experts > kMaxExperts)
    throw InvalidArgument("plan", fmt::format("num_experts ({}) must be in [1, {}]", num_experts, kMaxExperts));
  if (top_k < 1) throw InvalidArgument("plan", fmt::format("top_k ({}) must be >= 1", top_k));
  if (num_shared_experts < 0)
    throw InvalidArgument("plan", fmt::format("num_shared_experts ({}) must be >= 0", num_shared_experts));
  if (top_k + num_shared_experts > kMaxSlots)
    throw InvalidArgument(
        "plan", fmt::format("top_k + num_shared_experts ({}) must be <= {}", top_k + num_shared_experts, kMaxSlots));
  if (block < 1 || block > kMaxBlock)
    throw InvalidArgument("plan", fmt::format("block ({}) must be in [1, {}]", block, kMaxBlock));
}

// Element counts of the plan's buffers, in storage order.
struct BufferSizes {
  int64_t per_slot;   // topk_ids, topk_weights, slot_rows: max_tokens * Kt each
  int64_t groups;     // expert_counts: G
  int64_t capacity;   // sorted_slots
  int64_t blocks;     // block_experts: capacity / B
  int64_t workspace;  // the CUDA router's scratch (zeroed once here; each call leaves it ready for the next)
};

BufferSizes buffer_sizes(const PlanShape& s, Device device) {
  int64_t cap = s.capacity();
  int64_t workspace = 0;
#if MOEKIT_HAS_CUDA
  if (device.is_cuda()) workspace = detail::route_cuda_workspace_ints(s);
#else
  (void)device;
#endif
  return {s.max_tokens * s.slots(), s.groups(), cap, cap / s.block, workspace};
}

// Byte offsets of every buffer inside the one storage block; returns the total size.
struct Layout {
  int64_t topk_ids, topk_weights, slot_rows, expert_counts, expert_offsets, sorted_slots, block_experts, extent;
  int64_t workspace;  // -1 when the plan has none (CPU)
  int64_t total;
};

Layout layout(const BufferSizes& n) {
  Layout l{};
  int64_t at = 0;
  auto take = [&](int64_t elements) {  // every element is 4 bytes (int32 or fp32)
    int64_t here = at;
    at += round_up(std::max<int64_t>(elements, 1) * 4, kBufferAlign);
    return here;
  };
  l.topk_ids = take(n.per_slot);
  l.topk_weights = take(n.per_slot);
  l.slot_rows = take(n.per_slot);
  l.expert_counts = take(n.groups);
  l.expert_offsets = take(n.groups + 1);
  l.sorted_slots = take(n.capacity);
  l.block_experts = take(n.blocks);
  l.extent = take(2);
  l.workspace = n.workspace > 0 ? take(n.workspace) : -1;
  l.total = at;
  return l;
}

void* allocate_storage(Device device, int64_t bytes) {
  if (device.is_cpu()) {
    void* p = ::operator new (static_cast<size_t>(bytes), std::align_val_t{kBufferAlign});
    std::memset(p, 0, static_cast<size_t>(bytes));
    return p;
  }
#if MOEKIT_HAS_CUDA
  detail::CurrentDeviceScope scope(device.index, "plan");
  void* p = nullptr;
  detail::check_cuda(cudaMalloc(&p, static_cast<size_t>(bytes)), "plan", fmt::format("cudaMalloc({} bytes)", bytes));
  // The zeros (the router's workspace starts from them) are in place when fill_device_bytes() returns, before
  // route() runs on any stream, non-blocking ones included.
  try {
    fill_device_bytes(p, 0, static_cast<size_t>(bytes));
  } catch (...) {
    cudaFree(p);
    throw;
  }
  return p;
#else
  (void)bytes;
  throw NotSupported("plan",
                     fmt::format("device ({}) is not available: moekit was built without CUDA", device_name(device)));
#endif
}

void free_storage(Device device, void* p) noexcept {
  if (p == nullptr) return;
  if (device.is_cpu()) {
    ::operator delete (p, std::align_val_t{kBufferAlign});
    return;
  }
#if MOEKIT_HAS_CUDA
  int previous = 0;
  bool switched = cudaGetDevice(&previous) == cudaSuccess && previous != device.index &&
                  cudaSetDevice(device.index) == cudaSuccess;
  cudaFree(p);  // errors ignored: freeing must not throw (a sticky error is reported by the next checked call)
  if (switched) cudaSetDevice(previous);
#endif
}

// A moved-from plan keeps no buffers and a zero shape; name that instead of its shape's first broken rule.
void require_buffers(std::string_view op, std::string_view name, const RoutePlan& plan) {
  if (plan.view().topk_ids == nullptr)
    throw InvalidArgument(op, fmt::format("{} holds no buffers (it was moved from)", name));
}

}  // namespace

int64_t plan_capacity(int64_t tokens, int num_experts, int top_k, int num_shared_experts, int block) {
  check_plan_sizes("tokens", tokens, 0, num_experts, top_k, num_shared_experts, block);
  const int64_t slots = top_k + num_shared_experts;
  // Checked before multiplying so that no product below can overflow int64.
  if (tokens > kInt32Max / slots)
    throw InvalidArgument("plan", fmt::format("tokens ({}) * slots ({}) must be <= {}", tokens, slots, kInt32Max));
  const int64_t routed = tokens * slots;
  const int64_t groups = num_experts + num_shared_experts;
  const int64_t cap = round_up(routed + std::min(groups, routed) * (block - 1), block);
  if (cap > kInt32Max)
    throw InvalidArgument("plan", fmt::format("capacity ({}) for tokens ({}) must be <= {}", cap, tokens, kInt32Max));
  return cap;
}

void PlanShape::validate() const {
  check_plan_sizes("max_tokens", max_tokens, 1, num_experts, top_k, num_shared_experts, block);
  capacity();  // throws when the buffers would need more than int32 rows
}

RoutePlan::RoutePlan(const PlanShape& shape, Device device) : device_(device) {
  shape.validate();
  const Layout l = layout(buffer_sizes(shape, device));
  storage_ = allocate_storage(device, l.total);
  auto* base = static_cast<char*>(storage_);
  view_.shape = shape;
  view_.tokens = 0;
  view_.topk_ids = reinterpret_cast<int32_t*>(base + l.topk_ids);
  view_.topk_weights = reinterpret_cast<float*>(base + l.topk_weights);
  view_.slot_rows = reinterpret_cast<int32_t*>(base + l.slot_rows);
  view_.expert_counts = reinterpret_cast<int32_t*>(base + l.expert_counts);
  view_.expert_offsets = reinterpret_cast<int32_t*>(base + l.expert_offsets);
  view_.sorted_slots = reinterpret_cast<int32_t*>(base + l.sorted_slots);
  view_.block_experts = reinterpret_cast<int32_t*>(base + l.block_experts);
  view_.extent = reinterpret_cast<int32_t*>(base + l.extent);
  view_.workspace = l.workspace < 0 ? nullptr : reinterpret_cast<int32_t*>(base + l.workspace);
}

RoutePlan::~RoutePlan() {
  free_storage(device_, storage_);
}

RoutePlan::RoutePlan(RoutePlan&& other) noexcept
    : device_(other.device_), view_(other.view_), storage_(std::exchange(other.storage_, nullptr)) {
  other.view_ = RoutePlanView{};  // the moved-from plan owns nothing and points at nothing
}

RoutePlan& RoutePlan::operator=(RoutePlan&& other) noexcept {
  if (this != &other) {
    free_storage(device_, storage_);
    device_ = other.device_;
    view_ = std::exchange(other.view_, RoutePlanView{});
    storage_ = std::exchange(other.storage_, nullptr);
  }
  return *this;
}

void copy_plan(const RoutePlan& src, RoutePlan& dst) {
  require_buffers("copy_plan", "src", src);
  require_buffers("copy_plan", "dst", dst);
  const PlanShape &a = src.shape(), &b = dst.shape();
  const int64_t t = src.view().tokens;
  if (a.num_experts != b.num_experts || a.top_k != b.top_k || a.num_shared_experts != b.num_shared_experts ||
      a.block != b.block)
    throw InvalidArgument("copy_plan", fmt::format("dst shape (E {}, K {}, S {}, B {}) must equal src's (E {}, K {}, "
                                                   "S {}, B {})",
                                                   b.num_experts, b.top_k, b.num_shared_experts, b.block,
                                                   a.num_experts, a.top_k, a.num_shared_experts, a.block));
  if (b.max_tokens < t)
    throw InvalidArgument("copy_plan",
                          fmt::format("dst max_tokens ({}) must be >= src's tokens ({})", b.max_tokens, t));
  const bool from_cpu = src.device().is_cpu(), to_cpu = dst.device().is_cpu();
  if (!from_cpu && !to_cpu) throw NotSupported("copy_plan", "copies between two CUDA plans are not supported");
  auto copy = [&](void* to, const void* from, int64_t elements) {
    const size_t bytes = static_cast<size_t>(elements) * 4;
    if (bytes == 0) return;
    if (from_cpu && to_cpu)
      std::memcpy(to, from, bytes);
    else if (to_cpu)
      copy_to_host(to, from, bytes);
    else
      copy_to_device(to, from, bytes);
  };
  const RoutePlanView& s = src.view();
  RoutePlanView& d = dst.mutable_view();
  const int64_t kt = a.slots(), g = a.groups();
  const int64_t cap = plan_capacity(t, a.num_experts, a.top_k, a.num_shared_experts, a.block);
  copy(d.topk_ids, s.topk_ids, t * kt);
  copy(d.topk_weights, s.topk_weights, t * kt);
  copy(d.expert_counts, s.expert_counts, g);
  copy(d.expert_offsets, s.expert_offsets, g + 1);
  copy(d.sorted_slots, s.sorted_slots, cap);
  copy(d.slot_rows, s.slot_rows, t * kt);
  copy(d.block_experts, s.block_experts, cap / a.block);
  copy(d.extent, s.extent, 2);
  d.tokens = t;
}

void route(const RoutingConfig& cfg, const TensorView& logits, const TensorView& bias, RoutePlan& plan, Stream stream,
           const TensorView& replay) {
  require_buffers("route", "plan", plan);
  const PlanShape& shape = plan.shape();
  validate_route_args(cfg, logits, bias, replay, shape.max_tokens, plan.device());
  auto require_equal = [](std::string_view field, int plan_value, int cfg_value) {
    if (plan_value != cfg_value)
      throw InvalidArgument("route", fmt::format("plan {} ({}) must equal the routing config's {} ({})", field,
                                                 plan_value, field, cfg_value));
  };
  require_equal("num_experts", shape.num_experts, cfg.num_experts);
  require_equal("top_k", shape.top_k, cfg.top_k);
  require_equal("num_shared_experts", shape.num_shared_experts, cfg.num_shared_experts);

  RoutePlanView& view = plan.mutable_view();
  if (plan.device().is_cpu()) {
    route_topk_reference(cfg, logits, bias, view.topk_ids, view.topk_weights, replay);
    build_plan_reference(logits.size(0), view);
    return;
  }
#if MOEKIT_HAS_CUDA
  const int64_t capacity =
      plan_capacity(logits.size(0), cfg.num_experts, cfg.top_k, cfg.num_shared_experts, shape.block);
  // The launch goes to the plan's GPU whichever device is current (and the caller's stays current afterwards).
  const detail::CurrentDeviceScope on_plan_device(plan.device().index, "route");
  detail::route_cuda(cfg, logits, bias, view, capacity, stream, replay, plan.device().index);
#else
  (void)stream;
  throw NotSupported("route", fmt::format("plan device ({}) is not available: moekit was built without CUDA",
                                          device_name(plan.device())));
#endif
}

}  // namespace moekit

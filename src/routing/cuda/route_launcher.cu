// Launcher of the fused router (route_kernel.cuh): picks the kernel instance for the logits dtype and expert count
// from a constexpr table, sizes the grid (one CTA for small T, a co-resident cooperative grid for large T), and
// launches once on the caller's stream. No allocation or synchronization per call: the occupancy query and the
// shared-memory attribute are cached per kernel instance; the workspace comes with the plan (RoutePlan allocates
// route_cuda_workspace_ints() zeroed int32 for CUDA plans).
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "moekit/error.h"
#include "route_cuda.h"
#include "route_kernel.cuh"

namespace moekit::detail {
namespace {

using router::Bf16;
using router::RouteParams;
using router::SmemLayout;
using KernelFn = void (*)(RouteParams);

struct KernelEntry {
  DType dtype;
  int chunks;    // NC: 16-byte vectors per lane
  int max_ctas;  // grid bound of the instance (its step C registers)
  KernelFn fn;
};

template <class In, int NC>
constexpr KernelEntry entry(DType dtype) {
  return {dtype, NC, router::kMaxCtasOf<In, NC>, router::route_fused_kernel<In, NC>};
}

// Expert capacity of an entry: 32 lanes * NC vectors * (16 / sizeof(element)).
constexpr std::array<KernelEntry, 7> kKernels{{
    entry<float, 1>(DType::f32),
    entry<float, 2>(DType::f32),
    entry<float, 4>(DType::f32),
    entry<float, 8>(DType::f32),
    entry<Bf16, 1>(DType::bf16),
    entry<Bf16, 2>(DType::bf16),
    entry<Bf16, 4>(DType::bf16),
}};

void check(cudaError_t err, const char* what) {
  // std::string, not fmt: fmt's compile-time format strings do not build under nvcc in C++20 mode.
  if (err != cudaSuccess) throw CudaError("route", std::string(what) + " failed: " + cudaGetErrorString(err));
}

const KernelEntry& pick_kernel(DType dtype, int experts) {
  const int per_chunk = 32 * 16 / dtype_size(dtype);
  for (const KernelEntry& k : kKernels)
    if (k.dtype == dtype && k.chunks * per_chunk >= experts) return k;
  throw NotSupported("route", "logits dtype " + std::string(dtype_name(dtype)) + " with num_experts (" +
                                  std::to_string(experts) + ") has no CUDA kernel");
}

// Per (kernel, device): the dynamic shared-memory limit is raised once to the largest layout any shape needs (a
// per-shape value would be undone by the next shape); per (kernel, device, bytes): the co-resident CTA count.
int max_coresident_ctas(const KernelEntry& k, int smem_bytes, int device) {
  static std::mutex mu;
  static std::map<std::tuple<KernelFn, int, int>, int> cache;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(k.fn, device, smem_bytes);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  const auto attr_key = std::make_tuple(k.fn, device, -1);
  if (cache.find(attr_key) == cache.end()) {
    const int largest = SmemLayout::make(kMaxExperts, kMaxExperts + kMaxSlots, true).total;
    check(cudaFuncSetAttribute(k.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, largest),
          "cudaFuncSetAttribute(route_fused_kernel)");
    cache.emplace(attr_key, largest);
  }
  int per_sm = 0, sms = 0;
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k.fn, router::kThreads, smem_bytes),
        "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  const int ctas = std::min(k.max_ctas, std::max(1, per_sm * sms));
  cache.emplace(key, ctas);
  return ctas;
}

// Rows of sorted_slots for T tokens (the formula of plan_capacity()).
int64_t capacity_rows(int64_t tokens, int experts, int slots, int groups, int block) {
  const int64_t routed = tokens * slots;
  const int64_t rows = routed + std::min<int64_t>(groups, routed) * (block - 1);
  return (rows + block - 1) / block * block;
}

RouteCudaTuning g_tuning;
int g_last_ctas = 0;

}  // namespace

int64_t route_cuda_workspace_ints(const PlanShape& shape) {
  return static_cast<int64_t>(router::kMaxCtas) * shape.num_experts + 64;
}

void set_route_cuda_tuning(const RouteCudaTuning& tuning) { g_tuning = tuning; }
int route_cuda_last_ctas() { return g_last_ctas; }

void route_cuda(const RoutingConfig& cfg, const TensorView& logits, const TensorView& bias, RoutePlanView& plan,
                Stream stream, const TensorView& replay) {
  auto* s = static_cast<cudaStream_t>(stream);
  const int64_t T = logits.size(0);
  const int E = cfg.num_experts;
  const KernelEntry& kernel = pick_kernel(logits.dtype, E);

  RouteParams p;
  p.logits = logits.data;
  p.row_stride = logits.stride(0);
  p.bias = bias.present() ? bias.data : nullptr;
  p.bias_bf16 = bias.present() && bias.dtype == DType::bf16;
  p.tokens = static_cast<int>(T);
  p.experts = E;
  p.top_k = cfg.top_k;
  p.slots = cfg.slots();
  p.groups = E + cfg.num_shared_experts;
  p.block = plan.shape.block;
  p.method = static_cast<int>(cfg.method);
  p.renormalize = cfg.renormalize;
  p.scale = cfg.routed_scaling_factor;
  p.n_group = cfg.method == RoutingMethod::sigmoid_grouped ? cfg.n_group : 1;
  p.topk_group = cfg.method == RoutingMethod::sigmoid_grouped ? cfg.topk_group : 1;
  p.grouped = p.topk_group < p.n_group;
  p.group_size = E / p.n_group;
  p.group_magic = static_cast<uint32_t>(((uint64_t{1} << 32) + p.group_size - 1) / p.group_size);
  const int vec = 16 / dtype_size(logits.dtype);
  p.vector_ok = reinterpret_cast<uintptr_t>(logits.data) % 16 == 0 &&
                (logits.stride(0) * dtype_size(logits.dtype)) % 16 == 0 && E % vec == 0;
  p.capacity = capacity_rows(T, E, p.slots, p.groups, p.block);
  p.topk_ids = plan.topk_ids;
  p.topk_weights = plan.topk_weights;
  p.expert_counts = plan.expert_counts;
  p.expert_offsets = plan.expert_offsets;
  p.sorted_slots = plan.sorted_slots;
  p.slot_rows = plan.slot_rows;
  p.block_experts = plan.block_experts;
  p.extent = plan.extent;
  p.replay = replay.present() ? static_cast<int16_t*>(replay.data) : nullptr;

  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  const SmemLayout layout = SmemLayout::make(E, p.groups, p.grouped);
  const int max_ctas = max_coresident_ctas(kernel, layout.total, device);
  // Grid: one CTA up to 8 tokens (the grid barriers cost more than they save there); above, at least one token
  // per warp and at least min(T, 32) CTAs, since a token costs a warp thousands of instructions and 16 busy warps
  // share an SM's 4 schedulers. Fitted to the CTA sweep in docs/benchmarks.md (H200): e.g. T=128 17.0 us at 32
  // CTAs vs 19.7 at 16; T=1024 18.6 us at 64 vs 24.5 at 32; T=8 10.7 us on 1 CTA vs 16.5 on 8.
  const int64_t by_warps = (T + router::kWarps - 1) / router::kWarps, by_sm = std::min<int64_t>(32, T);
  int ctas = T <= 8 ? 1 : static_cast<int>(std::min<int64_t>(max_ctas, std::max(by_warps, by_sm)));
  if (g_tuning.ctas > 0) ctas = std::min(g_tuning.ctas, max_ctas);
  ctas = std::max(ctas, 1);
  p.tokens_per_cta = static_cast<int>((T + ctas - 1) / ctas);
  ctas = std::max<int64_t>(1, (T + std::max(p.tokens_per_cta, 1) - 1) / std::max(p.tokens_per_cta, 1));
  p.tokens_per_warp = (p.tokens_per_cta + router::kWarps - 1) / router::kWarps;
  if (p.tokens_per_cta > 65535)
    throw NotSupported("route", "tokens (" + std::to_string(T) + ") must be <= " +
                                    std::to_string(65535LL * max_ctas) + " on this GPU");
  if (ctas > 1) {
    int32_t* ws = plan.workspace;
    if (ws == nullptr)
      throw Internal("route", "a CUDA plan must carry the router's workspace (RoutePlan allocates it)");
    p.barrier = reinterpret_cast<uint32_t*>(ws);
    p.cta_hist = ws + 64;
  }

  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(ctas));
  config.blockDim = dim3(router::kThreads);
  config.dynamicSmemBytes = static_cast<size_t>(layout.total);
  config.stream = s;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeCooperative;
  attr.val.cooperative = 1;
  config.attrs = &attr;
  config.numAttrs = ctas > 1 ? 1 : 0;
  check(cudaLaunchKernelEx(&config, kernel.fn, p), "launch of route_fused_kernel");
  check(cudaGetLastError(), "route_fused_kernel");
  g_last_ctas = ctas;
  plan.tokens = T;
}

}  // namespace moekit::detail

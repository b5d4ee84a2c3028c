// Launcher of the fused router (route_kernel.cuh): picks the kernel instance for the logits dtype and expert count
// from a constexpr table, sizes the grid (one CTA for small T, building its plan in one step when T * Kt <= 32;
// else a few tokens per CTA up to a co-resident cooperative grid), and launches once on the caller's stream. No
// allocation or synchronization per call: the occupancy query and the shared-memory attribute are cached per kernel
// instance; the workspace comes with the plan (RoutePlan allocates route_cuda_workspace_ints() zeroed int32 for CUDA
// plans).
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
  bool sigmoid;  // keys are sigmoid(logit) + bias (sigmoid_grouped), else logit + bias
  KernelFn fn;
};

template <class In, int NC, bool kSigmoid>
constexpr KernelEntry entry(DType dtype) {
  return {dtype, NC, kSigmoid, router::route_fused_kernel<In, NC, kSigmoid>};
}

// Expert capacity of an entry: 32 lanes * NC vectors * (16 / sizeof(element)).
constexpr std::array<KernelEntry, 14> kKernels{{
    entry<float, 1, false>(DType::f32),
    entry<float, 2, false>(DType::f32),
    entry<float, 4, false>(DType::f32),
    entry<float, 8, false>(DType::f32),
    entry<Bf16, 1, false>(DType::bf16),
    entry<Bf16, 2, false>(DType::bf16),
    entry<Bf16, 4, false>(DType::bf16),
    entry<float, 1, true>(DType::f32),
    entry<float, 2, true>(DType::f32),
    entry<float, 4, true>(DType::f32),
    entry<float, 8, true>(DType::f32),
    entry<Bf16, 1, true>(DType::bf16),
    entry<Bf16, 2, true>(DType::bf16),
    entry<Bf16, 4, true>(DType::bf16),
}};

void check(cudaError_t err, const char* what) {
  // std::string, not fmt: fmt's compile-time format strings do not build under nvcc in C++20 mode.
  if (err != cudaSuccess) throw CudaError("route", std::string(what) + " failed: " + cudaGetErrorString(err));
}

const KernelEntry& pick_kernel(DType dtype, int experts, bool sigmoid) {
  const int per_chunk = 32 * 16 / dtype_size(dtype);
  for (const KernelEntry& k : kKernels)
    if (k.dtype == dtype && k.sigmoid == sigmoid && k.chunks * per_chunk >= experts) return k;
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
    const int largest = SmemLayout::make(kMaxExperts, kMaxExperts + kMaxSlots, true, router::kInfoCap).total;
    check(cudaFuncSetAttribute(k.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, largest),
          "cudaFuncSetAttribute(route_fused_kernel)");
    cache.emplace(attr_key, largest);
  }
  int per_sm = 0, sms = 0;
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k.fn, router::kThreads, smem_bytes),
        "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  const int ctas = std::min(router::kMaxCtas, std::max(1, per_sm * sms));
  cache.emplace(key, ctas);
  return ctas;
}

// Grid heuristic (docs/benchmarks.md "## Router" has the sweep it was checked against on the H200).
// Measured on the H200: sigmoid_grouped E=256 K=8: T=32 on 1/2/4/16 CTAs 23.4/19.6/18.5/18.3 us; T=64 on 4/16/64
// CTAs 20.9/19.7/20.0 us; T=1024 on 64/128/256 CTAs 20.8/20.6/21.4 us. softmax_topk E=512 K=10: T=8 on 1/2 CTAs
// 11.0/13.1 us; T=128 on 8/32/64/128 CTAs 15.5/15.1/15.1/16.6 us; T=512 on 32/64/128 CTAs 15.4/14.9/16.4 us.
constexpr int64_t kSingleCtaTokens = router::kWarps;
constexpr int64_t kSmallGridTokens = 128;
constexpr int64_t kTokensPerCtaSmall = 4, kTokensPerCtaLarge = 8;
constexpr int64_t kMaxGridCtas = 1 << 20;  // no bound of its own: the co-resident limit decides

RouteCudaTuning g_tuning;
int g_last_ctas = 0;
bool g_last_tiny_plan = false;

}  // namespace

// Layout: [0, 64) barrier words; [64, 64 + 2 * e8) expert totals, two generations; then kMaxCtas rows of e8
// uint16 per-CTA counts (16-byte aligned: 64 and e8 are multiples of 8 ints).
int64_t route_cuda_workspace_ints(const PlanShape& shape) {
  const int64_t e8 = router::pad8(shape.num_experts);
  return 64 + 2 * e8 + router::kMaxCtas * e8 / 2;
}

static_assert(kRouteTracePoints == router::kTracePoints);
int64_t route_cuda_trace_words() {
  return int64_t{router::kMaxCtas} * router::kTracePoints * 2;
}

void set_route_cuda_tuning(const RouteCudaTuning& tuning) {
  g_tuning = tuning;
}
int route_cuda_last_ctas() {
  return g_last_ctas;
}
bool route_cuda_last_tiny_plan() {
  return g_last_tiny_plan;
}

void route_cuda(const RoutingConfig& cfg, const TensorView& logits, const TensorView& bias, RoutePlanView& plan,
                int64_t capacity, Stream stream, const TensorView& replay) {
  auto* s = static_cast<cudaStream_t>(stream);
  const int64_t T = logits.size(0);
  const int E = cfg.num_experts;
  const KernelEntry& kernel = pick_kernel(logits.dtype, E, cfg.method == RoutingMethod::sigmoid_grouped);

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
  p.group_magic = routing_math::division_magic(static_cast<uint32_t>(p.group_size));
  const int vec = 16 / dtype_size(logits.dtype);
  // Groups of whole lanes (group size = a power-of-two count of lanes' values) are limited in registers.
  const int lanes = p.group_size / vec;
  if (p.grouped && p.n_group <= 32 && p.group_size % vec == 0 && lanes <= 32 && (lanes & (lanes - 1)) == 0)
    p.group_lanes = lanes;
  p.vector_ok = reinterpret_cast<uintptr_t>(logits.data) % 16 == 0 &&
                (logits.stride(0) * dtype_size(logits.dtype)) % 16 == 0 && E % vec == 0;
  p.capacity = capacity;
  p.topk_ids = plan.topk_ids;
  p.topk_weights = plan.topk_weights;
  p.expert_counts = plan.expert_counts;
  p.expert_offsets = plan.expert_offsets;
  p.sorted_slots = plan.sorted_slots;
  p.slot_rows = plan.slot_rows;
  p.block_experts = plan.block_experts;
  p.extent = plan.extent;
  p.replay = replay.present() ? static_cast<int16_t*>(replay.data) : nullptr;

  const bool shared_groups = p.grouped && p.group_lanes == 0;
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  // Grid: one CTA while every warp has at most one token (no grid barrier, no cross-CTA scan); above, a few tokens
  // per CTA up to the co-resident grid: fewer busy warps per SM shorten each token's latency (the per-token path
  // is a dependent chain stalled on instruction fetch and fixed latencies, not on issue).
  const int64_t per_cta = T <= kSmallGridTokens ? kTokensPerCtaSmall : kTokensPerCtaLarge;
  int ctas =
      T <= kSingleCtaTokens ? 1 : static_cast<int>(std::min<int64_t>(kMaxGridCtas, (T + per_cta - 1) / per_cta));
  if (g_tuning.ctas > 0) ctas = g_tuning.ctas;
  // The co-resident bound depends on the shared memory, which depends on the tokens per CTA: size with the
  // largest layout first, then settle the grid.
  const int max_ctas =
      max_coresident_ctas(kernel, SmemLayout::make(E, p.groups, shared_groups, router::kInfoCap).total, device);
  ctas = std::max(1, std::min(ctas, max_ctas));
  p.tokens_per_cta = static_cast<int>((T + ctas - 1) / ctas);
  const int64_t tpc = std::max(p.tokens_per_cta, 1);
  ctas = static_cast<int>(std::max<int64_t>(1, (T + tpc - 1) / tpc));
  p.tokens_per_warp = (p.tokens_per_cta + router::kWarps - 1) / router::kWarps;
  if (p.tokens_per_cta > 65535)  // per-CTA counts and per-warp ranks are uint16
    throw NotSupported("route", "tokens (" + std::to_string(T) +
                                    ") must be <= " + std::to_string(65535LL * max_ctas) + " on this GPU");
  p.tiny = ctas == 1 && T * p.slots <= 32;
  p.slot_magic = routing_math::division_magic(static_cast<uint32_t>(p.slots));
  p.block_magic = routing_math::division_magic(static_cast<uint32_t>(p.block));
  const int64_t info = static_cast<int64_t>(p.tokens_per_cta) * p.top_k;
  p.info_words = info <= router::kInfoCap ? static_cast<int>(info) : 0;
  const SmemLayout layout = SmemLayout::make(E, p.groups, shared_groups, p.info_words);
  if (ctas > 1) {
    int32_t* ws = plan.workspace;
    if (ws == nullptr)
      throw Internal("route", "a CUDA plan must carry the router's workspace (RoutePlan allocates it)");
    p.barrier = reinterpret_cast<uint32_t*>(ws);
    p.totals = ws + 64;
    p.cta_rows = reinterpret_cast<uint16_t*>(ws + 64 + 2 * router::pad8(E));
  }

  p.trace = g_tuning.trace;

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
  g_last_tiny_plan = p.tiny != 0;
  plan.tokens = T;
}

}  // namespace moekit::detail

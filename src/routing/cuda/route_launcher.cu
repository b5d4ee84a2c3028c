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
constexpr int kPairLanes = 16;  // lanes per token when a warp routes two tokens at once

struct KernelEntry {
  DType dtype;
  int chunks;    // NC: 16-byte vectors per lane
  bool sigmoid;  // keys are sigmoid(logit) + bias (sigmoid_grouped), else logit + bias
  KernelFn fn;
  KernelFn decode_plan;    // calls of at most router::kDecodeTokens tokens and 32 slots
  KernelFn decode_counts;  // other calls of at most router::kDecodeTokens tokens on one CTA
  KernelFn token_masks;    // other calls of one token per warp
  KernelFn pairs;          // two tokens per warp (teams of 16 lanes, twice the chunks), or null
};

template <class In, int NC, bool kSigmoid>
constexpr KernelEntry entry(DType dtype) {
  using router::Instance;
  // Two tokens per warp where a lane then holds at most 16 values: the chunks double, so the registers of the
  // instances with 16 values per lane (seed6's E = 512) suffice. With 32 values per lane (E = 512 with 16-lane teams)
  // the instances compile without spills (96-121 registers), but they select by K rounds of argmax (the threshold
  // selection exists for at most 16 values per lane): 1.54-1.96x slower at T = 2048-16384 (H200, docs/benchmarks.md,
  // "Twenty-third session").
  KernelFn pairs = nullptr;
  if constexpr (router::kValuesPerLane<In, NC> <= 8)
    pairs = router::route_fused_kernel<In, 2 * NC, kSigmoid, Instance::general, kPairLanes>;
  return {dtype,
          NC,
          kSigmoid,
          router::route_fused_kernel<In, NC, kSigmoid, Instance::general>,
          router::route_fused_kernel<In, NC, kSigmoid, Instance::decode_plan>,
          router::route_fused_kernel<In, NC, kSigmoid, Instance::decode_counts>,
          router::route_fused_kernel<In, NC, kSigmoid, Instance::token_masks>,
          pairs};
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
// per-shape value would be undone by the next shape); per (kernel, device, bytes): the co-resident CTA count and the
// SM count.
struct GridLimits {
  int ctas = 1;  // co-resident CTAs (the cooperative launch's bound)
  int sms = 1;
};
GridLimits grid_limits(const KernelEntry& k, KernelFn fn, int smem_bytes, int device) {
  static std::mutex mu;
  static std::map<std::tuple<KernelFn, int, int>, GridLimits> cache;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(fn, device, smem_bytes);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  const auto attr_key = std::make_tuple(k.fn, device, -1);
  if (cache.find(attr_key) == cache.end()) {
    // Every instance of the entry (teams per CTA: a warp each, or two per warp for the pair instance) may take the
    // largest layout of its teams.
    const std::pair<KernelFn, int> instances[] = {{k.fn, router::kWarps},
                                                  {k.decode_plan, router::kWarps},
                                                  {k.decode_counts, router::kWarps},
                                                  {k.token_masks, router::kWarps},
                                                  {k.pairs, router::kThreads / kPairLanes}};
    for (const auto& [f, teams] : instances)
      if (f != nullptr)
        check(cudaFuncSetAttribute(
                  f, cudaFuncAttributeMaxDynamicSharedMemorySize,
                  SmemLayout::make(kMaxExperts, kMaxExperts + kMaxSlots, true, router::kInfoCap, teams).total),
              "cudaFuncSetAttribute(route_fused_kernel)");
    cache.emplace(attr_key, GridLimits{});
  }
  int per_sm = 0, sms = 0;
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, router::kThreads, smem_bytes),
        "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  const GridLimits limits{std::min(router::kMaxCtas, std::max(1, per_sm * sms)), std::max(1, sms)};
  cache.emplace(key, limits);
  return limits;
}

// Grid heuristic: one CTA while every warp has at most one token; then 4 tokens per CTA up to T = 96, 8 up to 512
// and 16 above, at most one CTA per SM while that leaves at most 64 tokens per CTA, and up to the co-resident grid
// beyond (two CTAs per SM where the kernel fits twice). Sweep on the H200 (thirteenth session, kernel us, cold L2):
// seed6 K10 T = 1024 on 64 / 128 CTAs 11.87 / 13.15; dsv3 T = 2048 on 128 / 256 CTAs 12.35 / 14.91, T = 4096
// 15.26 / 17.28, T = 8192 on 131 / 256 21.02 / 22.21, T = 16384 on 132 / 261 32.64 / 32.29; E = 128 K = 8 T = 2048
// on 128 / 256 9.60 / 11.71, T = 16384 on 132 / 261 25.31 / 21.76; dsv3 T = 512 on 32 / 64 10.59 / 9.95. With the
// token-mask instance on grids (forty-third session, `bench route --ctas`, medians of three runs, 8 against 4 tokens
// per CTA): T = 112 / 128 0.983-0.988 / 0.980-0.983 of the time on dsv3, E = 512 K = 10 and E = 512 K = 8; T = 72-96
// 0.987-1.017 (E = 512 K = 10 at T = 96 1.017), hence 8 tokens per CTA above T = 96. T = 256 best on 32 CTAs; T = 512
// on 32 / 64 E = 512 K = 10 8.75 / 9.02 but dsv3 8.35 / 8.30; T = 1024 best on 64.
constexpr int64_t kSingleCtaTokens = router::kWarps;
constexpr int64_t kSmallGridTokens = 96, kMidGridTokens = 512;
constexpr int64_t kTokensPerCtaSmall = 4, kTokensPerCtaMid = 8, kTokensPerCtaLarge = 16;
constexpr int64_t kTokensPerCtaBeforeSecondOnSm = 64;

RouteCudaTuning g_tuning;
int g_last_ctas = 0;
bool g_last_tiny_plan = false;
bool g_last_pairs = false;
bool g_last_token_masks = false;

}  // namespace

// Layout (int32 units): [0, 64) the grid barrier's words (kRouteEpochWord, kRouteArrivalsWord; the rest unused);
// [64, 64 + 2 * e8) expert totals, two buffers; then kMaxCtas rows of e8 uint16 per-CTA counts (16-byte aligned:
// 64 and e8 are multiples of 8 ints).
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
bool route_cuda_last_pairs() {
  return g_last_pairs;
}
bool route_cuda_last_token_masks() {
  return g_last_token_masks;
}
bool route_cuda_pairs_pay(bool sigmoid_grouped, int64_t tokens, int ctas, int sms) {
  if (ctas < 1) return false;
  return sigmoid_grouped ? ctas > sms : (tokens + ctas - 1) / ctas > router::kWarps;
}

void route_cuda(const RoutingConfig& cfg, const TensorView& logits, const TensorView& bias, RoutePlanView& plan,
                int64_t capacity, Stream stream, const TensorView& replay, int device) {
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
  // Grid (see the heuristic's constants): one CTA while every warp has at most one token (no grid barrier, no
  // cross-CTA scan); above, a few tokens per CTA: fewer busy warps per SM shorten each token's latency (the per-token
  // path is a dependent chain stalled on fixed latencies, not on issue). The co-resident bound depends on the shared
  // memory, which depends on the tokens per CTA: it is taken with the largest layout. A forced grid (tuning) is
  // bounded by the co-resident grid only.
  const int64_t per_cta = T <= kSmallGridTokens ? kTokensPerCtaSmall
                          : T <= kMidGridTokens ? kTokensPerCtaMid
                                                : kTokensPerCtaLarge;
  GridLimits limits;
  auto grid = [&](KernelFn fn, int teams) {
    limits =
        grid_limits(kernel, fn, SmemLayout::make(E, p.groups, shared_groups, router::kInfoCap, teams).total, device);
    const int one_per_sm = std::min(limits.ctas, limits.sms);
    const int heuristic_max = T <= kTokensPerCtaBeforeSecondOnSm * limits.sms ? one_per_sm : limits.ctas;
    int n =
        T <= kSingleCtaTokens ? 1 : static_cast<int>(std::min<int64_t>(heuristic_max, (T + per_cta - 1) / per_cta));
    if (g_tuning.ctas > 0) n = g_tuning.ctas;
    return std::max(1, std::min(n, limits.ctas));
  };
  int teams = router::kWarps;
  int ctas = grid(kernel.fn, teams);
  // Two tokens per warp (a team of 16 lanes routes each; the per-token steps across lanes, sort, scans and
  // reductions, serve two tokens at once) where the grid gives a warp more than one token, T > 2048 on 132 SMs. A
  // lane then holds twice the values, which costs more than it saves in the sigmoid_grouped instances (sigmoid and
  // group scores per value) until their grid takes two CTAs per SM (T > 64 per SM). Sweep on the H200
  // (twenty-second session, kernel us, cold L2, --pairs never / always): E = 8 K = 2 and E = 128 K = 4 / 8 at
  // T = 3072-16384 0.83-0.99x (T = 2048, one token per warp: 1.01-1.04x; E = 128 K = 8 at T = 16384 1.011x); dsv3
  // (E = 256 sigmoid_grouped) at T = 2048-6144 1.05-1.16x, 8192 1.00-1.02x, 16384 0.94-0.97x. The team must hold
  // every slot (Kt <= 16) and, with group limiting, whole groups of lanes (at most 16 groups).
  const bool pairs_fit =
      kernel.pairs != nullptr && p.slots <= kPairLanes &&
      (!p.grouped || (p.group_lanes > 0 && p.group_lanes <= kPairLanes && p.n_group <= kPairLanes));
  const bool pairs =
      pairs_fit &&
      (g_tuning.pairs == RoutePairs::always ||
       (g_tuning.pairs == RoutePairs::heuristic && route_cuda_pairs_pay(kernel.sigmoid, T, ctas, limits.sms)));
  if (pairs) {
    teams = router::kThreads / kPairLanes;
    ctas = grid(kernel.pairs, teams);
  }
  p.tokens_per_cta = static_cast<int>((T + ctas - 1) / ctas);
  const int64_t tpc = std::max(p.tokens_per_cta, 1);
  ctas = static_cast<int>(std::max<int64_t>(1, (T + tpc - 1) / tpc));
  p.tokens_per_team = (p.tokens_per_cta + teams - 1) / teams;
  if (p.tokens_per_cta > 65535)  // per-CTA counts and per-warp ranks are uint16
    throw NotSupported("route", "tokens (" + std::to_string(T) +
                                    ") must be <= " + std::to_string(65535LL * limits.ctas) + " on this GPU");
  p.tiny = ctas == 1 && T * p.slots <= 32;
  p.slot_magic = routing_math::division_magic(static_cast<uint32_t>(p.slots));
  p.block_magic = routing_math::division_magic(static_cast<uint32_t>(p.block));
  p.team_tokens_magic = routing_math::division_magic(static_cast<uint32_t>(std::max(p.tokens_per_team, 1)));
  p.small_plan = capacity + p.block < (int64_t{1} << 16);
  const int64_t plan_blocks = capacity / p.block;  // the capacity is a multiple of B
  p.plan_blocks = static_cast<int>(plan_blocks);
  p.prefill_blocks = static_cast<int>((plan_blocks + ctas - 1) / ctas);
  p.octet_magic = routing_math::division_magic(static_cast<uint32_t>(router::pad8(E) / 8));
  const int64_t info = static_cast<int64_t>(p.tokens_per_cta) * p.top_k;
  p.info_words = info <= router::kInfoCap ? static_cast<int>(info) : 0;
  const SmemLayout layout = SmemLayout::make(E, p.groups, shared_groups, p.info_words, teams);
  if (ctas > 1) {
    int32_t* ws = plan.workspace;
    if (ws == nullptr)
      throw Internal("route", "a CUDA plan must carry the router's workspace (RoutePlan allocates it)");
    p.epoch = reinterpret_cast<uint32_t*>(ws + kRouteEpochWord);
    p.arrivals = reinterpret_cast<uint32_t*>(ws + kRouteArrivalsWord);
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
  KernelFn fn = pairs ? kernel.pairs : kernel.fn;
  // One token per warp: the decode instances on one CTA of at most 8 tokens, else the token-mask instance (H200,
  // kernel us, cold L2, against the general instance: one CTA, T = 9-16, 0.879-0.912x on E = 128-512 and 0.958x on
  // E = 1024 K = 32 (forty-first session); grids of T = 17-2048 on the fixtures and E = 256 / 512, 0.969-0.981x,
  // paired runs in both orders (forty-third session)).
  if (!pairs && p.tokens_per_team == 1 && !g_tuning.general_only) {
    if (ctas == 1 && T <= router::kDecodeTokens)
      fn = p.tiny ? kernel.decode_plan : kernel.decode_counts;
    else if (!p.tiny)
      fn = kernel.token_masks;
  }
  check(cudaLaunchKernelEx(&config, fn, p), "launch of route_fused_kernel");
  check(cudaGetLastError(), "route_fused_kernel");
  g_last_ctas = ctas;
  g_last_tiny_plan = p.tiny != 0;
  g_last_pairs = pairs;
  g_last_token_masks = fn == kernel.token_masks;
  plan.tokens = T;
}

}  // namespace moekit::detail

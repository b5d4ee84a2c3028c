// The grouped path's memory-bound stages: gather (hidden rows into the plan's grouped order), bias + gated
// activation over GEMM1's [rows, 2I] output, and the deterministic combine, all in 16-byte vectors. Each pass
// walks the call's tokens or token slots (T and T x (K + S) are known on the host), never the plan's padded rows,
// and other ranks' slots return at once, so nothing needs a host sync.
#include <cuda_runtime.h>

#include "experts/cuda/experts_device.cuh"
#include "experts/cuda/grouped_problems.cuh"
#include "experts/row_slices.h"

namespace moekit::detail {
namespace {

// Gather and activation: one warp per slice of a token's row (gather) or of a plan row (activation), kWarpsPerCta
// of them per CTA, each lane walking 16-byte chunks four at a time in the gather (two passes) and two at a time in
// the activation (a step's loads go out before any is used). Four in the gather took 0.94-1.00x of its time at
// T = 1024-16384 (most cells 0.98-0.99x); four in the activation 1.07-1.25x, two rows per warp (78 registers)
// 0.99-1.24x (H200, docs/benchmarks.md, "Twenty-third session").
// A warp's lookups are broadcast loads; a CTA per row spent most of its life in that lookup chain. Rows are split
// over gridDim.y warps only when there are few of them: a whole row per warp left wide rows (H = 7168, I = 14336)
// to a few warps at small T, and slices of many rows repeat the lookups (the activation always split: 10-17% slower
// at T = 4096).
constexpr int kWarpsPerCta = 8;
constexpr int64_t kActWarps = 16384;    // the activation splits rows until about this many warps are launched
constexpr int64_t kGatherWarps = 4096;  // the gather: T >= 4096 keeps a warp per token

/// Eight bf16 values times `s`, each rounded once to bf16.
__device__ __forceinline__ uint4 scaled_bf16x8(const uint4& x, float s) {
  Bf16x8 f = load_bf16x8(&x);
#pragma unroll
  for (int i = 0; i < 8; ++i) f.v[i] *= s;
  uint4 out;
  store_bf16x8(&out, f.v);
  return out;
}

// Hidden row t (this warp's slice of it) is read once and written to the a1 row of each of its local slots. Folding
// this pass into GEMM1's main loop (rows copied from the hidden states by per-row TMA or by cp.async) was measured
// 1.0-2.7x slower than this pass plus the TMA-fed GEMM1 (H200, docs/benchmarks.md "Twelfth session"). The
// passes are launched as dependents of the kernel before them (launch_dependent: no launch gap) and wait before they
// read what it wrote. The CUTLASS GEMMs between them are ordinary launches: launched as dependents they ran 2-7%
// slower at T = 4096 (H200, docs/benchmarks.md), so the passes do not let them start early either.
// The grid has one more column of CTAs, whose first fills both GEMMs' per-group arrays beside the gather: as a
// kernel of its own before the gather, the fill's 1.5-2.6 us lay on every call's critical path.
__global__ void __launch_bounds__(kWarpsPerCta * 32) gather_tokens_kernel(GatherParams p) {
  wait_for_predecessor();
  const int64_t token_ctas = (p.plan.tokens + kWarpsPerCta - 1) / kWarpsPerCta;
  if (blockIdx.x == token_ctas) {  // the fill's column
    if (blockIdx.y == 0) fill_grouped_problems(p.fill, static_cast<int>(threadIdx.x), kWarpsPerCta * 32);
    return;
  }
  const int lane = threadIdx.x & 31;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kWarpsPerCta + (threadIdx.x >> 5);
  if (t >= p.plan.tokens) return;
  const int vecs = p.hidden_size / 8;
  constexpr int kPassVecs = kRowPass / 8;
  const RowRange slice = row_slice_range(p.hidden_size, static_cast<int>(blockIdx.y), static_cast<int>(gridDim.y));
  const int begin = slice.begin / 8, end = slice.end / 8;  // in 16-byte vectors (H is a multiple of 8)
  const uint4* src = static_cast<const uint4*>(p.hidden) + t * vecs;
  uint4* a1 = static_cast<uint4*>(p.a1);
  constexpr int kChunks = 2 * kPassVecs / 32;  // per lane: two passes' 16-byte chunks
  uint4 x[kChunks];
  auto load = [&](int base) {
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const int v = base + lane + 32 * j;
      x[j] = v < end ? src[v] : uint4{};
    }
  };
  // The first chunks, the slot's expert and its row are requested together: three independent loads, one round
  // trip (the row used to wait for the expert check, and the hidden row for both).
  load(begin);
  const int kt = p.plan.slots;
  int row = -1;
  float scale = 1.0f;  // weight_on_input: the routed slot's weight
  if (lane < kt) {
    const int id = p.plan.topk_ids[t * kt + lane];
    row = p.plan.slot_rows[t * kt + lane];
    if (local_expert(p.map, id) < 0) row = -1;
    if (p.weight_on_input) {  // loaded whatever the id (a load under a predicate on the id waits for the id)
      const float weight = p.plan.topk_weights[t * kt + lane];
      scale = routed_expert(p.map, id) ? weight : 1.0f;
    }
  }
  const uint32_t local = __ballot_sync(0xffffffffu, row >= 0);
  for (int base = begin; base < end; base += 32 * kChunks) {  // warp-uniform trip count: every lane shuffles
    if (base != begin) load(base);
    for (uint32_t m = local; m != 0; m &= m - 1) {
      const int64_t r = __shfl_sync(0xffffffffu, row, __ffs(m) - 1);
      // weight_on_input (uniform): the slot's row scaled by its weight, rounded once to bf16.
      const float s = p.weight_on_input ? __shfl_sync(0xffffffffu, scale, __ffs(m) - 1) : 1.0f;
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        const int v = base + lane + 32 * j;
        if (v < end) a1[r * vecs + v] = p.weight_on_input ? scaled_bf16x8(x[j], s) : x[j];
      }
    }
  }
}

/// Gate and up inputs of outputs [i0, i0 + 8) of one row: GEMM1's columns and their biases, split by layout.
struct GateUp8 {
  uint4 a, b;  // gate and up columns, or the 16 interleaved (gate, up) columns

  __device__ __forceinline__ void load(const __nv_bfloat16* c1, GateUpLayout layout, int i0, int inter) {
    if (layout == GateUpLayout::interleaved) {
      a = *reinterpret_cast<const uint4*>(c1 + 2 * i0);
      b = *reinterpret_cast<const uint4*>(c1 + 2 * i0 + 8);
    } else {
      a = *reinterpret_cast<const uint4*>(c1 + gate_column(layout, i0, inter));
      b = *reinterpret_cast<const uint4*>(c1 + up_column(layout, i0, inter));
    }
  }

  __device__ __forceinline__ void apply(const ActivationKernelParams& p, int64_t bias_base, int i0, void* out) const {
    const bool interleaved = p.layout == GateUpLayout::interleaved;
    float bias_a[8], bias_b[8];
    load_bias8(p.b13, bias_base + (interleaved ? 2 * i0 : gate_column(p.layout, i0, p.intermediate)), bias_a);
    load_bias8(p.b13, bias_base + (interleaved ? 2 * i0 + 8 : up_column(p.layout, i0, p.intermediate)), bias_b);
    const Bf16x8 va = load_bf16x8(&a), vb = load_bf16x8(&b);
    float x[16];
#pragma unroll
    for (int j = 0; j < 8; ++j) x[j] = va.v[j] + bias_a[j], x[8 + j] = vb.v[j] + bias_b[j];
    const GatedActivation form = gated_activation_form(p.activation, p.act_params);
    float r[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      // interleaved: gate(i0 + j) and up(i0 + j) are columns 2j and 2j + 1 of the 16; else j and 8 + j.
      const float g = interleaved ? x[2 * j] : x[j];
      const float u = interleaved ? x[2 * j + 1] : x[8 + j];
      r[j] = gated_activation(form, g, u);
    }
    store_bf16x8(out, r);
  }
};

// Grid: (token slots / kWarpsPerCta, slices per row): a warp per slot of a token (T x (K + S) of them) and its
// plan row, so that padding rows launch nothing. A grid over the plan's rows (the host bound T x (K + S) + G x (B -
// 1)) was mostly padding at small T: 8,192 rows for qwen3-30b-a3b's 128 slots at T = 16. The plan was complete
// before this kernel launched, so the slot's expert and row are looked up first (two independent loads) and other
// ranks' slots exit at once; c1 is read only after GEMM1 is done.
__global__ void __launch_bounds__(kWarpsPerCta * 32) activation_slots_kernel(ActivationKernelParams p) {
  const int lane = threadIdx.x & 31;
  const int64_t slot = static_cast<int64_t>(blockIdx.x) * kWarpsPerCta + (threadIdx.x >> 5);
  if (slot >= p.plan.tokens * p.plan.slots) return;
  const int expert = local_expert(p.map, p.plan.topk_ids[slot]);
  const int64_t row = p.plan.slot_rows[slot];
  if (expert < 0 || row < 0) return;
  wait_for_predecessor();
  const int inter = p.intermediate;
  const __nv_bfloat16* c1 = static_cast<const __nv_bfloat16*>(p.c1) + row * 2 * inter;
  __nv_bfloat16* act = static_cast<__nv_bfloat16*>(p.act) + row * inter;
  const int64_t bias_base = static_cast<int64_t>(expert) * 2 * inter;
  const auto [begin, end] = row_slice_range(inter, static_cast<int>(blockIdx.y), static_cast<int>(gridDim.y));
  for (int i0 = begin + lane * 8; i0 < end; i0 += kRowPass) {
    const int i1 = i0 + 32 * 8;
    GateUp8 x0, x1;
    x0.load(c1, p.layout, i0, inter);
    if (i1 < end) x1.load(c1, p.layout, i1, inter);
    x0.apply(p, bias_base, i0, act + i0);
    if (i1 < end) x1.apply(p, bias_base, i1, act + i1);
  }
}

constexpr int kCombineThreads = 128;
// Slots whose rows are loaded before any is added (latency, not bandwidth, rules at small T).
constexpr int kCombineBatch = 8;

// One CTA per (token, kCombineThreads * 8 columns): several CTAs per token keep a single token's latency short.
__global__ void __launch_bounds__(kCombineThreads) combine_kernel(CombineParams p) {
  const int64_t t = blockIdx.x;
  const int kt = p.plan.slots;
  __shared__ int s_row[32];
  __shared__ int s_expert[32];
  __shared__ float s_weight[32];
  if (threadIdx.x < kt) {
    const int64_t slot = t * kt + threadIdx.x;
    const int id = p.plan.topk_ids[slot];
    s_expert[threadIdx.x] = local_expert(p.map, id);
    s_row[threadIdx.x] = p.plan.slot_rows[slot];
    // Loaded whatever the id: a load under a predicate on the id waited for the id's load (H100: the combine's
    // cold median +0.3-0.4 us on qwen3-next at T = 1, docs/benchmarks.md "Forty-seventh session").
    const float weight = p.plan.topk_weights[slot];
    const bool on_input = p.weight_on_input && routed_expert(p.map, id);  // the weight scaled the input
    s_weight[threadIdx.x] = on_input ? 1.0f : weight;
  }
  __syncthreads();
  wait_for_predecessor();  // y comes from GEMM2; the plan was complete before GEMM2 let this kernel start
  const int h = p.hidden;
  const int c0 = (blockIdx.y * kCombineThreads + threadIdx.x) * 8;
  if (c0 >= h) return;
  const __nv_bfloat16* y = static_cast<const __nv_bfloat16*>(p.y);
  float acc[8] = {};
  for (int j0 = 0; j0 < kt; j0 += kCombineBatch) {
    uint4 v[kCombineBatch];
#pragma unroll
    for (int b = 0; b < kCombineBatch; ++b) {
      const int j = j0 + b;
      v[b] = j < kt && s_expert[j] >= 0 ? *reinterpret_cast<const uint4*>(y + static_cast<int64_t>(s_row[j]) * h + c0)
                                        : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int b = 0; b < kCombineBatch; ++b) {  // slot order: the sum is deterministic
      const int j = j0 + b;
      if (j >= kt || s_expert[j] < 0) continue;
      const Bf16x8 f = load_bf16x8(&v[b]);
      const float w = s_weight[j];
      float bias[8];
      load_bias8(p.b2, static_cast<int64_t>(s_expert[j]) * h + c0, bias);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] += w * (f.v[i] + bias[i]);
    }
  }
  store_bf16x8(static_cast<__nv_bfloat16*>(p.out) + t * h + c0, acc);
}

}  // namespace

void launch_gather(const GatherParams& p, Stream stream) {
  if (p.plan.tokens == 0) return;
  const int64_t slices = row_slices(row_passes(p.hidden_size), p.plan.tokens, kGatherWarps);
  const int64_t token_ctas = (p.plan.tokens + kWarpsPerCta - 1) / kWarpsPerCta;
  const dim3 grid(static_cast<unsigned>(token_ctas + 1), static_cast<unsigned>(slices));
  launch_dependent(gather_tokens_kernel, grid, dim3(kWarpsPerCta * 32), stream, p, "gather_tokens_kernel");
}

void launch_activation(const ActivationKernelParams& p, Stream stream) {
  const int64_t slots = p.plan.tokens * p.plan.slots;
  if (slots == 0) return;
  const int64_t slices = row_slices(row_passes(p.intermediate), slots, kActWarps);
  const dim3 grid(static_cast<unsigned>((slots + kWarpsPerCta - 1) / kWarpsPerCta), static_cast<unsigned>(slices));
  launch_dependent(activation_slots_kernel, grid, dim3(kWarpsPerCta * 32), stream, p, "activation_slots_kernel");
}

void launch_combine(const CombineParams& p, Stream stream) {
  if (p.plan.tokens == 0) return;
  const dim3 grid(static_cast<unsigned>(p.plan.tokens),
                  static_cast<unsigned>((p.hidden + kCombineThreads * 8 - 1) / (kCombineThreads * 8)));
  launch_dependent(combine_kernel, grid, dim3(kCombineThreads), stream, p, "combine_kernel");
}

}  // namespace moekit::detail

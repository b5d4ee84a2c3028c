// Decode path: expert GEMMs for a few rows per expert, memory-bound on the weights. One CTA per (plan block,
// slice of output columns); each warp owns two weight rows (GEMM1: gate(i) and up(i), so bias + activation fuse
// into its epilogue; GEMM2: two output columns) and streams them with 16-byte non-coherent loads while the block's
// rows (up to kRows per pass) are read from L1/L2. A plan block belongs to one expert (segments are padded to B),
// so the block's entry of block_experts gives the expert (-1 past the extent) and its rows; blocks of padding and
// of other ranks exit. A CTA lives only a few DRAM latencies, so its prologue is on the critical path: the first
// k-step's weights are requested as soon as the expert is known, before the rows are looked up (GEMM2: before it
// waits for GEMM1). kRows is picked from min(T, B), the most rows a block can hold: with one row per block the
// kernel needs no accumulators for eight, fits six CTAs (24 warps) per SM and keeps more weight loads in flight.
// CTAs are small (4 warps) so that the kernels with more rows, whose registers allow 16-20 warps per SM, are not
// held to two 8-warp CTAs, and the last wave is finer (H200, docs/benchmarks.md: 1.06-1.13x at T = 4; slower: 8
// loads per row at two CTAs per SM, and 32 warps per SM, which spill).
#include <cuda_runtime.h>

#include <array>

#include "experts/cuda/experts_device.cuh"

namespace moekit::detail {
namespace {

constexpr int kWarps = 4;
constexpr int kDepth = 4;  // 16-byte loads per weight row issued together: one k-step
constexpr int kStep = 32 * 8 * kDepth;

// Weights are read once: non-coherent, and not kept in L1 (the x rows are what L1 should hold).
__device__ __forceinline__ uint4 load_stream(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

__device__ __forceinline__ void dot8(float& acc, const uint4& w, const uint4& x) {
  const __nv_bfloat162* wh = reinterpret_cast<const __nv_bfloat162*>(&w);
  const __nv_bfloat162* xh = reinterpret_cast<const __nv_bfloat162*>(&x);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 a = __bfloat1622float2(wh[i]);
    const float2 b = __bfloat1622float2(xh[i]);
    acc = fmaf(a.x, b.x, acc);
    acc = fmaf(a.y, b.y, acc);
  }
}

template <int kRows>  // rows per pass over the weights
__global__ void __launch_bounds__(kWarps * 32, kRows == 1 ? 6 : 1) expert_gemv_kernel(GemvParams p) {
  // GEMM1 needs the router's plan at once: it waits, then lets GEMM2 launch. GEMM2 reads the plan (complete before
  // GEMM1 let it start) and requests its first weights before it waits for GEMM1's output.
  if (p.gated) {
    wait_for_predecessor();
    allow_dependents();
  }
  const int64_t block = blockIdx.x;
  const int expert = p.plan.block_experts[block];  // -1 past the extent
  const int local = expert < 0 ? -1 : local_expert(p.map, expert);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int pair = blockIdx.y * kWarps + warp;  // gated: column i; plain: columns 2 * pair, 2 * pair + 1
  const int pairs = p.gated ? p.n_out : p.n_out / 2;
  if (local < 0 || pair >= pairs) return;
  const int k = p.k;
  const int rows_w = p.gated ? 2 * p.n_out : p.n_out;  // weight rows per expert
  const int c0 = p.gated ? gate_column(p.layout, pair, p.n_out) : 2 * pair;
  const int c1 = p.gated ? up_column(p.layout, pair, p.n_out) : 2 * pair + 1;
  const __nv_bfloat16* w = static_cast<const __nv_bfloat16*>(p.w) + static_cast<int64_t>(local) * rows_w * k;
  const __nv_bfloat16* w0 = w + static_cast<int64_t>(c0) * k;
  const __nv_bfloat16* w1 = w + static_cast<int64_t>(c1) * k;
  uint4 wa[kDepth], wb[kDepth];
  auto load_step = [&](int k0) {
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      const int kk = k0 + d * 32 * 8;
      wa[d] = kk < k ? load_stream(w0 + kk) : make_uint4(0, 0, 0, 0);
      wb[d] = kk < k ? load_stream(w1 + kk) : make_uint4(0, 0, 0, 0);
    }
  };
  load_step(lane * 8);  // in flight while the rows are looked up (and, in GEMM2, while GEMM1 finishes)
  bool loaded = true;

  const int64_t B = p.plan.block, row_begin = block * B;
  const int64_t row_end =
      min(row_begin + B, static_cast<int64_t>(p.plan.expert_offsets[expert]) + p.plan.expert_counts[expert]);
  if (!p.gated) {
    wait_for_predecessor();
    allow_dependents();
  }
  const __nv_bfloat16* x = static_cast<const __nv_bfloat16*>(p.x);
  for (int64_t r0 = row_begin; r0 < row_end; r0 += kRows) {
    const int nr = static_cast<int>(min(static_cast<int64_t>(kRows), row_end - r0));
    const __nv_bfloat16* xr[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int64_t row = r0 + min(r, nr - 1);
      xr[r] = x + (p.gated ? p.plan.sorted_slots[row] / p.plan.slots : row) * k;
    }
    float acc0[kRows] = {}, acc1[kRows] = {};
    for (int k0 = lane * 8; k0 < k; k0 += kStep) {
      if (!loaded) load_step(k0);
      loaded = false;
#pragma unroll
      for (int d = 0; d < kDepth; ++d) {
        const int kk = k0 + d * 32 * 8;
        if (kk >= k) continue;
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          if (r < nr) {
            const uint4 xv = *reinterpret_cast<const uint4*>(xr[r] + kk);
            dot8(acc0[r], wa[d], xv);
            dot8(acc1[r], wb[d], xv);
          }
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
      for (int s = 16; s > 0; s /= 2) {
        acc0[r] += __shfl_xor_sync(0xffffffffu, acc0[r], s);
        acc1[r] += __shfl_xor_sync(0xffffffffu, acc1[r], s);
      }
    }
    // Lane r writes row r: no runtime indexing of the accumulator arrays (they stay in registers).
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (lane != r || r >= nr) continue;
      const int64_t row = r0 + r;
      if (p.gated) {
        const int64_t bias = static_cast<int64_t>(local) * rows_w;
        const float g = acc0[r] + load_bias(p.b13, bias + c0);
        const float u = acc1[r] + load_bias(p.b13, bias + c1);
        static_cast<__nv_bfloat16*>(p.out)[row * p.n_out + pair] =
            __float2bfloat16_rn(gated_activation(p.activation, p.act_params, g, u));
      } else {
        reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(p.out) + row * p.n_out)[pair] =
            __floats2bfloat162_rn(acc0[r], acc1[r]);
      }
    }
  }
}

using GemvKernel = void (*)(GemvParams);
struct GemvEntry {
  int rows;  // kRows: picked when min(T, B) <= rows
  GemvKernel fn;
};
constexpr std::array<GemvEntry, 4> kGemvKernels{{
    {1, expert_gemv_kernel<1>},
    {2, expert_gemv_kernel<2>},
    {4, expert_gemv_kernel<4>},
    {8, expert_gemv_kernel<8>},
}};

}  // namespace

void launch_gemv(const GemvParams& p, Stream stream) {
  const int64_t blocks = p.plan.capacity / p.plan.block;
  if (blocks == 0) return;
  const int pairs = p.gated ? p.n_out : p.n_out / 2;
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>((pairs + kWarps - 1) / kWarps));
  const int64_t max_rows = p.plan.tokens < p.plan.block ? p.plan.tokens : p.plan.block;
  GemvKernel fn = kGemvKernels.back().fn;
  for (const GemvEntry& e : kGemvKernels)
    if (max_rows <= e.rows) {
      fn = e.fn;
      break;
    }
  launch_dependent(fn, grid, dim3(kWarps * 32), stream, p, "expert_gemv_kernel");
}

}  // namespace moekit::detail

// Decode path: expert GEMMs for a few rows per expert, memory-bound on the weights. One CTA per (plan block,
// slice of output columns); each warp owns one or two column pairs of two weight rows each (GEMM1: gate(i) and
// up(i), so bias + activation fuse into its epilogue; GEMM2: two output columns) and streams them with 16-byte
// non-coherent loads while the block's rows (up to kRows per pass) are read from L1/L2. A plan block belongs to one
// expert (segments are padded to B), so the block's entry of block_experts gives the expert (-1 past the extent) and
// its rows; blocks of padding and of other ranks exit. A CTA lives only a few DRAM latencies, so its prologue is on
// the critical path: the first k-step's weights are requested as soon as the expert is known, before the rows are
// looked up (GEMM2: before it waits for GEMM1); with one row per pass, the k-step's x vectors are requested right
// after its weights. kRows is picked by gemv_rows_per_pass(): the kernels with one row, and with two rows of one
// column pair, need no accumulators for eight, fit five or six CTAs (20-24 warps) per SM and keep more weight loads
// in flight (kCtasPerSm below). CTAs are small (4 warps) so that the kernels with more rows, whose registers allow
// 16-20 warps per SM, are not held to two 8-warp CTAs, and the last wave is finer (H200, docs/benchmarks.md:
// 1.06-1.13x at T = 4; slower: 8 loads per row at two CTAs per SM, and 32 warps per SM, which spill).
#include <cuda_runtime.h>

#include <array>

#include "experts/cuda/experts_device.cuh"

namespace moekit::detail {
namespace {

constexpr int kWarps = 4;
constexpr int kDepth = 4;  // 16-byte loads per weight row issued together: one k-step

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

// kPairs column pairs per warp, each row's k-step kDepth / kPairs loads long: short rows (k <= 512, where one pair
// would leave half of the warp's load slots empty) take two pairs, so a warp keeps the same bytes in flight and the
// grid needs half the CTAs (H200: qwen3-next's GEMM2 1.03-1.05x at T = 1-4; two pairs of three slots for k = 768,
// qwen3's GEMM2, were slower).
// kHoistX (one row per pass): the step's x vectors are requested together with its weights, before the first FMA.
// Otherwise each slot's x load waits behind the FMAs of the slot before it, which a block of a single row, whose CTA
// lives a few latencies, cannot hide (H200, docs/benchmarks.md, "Fifteenth session": 0.91-0.98x at T = 1).
// CTAs per SM the launch bounds ask for: as many as fit without spilling (nvcc -Xptxas -v). One row with its x
// vectors held, five (90 / 95 registers with one / two column pairs; at six both spill); one row with two pairs
// without them, and two rows with one pair, six (80 registers); the rest one.
template <int kRows, int kPairs, bool kHoistX>
constexpr int kCtasPerSm = kHoistX ? 5 : (kRows == 1 || (kRows == 2 && kPairs == 1) ? 6 : 1);

// kRows rows per pass over the weights; kPairs column pairs per warp
template <int kRows, int kPairs, bool kHoistX>
__global__ void __launch_bounds__(kWarps * 32, kCtasPerSm<kRows, kPairs, kHoistX>) expert_gemv_kernel(GemvParams p) {
  static_assert(!kHoistX || kRows == 1);
  constexpr int kSlots = kDepth / kPairs;  // 16-byte loads per lane, weight row and k-step
  constexpr int kPairStep = 32 * 8 * kSlots;
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
  // gated: column i = pair; plain: columns 2 * pair, 2 * pair + 1; this warp's pairs are pair0 .. pair0 + kPairs - 1
  const int pair0 = (blockIdx.y * kWarps + warp) * kPairs;
  const int pairs = p.gated ? p.n_out : p.n_out / 2;
  if (local < 0 || pair0 >= pairs) return;
  const int k = p.k;
  const int rows_w = p.gated ? 2 * p.n_out : p.n_out;  // weight rows per expert
  const __nv_bfloat16* w = static_cast<const __nv_bfloat16*>(p.w) + static_cast<int64_t>(local) * rows_w * k;
  const __nv_bfloat16* w0[kPairs];
  const __nv_bfloat16* w1[kPairs];
#pragma unroll
  for (int j = 0; j < kPairs; ++j) {
    const int pair = min(pair0 + j, pairs - 1);  // a missing last pair re-reads the one before; never written
    const int c0 = p.gated ? gate_column(p.layout, pair, p.n_out) : 2 * pair;
    const int c1 = p.gated ? up_column(p.layout, pair, p.n_out) : 2 * pair + 1;
    w0[j] = w + static_cast<int64_t>(c0) * k;
    w1[j] = w + static_cast<int64_t>(c1) * k;
  }
  uint4 wa[kPairs][kSlots], wb[kPairs][kSlots];
  auto load_step = [&](int k0) {
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
#pragma unroll
      for (int d = 0; d < kSlots; ++d) {
        const int kk = k0 + d * 32 * 8;
        wa[j][d] = kk < k ? load_stream(w0[j] + kk) : make_uint4(0, 0, 0, 0);
        wb[j][d] = kk < k ? load_stream(w1[j] + kk) : make_uint4(0, 0, 0, 0);
      }
    }
  };
  load_step(lane * 8);  // in flight while the rows are looked up (and, in GEMM2, while GEMM1 finishes)
  bool loaded = true;
  // The one-row kernels' CTAs live a few latencies: GEMM1's bias values are requested now, not after the reduction.
  // Their columns are computed here, above and in the epilogue rather than kept in arrays: with the arrays the
  // one-row kernels' code changed and qwen3-next's T = 1 GEMM2 took 12.4 us instead of 12.2 (H200, two calls;
  // docs/benchmarks.md, "Eighteenth session").
  float bias0[kPairs] = {}, bias1[kPairs] = {};
  const int64_t bias_row = static_cast<int64_t>(local) * rows_w;
  if (kHoistX && p.gated) {
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
      const int pair = min(pair0 + j, pairs - 1);
      bias0[j] = load_bias(p.b13, bias_row + gate_column(p.layout, pair, p.n_out));
      bias1[j] = load_bias(p.b13, bias_row + up_column(p.layout, pair, p.n_out));
    }
  }

  // One token (on the one-row kernels): every segment is one row at the start of its one block, and every x row of
  // GEMM1 is token 0's, so the x loads need no lookups in the plan (each a dependent L2 or DRAM round trip in front
  // of them; H200, docs/benchmarks.md, "Sixteenth session": 0.97-0.98x at T = 1 on qwen3 and qwen3-next). The kernels
  // of more rows do not test for it: in them the untaken branch cost 1.8-1.9% at T = 2 (qwen3, qwen3-next).
  const bool one_token = kHoistX && p.plan.tokens == 1;
  const int64_t B = p.plan.block, row_begin = block * B;
  const int64_t row_end =
      one_token
          ? row_begin + 1
          : min(row_begin + B, static_cast<int64_t>(p.plan.expert_offsets[expert]) + p.plan.expert_counts[expert]);
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
      xr[r] = x + (p.x_per_row ? row : one_token ? 0 : p.plan.sorted_slots[row] / p.plan.slots) * k;
    }
    float acc0[kPairs][kRows] = {}, acc1[kPairs][kRows] = {};
    for (int k0 = lane * 8; k0 < k; k0 += kPairStep) {
      if (!loaded) load_step(k0);
      loaded = false;
      uint4 xs[kHoistX ? kSlots : 1];
      if constexpr (kHoistX) {
#pragma unroll
        for (int d = 0; d < kSlots; ++d) {
          const int kk = k0 + d * 32 * 8;
          xs[d] = kk < k ? *reinterpret_cast<const uint4*>(xr[0] + kk) : make_uint4(0, 0, 0, 0);
        }
      }
#pragma unroll
      for (int d = 0; d < kSlots; ++d) {
        const int kk = k0 + d * 32 * 8;
        if (kk >= k) continue;
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          if (r < nr) {
            const uint4 xv = kHoistX ? xs[d] : *reinterpret_cast<const uint4*>(xr[r] + kk);
#pragma unroll
            for (int j = 0; j < kPairs; ++j) {
              dot8(acc0[j][r], wa[j][d], xv);
              dot8(acc1[j][r], wb[j][d], xv);
            }
          }
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
#pragma unroll
        for (int s = 16; s > 0; s /= 2) {
          acc0[j][r] += __shfl_xor_sync(0xffffffffu, acc0[j][r], s);
          acc1[j][r] += __shfl_xor_sync(0xffffffffu, acc1[j][r], s);
        }
      }
    }
    // Lane r (+ 8 j) writes row r of pair j: no runtime indexing of the accumulator arrays (they stay in registers).
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
      const int pair = pair0 + j;
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (lane != r + 8 * j || r >= nr || pair >= pairs) continue;
        const int64_t row = r0 + r;
        if (p.gated) {
          const int c0 = gate_column(p.layout, pair, p.n_out), c1 = up_column(p.layout, pair, p.n_out);
          const float g = acc0[j][r] + (kHoistX ? bias0[j] : load_bias(p.b13, bias_row + c0));
          const float u = acc1[j][r] + (kHoistX ? bias1[j] : load_bias(p.b13, bias_row + c1));
          static_cast<__nv_bfloat16*>(p.out)[row * p.n_out + pair] =
              __float2bfloat16_rn(gated_activation(gated_activation_form(p.activation, p.act_params), g, u));
        } else {
          reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(p.out) + row * p.n_out)[pair] =
              __floats2bfloat162_rn(acc0[j][r], acc1[j][r]);
        }
      }
    }
  }
}

using GemvKernel = void (*)(GemvParams);
struct GemvEntry {
  int rows;    // kRows: picked when the rows per pass are at most this
  int pairs;   // kPairs: 2 for weight rows of at most kShortK elements, else 1
  bool hoist;  // kHoistX: the one-row kernel for calls whose blocks hold one row each (min(T, B) = 1)
  GemvKernel fn;
};
constexpr int kShortK = 32 * 8 * kDepth / 2;
constexpr std::array<GemvEntry, 9> kGemvKernels{{
    {1, 1, true, expert_gemv_kernel<1, 1, true>},
    {2, 1, false, expert_gemv_kernel<2, 1, false>},
    {4, 1, false, expert_gemv_kernel<4, 1, false>},
    {8, 1, false, expert_gemv_kernel<8, 1, false>},
    {1, 2, true, expert_gemv_kernel<1, 2, true>},
    {1, 2, false, expert_gemv_kernel<1, 2, false>},
    {2, 2, false, expert_gemv_kernel<2, 2, false>},
    {4, 2, false, expert_gemv_kernel<4, 2, false>},
    {8, 2, false, expert_gemv_kernel<8, 2, false>},
}};

// Rows per pass; no block holds more than min(T, B) rows. Without shared experts and with at most one routed row per
// expert on average (T K <= E), most blocks hold one or two rows: the kernel with the most rows (up to that bound)
// that still runs six CTAs per SM takes them in one pass, and the rarer larger block in a few passes whose weights
// come back from L2 (H200, docs/benchmarks.md, "Fourteenth session": qwen3 at T = 8 / 16 0.91-0.92 / 0.87-0.89 of
// the floor with two rows per pass, 0.88-0.89 / 0.82-0.85 with one, 0.82-0.83 / 0.79-0.80 with four). Otherwise a
// block may hold min(T, B) rows (a shared expert's block does): the fewest rows per pass that cover them.
int gemv_rows_per_pass(const GemvParams& p, int pairs_per_warp) {
  const int64_t shared = p.plan.groups - p.map.num_experts, top_k = p.plan.slots - shared;
  const int most = static_cast<int>(p.plan.tokens < p.plan.block ? p.plan.tokens : p.plan.block);
  if (shared == 0 && p.plan.tokens * top_k <= p.map.num_experts)
    return most < 2 ? most : (pairs_per_warp == 1 ? 2 : 1);
  return most;
}

}  // namespace

void launch_gemv(const GemvParams& p, Stream stream) {
  const int64_t blocks = p.plan.capacity / p.plan.block;
  if (blocks == 0) return;
  const int pairs_per_warp = p.k <= kShortK ? 2 : 1;
  const int rows = gemv_rows_per_pass(p, pairs_per_warp);
  // Blocks of one row run the one-row kernel with its x vectors held (at T > 1 the one-row, two-pair kernel keeps
  // six CTAs per SM instead: qwen3-next's GEMM2 at T = 16 / 32 ran 1.007 / 1.009x slower held).
  const bool one_row_blocks = p.plan.tokens == 1 || p.plan.block == 1;
  const GemvEntry* pick = nullptr;
  for (const GemvEntry& e : kGemvKernels) {
    if (e.pairs != pairs_per_warp || (e.rows == 1 && e.hoist != one_row_blocks)) continue;
    pick = &e;                  // the most rows so far
    if (rows <= e.rows) break;  // the fewest rows that hold `rows`
  }
  const int pairs = p.gated ? p.n_out : p.n_out / 2;
  const int per_cta = kWarps * pairs_per_warp;
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>((pairs + per_cta - 1) / per_cta));
  launch_dependent(pick->fn, grid, dim3(kWarps * 32), stream, p, "expert_gemv_kernel");
}

}  // namespace moekit::detail

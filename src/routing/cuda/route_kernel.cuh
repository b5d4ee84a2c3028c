// The fused router kernel: logits -> complete route plan in one launch. Each CTA owns a contiguous token range and
// each warp a contiguous sub-range, so "ascending token within an expert" is (CTA prefix, warp prefix, rank in warp):
//   A. warps route their tokens (route_token.cuh) and count experts in per-warp shared histograms;
//   B. the CTA turns them into per-warp prefixes and publishes its expert totals (workspace [grid, E]);
//   -- grid barrier --  C. one warp per expert scans the per-CTA totals: CTA prefixes and expert_counts;
//   -- grid barrier --  D. every CTA scans the padded counts into offsets (redundantly, no third barrier),
//      scatters its slots into sorted_slots/slot_rows, and the grid writes padding and block_experts.
// With one CTA the barriers and step C vanish. The barrier counts arrivals and bumps a generation word, resetting
// itself, so graph replays need no re-initialization. Cross-CTA data is read with ld.cg (L2), never L1.
#pragma once

#include "route_token.cuh"

namespace moekit::detail::router {

inline constexpr int kThreads = 512;
inline constexpr int kWarps = kThreads / 32;
inline constexpr int kMaxCtas = 288;  // 2 per SM on a 132-SM H200, with room; workspace rows

/// Rows of logits held per lane; above 8 a kernel needs 128 registers, so one CTA per SM.
template <class In, int NC>
inline constexpr int kValuesPerLane = NC * 16 / static_cast<int>(sizeof(In));
template <class In, int NC>
inline constexpr int kCtasPerSm = kValuesPerLane<In, NC> <= 8 ? 2 : 1;
/// Grid bound of one instance: step C keeps ceil(ctas / 32) values per lane in registers.
template <class In, int NC>
inline constexpr int kMaxCtasOf = kCtasPerSm<In, NC> == 2 ? kMaxCtas : kMaxCtas / 2;

/// Byte offsets of the dynamic shared memory regions (host and device agree on this).
struct SmemLayout {
  int hist = 0, bias = 0, scratch = 0, counts = 0, offsets = 0, base = 0, scan = 0, total = 0;
  int scratch_words = 0;  // per warp, before the 32 kept-mask words

  __host__ __device__ static int align16(int b) { return (b + 15) & ~15; }
  __host__ __device__ static SmemLayout make(int experts, int groups, bool grouped) {
    SmemLayout l;
    const int e_pad = (experts + 7) & ~7;
    l.scratch_words = grouped ? (experts > 2 * kCandidateCap ? experts : 2 * kCandidateCap) : 2 * kCandidateCap;
    int at = 0;
    l.hist = at;
    at = align16(at + kWarps * e_pad * 2);
    l.bias = at;
    at = align16(at + experts * 4);
    l.scratch = at;
    at = align16(at + kWarps * (l.scratch_words + 32) * 4);
    l.counts = at;
    at = align16(at + groups * 4);
    l.offsets = at;
    at = align16(at + (groups + 1) * 4);
    l.base = at;
    at = align16(at + experts * 4);
    l.scan = at;
    at = align16(at + 32 * 4);
    l.total = at;
    return l;
  }
};

__device__ __forceinline__ uint32_t ld_acquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

/// All CTAs of the (co-resident) grid meet here. Self-resetting: the last arrival zeroes the count before it
/// releases the others by bumping the generation.
__device__ __forceinline__ void grid_barrier(uint32_t* bar) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const uint32_t gen = ld_acquire(bar + 1);
    __threadfence();
    if (atomicAdd(bar, 1u) + 1 == gridDim.x) {
      atomicExch(bar, 0u);
      __threadfence();
      atomicAdd(bar + 1, 1u);
    } else {
      while (ld_acquire(bar + 1) == gen) __nanosleep(32);
    }
    __threadfence();
  }
  __syncthreads();
}

/// Exclusive scan of data[0, n) in place by the whole CTA; returns the total. `scan` holds kWarps ints.
__device__ int block_exclusive_scan(int* data, int n, int* scan) {
  const int per = (n + blockDim.x - 1) / blockDim.x;
  const int lo = min(n, static_cast<int>(threadIdx.x) * per), hi = min(n, lo + per);
  int sum = 0;
  for (int i = lo; i < hi; ++i) sum += data[i];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int incl = sum;
  for (int off = 1; off < 32; off <<= 1) {
    const int v = __shfl_up_sync(kFullMask, incl, off);
    if (lane >= off) incl += v;
  }
  if (lane == 31) scan[warp] = incl;
  __syncthreads();
  int warp_base = 0, total = 0;
  for (int w = 0; w < kWarps; ++w) {
    const int v = scan[w];
    warp_base += w < warp ? v : 0;
    total += v;
  }
  int run = warp_base + incl - sum;
  for (int i = lo; i < hi; ++i) {
    const int v = data[i];
    data[i] = run;
    run += v;
  }
  __syncthreads();
  return total;
}

template <class In, int NC>
__global__ void __launch_bounds__(kThreads, kCtasPerSm<In, NC>) route_fused_kernel(const __grid_constant__ RouteParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const SmemLayout L = SmemLayout::make(p.experts, p.groups, p.grouped);
  const int E = p.experts, G = p.groups, K = p.top_k, Kt = p.slots, T = p.tokens;
  const int e_pad = (E + 7) & ~7;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  uint16_t* hist = reinterpret_cast<uint16_t*>(smem + L.hist);  // [kWarps][e_pad]
  float* bias_s = reinterpret_cast<float*>(smem + L.bias);        // [E]
  int* cnt_s = reinterpret_cast<int*>(smem + L.counts);            // [G]
  int* offs_s = reinterpret_cast<int*>(smem + L.offsets);          // [G+1]
  int* base_s = reinterpret_cast<int*>(smem + L.base);             // [E]
  int* scan_s = reinterpret_cast<int*>(smem + L.scan);             // [32]
  uint32_t* scratch = reinterpret_cast<uint32_t*>(smem + L.scratch) + warp * (L.scratch_words + 32);
  const WarpScratch ws{scratch, reinterpret_cast<uint64_t*>(scratch), scratch + L.scratch_words};

  for (int i = tid; i < kWarps * e_pad / 2; i += kThreads) reinterpret_cast<uint32_t*>(hist)[i] = 0;
  if (p.bias != nullptr)
    for (int e = tid; e < E; e += kThreads)
      bias_s[e] = p.bias_bf16 ? load_one(static_cast<const Bf16*>(p.bias) + e)
                              : load_one(static_cast<const float*>(p.bias) + e);
  __syncthreads();

  // A. Route this warp's tokens, loading the next row while the current one is selected.
  const int64_t cta_t0 = static_cast<int64_t>(blockIdx.x) * p.tokens_per_cta;
  const int64_t cta_t1 = min(cta_t0 + p.tokens_per_cta, static_cast<int64_t>(T));
  {
    const int64_t t0 = cta_t0 + static_cast<int64_t>(warp) * p.tokens_per_warp;
    const int64_t t1 = min(t0 + p.tokens_per_warp, cta_t1);
    uint16_t* my_hist = hist + warp * e_pad;
    const float* bias_ptr = p.bias != nullptr ? bias_s : nullptr;
    if (t0 < t1) {
      RowRegs<In, NC> cur;
      cur.load(p, t0, lane);
      for (int64_t t = t0; t < t1; ++t) {
        if constexpr (NC <= 4) {
          RowRegs<In, NC> next;
          if (t + 1 < t1) next.load(p, t + 1, lane);
          route_token<In, NC>(p, t, cur, lane, bias_ptr, my_hist, ws);
          cur = next;
        } else {
          route_token<In, NC>(p, t, cur, lane, bias_ptr, my_hist, ws);
          if (t + 1 < t1) cur.load(p, t + 1, lane);
        }
      }
    }
  }
  __syncthreads();

  // B. Per-warp histograms -> per-warp exclusive prefixes; CTA totals.
  for (int e = tid; e < E; e += kThreads) {
    int run = 0;
    for (int w = 0; w < kWarps; ++w) {
      const int v = hist[w * e_pad + e];
      hist[w * e_pad + e] = static_cast<uint16_t>(run);
      run += v;
    }
    base_s[e] = run;
  }
  const int nb = gridDim.x;
  if (nb > 1) {
    int32_t* my_row = p.cta_hist + static_cast<int64_t>(blockIdx.x) * E;
    for (int e = tid; e < E; e += kThreads) __stcg(my_row + e, base_s[e]);
    grid_barrier(p.barrier);

    // C. One warp per expert: exclusive scan over the CTAs, in place; the total is the expert's count.
    constexpr int kPerLane = (kMaxCtasOf<In, NC> + 31) / 32;
    const int per_lane = (nb + 31) / 32;  // <= kPerLane
    for (int e = blockIdx.x * kWarps + warp; e < E; e += nb * kWarps) {
      int v[kPerLane];
      int sum = 0;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const int c = lane * per_lane + i;
        v[i] = (i < per_lane && c < nb) ? __ldcg(p.cta_hist + static_cast<int64_t>(c) * E + e) : 0;
        sum += v[i];
      }
      int incl = sum;
      for (int off = 1; off < 32; off <<= 1) {
        const int n = __shfl_up_sync(kFullMask, incl, off);
        if (lane >= off) incl += n;
      }
      int run = incl - sum;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const int c = lane * per_lane + i;
        if (i < per_lane && c < nb) __stcg(p.cta_hist + static_cast<int64_t>(c) * E + e, run);
        run += v[i];
      }
      if (lane == 31) __stcg(p.expert_counts + e, incl);
    }
    grid_barrier(p.barrier);
    for (int e = tid; e < E; e += kThreads) {
      cnt_s[e] = __ldcg(p.expert_counts + e);
      base_s[e] = __ldcg(my_row + e);
    }
  } else {
    for (int e = tid; e < E; e += kThreads) {
      cnt_s[e] = base_s[e];
      base_s[e] = 0;
      p.expert_counts[e] = cnt_s[e];
    }
  }
  for (int g = E + tid; g < G; g += kThreads) {
    cnt_s[g] = T;
    if (blockIdx.x == 0) p.expert_counts[g] = T;
  }
  __syncthreads();

  // D. Offsets (every CTA), then the scatter of this CTA's slots.
  const int B = p.block;
  for (int g = tid; g < G; g += kThreads) offs_s[g] = (cnt_s[g] + B - 1) / B * B;
  __syncthreads();
  const int used = block_exclusive_scan(offs_s, G, scan_s);
  if (tid == 0) offs_s[G] = used;
  for (int e = tid; e < E; e += kThreads) base_s[e] += offs_s[e];
  __syncthreads();
  if (blockIdx.x == 0) {
    for (int g = tid; g <= G; g += kThreads) p.expert_offsets[g] = offs_s[g];
    if (tid == 0) {
      p.extent[0] = used;
      p.extent[1] = used / B;
    }
  }
  const int64_t s1 = cta_t1 * Kt;
  for (int64_t s = cta_t0 * Kt + tid; s < s1; s += kThreads) {
    const int64_t t = s / Kt;
    const int k = static_cast<int>(s - t * Kt);
    int row;
    if (k < K) {
      const uint32_t packed = static_cast<uint32_t>(p.slot_rows[s]);
      const int e = static_cast<int>(packed >> 16);
      const int w = static_cast<int>((t - cta_t0) / p.tokens_per_warp);
      row = base_s[e] + hist[w * e_pad + e] + static_cast<int>(packed & 0xffffu);
    } else {
      row = offs_s[E + k - K] + static_cast<int>(t);
    }
    p.sorted_slots[row] = static_cast<int32_t>(s);
    p.slot_rows[s] = row;
  }

  // Padding rows and block -> expert, spread over the grid.
  const int pad = T * Kt;
  const int64_t gthreads = static_cast<int64_t>(nb) * kThreads;
  const int64_t gtid = static_cast<int64_t>(blockIdx.x) * kThreads + tid;
  const int64_t nblocks = p.capacity / B;
  const int used_blocks = used / B;
  for (int64_t b = gtid; b < nblocks; b += gthreads) {
    if (b < used_blocks) {
      const int r0 = static_cast<int>(b) * B;
      int lo = 0, hi = G;  // last g with offs_s[g] <= r0
      while (hi - lo > 1) {
        const int mid = (lo + hi) >> 1;
        if (offs_s[mid] <= r0) lo = mid;
        else hi = mid;
      }
      p.block_experts[b] = lo;
      for (int r = max(r0, offs_s[lo] + cnt_s[lo]); r < r0 + B; ++r) p.sorted_slots[r] = pad;
    } else {
      p.block_experts[b] = -1;
    }
  }
  for (int64_t r = used + gtid; r < p.capacity; r += gthreads) p.sorted_slots[r] = pad;
}

}  // namespace moekit::detail::router

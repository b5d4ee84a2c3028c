// The fused router kernel: logits -> complete route plan in one launch. Each CTA owns a contiguous token range and
// each token team (a warp, or half a warp when a warp routes two tokens at once: Team in route_token.cuh) a
// contiguous sub-range, so "ascending token within an expert" is (CTA prefix, team prefix, rank in team); below,
// "warp" stands for the team where the two differ:
//   A. warps route their tokens (route_token.cuh) and count experts in per-warp shared histograms;
//   B. per-warp prefixes and the CTA's expert totals. With several CTAs: each CTA publishes its totals (u16 row of
//      the workspace) and adds them to the expert totals; -- one grid barrier --; each CTA sums the rows of the
//      CTAs before it (its base in every expert) and reads the totals;
//   C. every CTA scans the padded counts into offsets (one CUB block scan), scatters its slots into
//      sorted_slots/slot_rows, and the grid writes block_experts (a lane per group). Padding rows and blocks past the
//      extent were written before A ended (prefill_plan(): by the warps without tokens where there are some).
// A single CTA (small T) needs no barrier and no workspace. When a call has at most 32 slots (T * Kt <= 32, decode),
// B and C collapse into tiny_plan(): one warp ranks the slots by group and the CTA writes the plan from the <= 32
// non-empty segments, without histograms or a block scan; one token's plan (one_token_plan()) is a single pass of
// every thread over its K experts. Up to 8 tokens (the decode instances) the warps without tokens build that plan, or
// count the histograms of a larger one, as soon as the routing warps have selected their experts (a named barrier),
// while the routing warps compute the weights. The other calls of one token per warp (the token_masks instance: up
// to 16 tokens per CTA, T <= 16 per SM on the heuristic's grids) keep a token mask per expert instead of the
// histograms (bit i: the CTA's token i selected it): its popcount is the CTA's count of the expert, and the popcount
// of its bits below i token i's rank among them. The grid barrier's arrival count only grows (mod 2^32), and an epoch
// word says where this call's arrivals start and the call's parity; the totals are double-buffered by that parity
// (the buffer of the next call is zeroed during this one), so graph replays need no re-initialization. Cross-CTA data
// is read with ld.cg (L2).
#pragma once

#include <cub/block/block_scan.cuh>

#include "route_token.cuh"

namespace moekit::detail::router {

inline constexpr int kThreads = 512;
inline constexpr int kWarps = kThreads / 32;
inline constexpr int kMaxCtas = 288;   // 2 per SM on a 132-SM H200, with room; workspace rows
inline constexpr int kInfoCap = 8192;  // routed slots per CTA whose (expert, rank) stay in shared memory
inline constexpr int kGroupsPerThread = (kMaxExperts + kMaxSlots + kThreads - 1) / kThreads;  // plan scan items
using BlockScan = cub::BlockScan<int, kThreads, cub::BLOCK_SCAN_WARP_SCANS>;

/// Values held per lane; above 8 a kernel needs up to 128 registers, so one CTA per SM, as with two tokens per warp
/// (LPT = 16), whose selection scratch does not fit 64 registers either.
template <class In, int NC>
inline constexpr int kValuesPerLane = NC * 16 / static_cast<int>(sizeof(In));
template <class In, int NC, int LPT = 32>
inline constexpr int kCtasPerSm = kValuesPerLane<In, NC> <= 8 && LPT == 32 ? 2 : 1;

__host__ __device__ inline int pad8(int n) {
  return (n + 7) & ~7;
}

/// Floats of the shared bias row: at least the capacity of the kernel instance that routes E experts (capacities
/// are 32 lanes * 4 or 8 values * a power of two of chunks).
__host__ __device__ inline int bias_words(int experts) {
  int n = 256;
  while (n < experts) n *= 2;
  return n;
}

/// Byte offsets of the dynamic shared memory regions (host and device agree on this).
struct SmemLayout {
  int hist = 0, bias = 0, sel = 0, cand = 0, scratch = 0, counts = 0, offsets = 0, base = 0, info = 0, total = 0;
  int warp_words = 0;  // per-warp scratch of shared-memory group limiting: keys [E] + 32 kept-mask words

  __host__ __device__ static int align16(int b) { return (b + 15) & ~15; }
  /// `grouped`: group limiting that needs the shared-memory scratch (RouteParams::group_lanes == 0). `teams`: the
  /// CTA's token teams (kWarps, or twice as many with two tokens per warp), each with a histogram row and scratch.
  __host__ __device__ static SmemLayout make(int experts, int groups, bool grouped, int info_words,
                                             int teams = kWarps) {
    SmemLayout l;
    const int e_pad = pad8(experts);
    l.warp_words = grouped ? e_pad + 32 : 0;
    const int group_bytes = kWarps * l.warp_words * 4, partial_bytes = kThreads * 8 * 4;
    int at = 0;
    l.hist = at;
    at = align16(at + teams * e_pad * 2);
    l.bias = at;
    at = align16(at + bias_words(experts) * 4);
    l.sel = at;  // per team: 32 (expert, value) pairs of the selection
    at = align16(at + teams * 32 * 8);
    l.cand = at;  // per team: 32 (~expert, key, value, -) candidates of the threshold selection
    at = align16(at + teams * 32 * 16);
    l.scratch = at;  // group scratch during A, per-CTA partial sums during B
    at = align16(at + (group_bytes > partial_bytes ? group_bytes : partial_bytes));
    l.counts = at;
    at = align16(at + groups * 4);
    l.offsets = at;
    at = align16(at + (groups + 1) * 4);
    l.base = at;
    at = align16(at + experts * 4);
    l.info = at;
    at = align16(at + info_words * 4);
    l.total = at;
    return l;
  }
};

__device__ __forceinline__ uint32_t ld_acquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

/// All CTAs of the (co-resident) grid meet here. `arrivals` grows by 2 per arriving CTA, over every call (mod 2^32);
/// `epoch` is its value when this call started with the call's parity in bit 0 (read by every CTA before it
/// arrived), so the grid is complete at (epoch & ~1) + 2 * gridDim.x (compared with wrap-around). Thread 0 adds its
/// CTA with a release reduction (releasing what its CTA wrote before the CTA barrier; nothing waits for a returned
/// value) and polls the count with acquire loads: after the last arrival that is one reduction and the pollers' next
/// loads. CTA 0 then stores the next call's epoch (the same count, the other parity). No full fences.
__device__ __forceinline__ void grid_barrier(uint32_t* arrivals, uint32_t* epoch_word, uint32_t epoch) {
  const uint32_t done = (epoch & ~1u) + 2u * gridDim.x;
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile("red.release.gpu.global.add.u32 [%0], 2;" ::"l"(arrivals) : "memory");
    while (static_cast<int32_t>(ld_acquire(arrivals) - done) < 0) {
    }
  }
  __syncthreads();
  if (blockIdx.x == 0 && threadIdx.x == 0)
    asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(epoch_word), "r"(done | (~epoch & 1u)) : "memory");
}

/// acc[i] += the i-th u16 of w (eight counts of one count row).
__device__ __forceinline__ void add_octet(uint32_t (&acc)[8], const uint4& w) {
  acc[0] += w.x & 0xffffu;
  acc[1] += w.x >> 16;
  acc[2] += w.y & 0xffffu;
  acc[3] += w.y >> 16;
  acc[4] += w.z & 0xffffu;
  acc[5] += w.z >> 16;
  acc[6] += w.w & 0xffffu;
  acc[7] += w.w >> 16;
}

/// Sums the u16 count rows of CTAs [0, blockIdx.x) into out[e] (e < E): 16-byte L2 loads, partial sums through
/// `partial` (kThreads * 8 ints). A thread with more than one row loads kRowsInFlight of them before adding any: a
/// loop of one load per step waited for each load before the next, so that at 132 CTAs and E = 512 the last CTA's
/// threads read 17 rows one after the other (forty-fourth session: seed6 T = 512 / 16384 0.918 / 0.979x, dsv3
/// T = 1024 0.954x, E = 512 K = 10 T = 2048 0.884x). A thread with one row at most keeps the single load (the
/// four-row step alone: dsv3 T = 64 1.017x).
/// `octet_magic` is rm::division_magic(pad8(experts) / 8).
inline constexpr int kRowsInFlight = 4;  // 8 spilled in one instance
__device__ __forceinline__ void sum_earlier_rows(const uint16_t* rows, int experts, uint32_t octet_magic,
                                                 int* partial, int* out) {
  const int e8 = pad8(experts), octets = e8 / 8;
  const int groups = static_cast<int>(rm::magic_div(kThreads, octet_magic));
  const int tid = threadIdx.x, g = static_cast<int>(rm::magic_div(tid, octet_magic)), o = tid - g * octets;
  const int n = blockIdx.x;
  if (g < groups) {
    uint32_t acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    const uint4* col = reinterpret_cast<const uint4*>(rows) + o;
    if (n <= groups) {
      if (g < n) add_octet(acc, __ldcg(col + static_cast<int64_t>(g) * octets));
    } else {
      for (int c0 = g; c0 < n; c0 += kRowsInFlight * groups) {
        uint4 w[kRowsInFlight];
#pragma unroll
        for (int j = 0; j < kRowsInFlight; ++j) {
          const int c = c0 + j * groups;
          w[j] = c < n ? __ldcg(col + static_cast<int64_t>(c) * octets) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int j = 0; j < kRowsInFlight; ++j) add_octet(acc, w[j]);
      }
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) partial[g * e8 + o * 8 + i] = static_cast<int>(acc[i]);
  }
  __syncthreads();
  for (int e = tid; e < experts; e += kThreads) {
    int s = 0;
    for (int h = 0; h < groups; ++h) s += partial[h * e8 + e];
    out[e] = s;
  }
}

/// Turns the per-warp counts of expert e (hist[w * e_pad + e], w < n) into per-warp exclusive prefixes and returns
/// their sum, kChunk warps at a time: a chunk's loads go out before its stores (the compiler cannot tell that the
/// rows do not alias, so a loop that loads and stores in turn waits for each load).
template <int kChunk>
__device__ __forceinline__ int warp_prefixes_by(uint16_t* hist, int e, int e_pad, int n) {
  int run = 0;
  for (int w0 = 0; w0 < n; w0 += kChunk) {
    int v[kChunk];
#pragma unroll
    for (int i = 0; i < kChunk; ++i) v[i] = w0 + i < n ? hist[(w0 + i) * e_pad + e] : 0;
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
      if (w0 + i < n) hist[(w0 + i) * e_pad + e] = static_cast<uint16_t>(run);
      run += v[i];
    }
  }
  return run;
}

/// warp_prefixes_by() in one chunk of all kTeams rows (one per token team) when every team routed, else four at a
/// time, so that a few teams cost one chunk.
template <int kTeams>
__device__ __forceinline__ int warp_prefixes(uint16_t* hist, int e, int e_pad, int n) {
  return n == kTeams ? warp_prefixes_by<kTeams>(hist, e, e_pad, kTeams) : warp_prefixes_by<4>(hist, e, e_pad, n);
}

/// n / d for the plan's indices: rm::magic_div() (a multiply-high) when every index is below 2^16
/// (RouteParams::small_plan), else a division.
__device__ __forceinline__ int plan_div(const RouteParams& p, int n, int d, uint32_t magic) {
  return p.small_plan ? static_cast<int>(rm::magic_div(static_cast<uint32_t>(n), magic)) : n / d;
}

/// The plan's rows and blocks before this call writes anything else there: every row of sorted_slots holds the
/// padding slot `pad` and every block of block_experts -1. The scatter and the block passes overwrite their entries
/// after the grid barrier (several CTAs) or the CTA's barriers (one CTA), so padding rows and everything past the
/// extent need no pass of their own. CTA c takes blocks [c P, (c + 1) P) (P = RouteParams::prefill_blocks) and their
/// rows, shared by its warps from `warp0` on: the warps without tokens, while the others route. 32-bit arithmetic:
/// the launcher's token limit (65535 per CTA, at most kMaxCtas CTAs, <= 32 slots each) keeps every index below 2^31.
__device__ __forceinline__ void prefill_plan(const RouteParams& p, int pad, int warp0) {
  const int B = p.block, n = kThreads - warp0 * 32, t = static_cast<int>(threadIdx.x) - warp0 * 32;
  const int b0 = static_cast<int>(blockIdx.x) * p.prefill_blocks, b1 = min(b0 + p.prefill_blocks, p.plan_blocks);
  for (int b = b0 + t; b < b1; b += n) p.block_experts[b] = -1;
  for (int r = b0 * B + t; r < b1 * B; r += n) p.sorted_slots[r] = pad;
}

/// One non-empty segment of a tiny plan: group, first row, rows used and padded rows.
struct TinySegment {
  int group, offset, count, padded;
};

/// Plan phases B and C for one token (T = 1, a single CTA), once `routed(k)` gives routed slot k's expert (k < K),
/// by the threads c = 0 .. n - 1 of a crew (a decode instance: the warps other than warp 0, which computes the
/// weights meanwhile; the general instance: every thread).
/// The K routed experts are distinct and the shared slots are the groups E .. E + S - 1, so every non-empty group
/// holds one row padded to one block, and group g's first row is B times the number of the token's groups below g.
/// Every thread writes its groups' counts and offsets from the K experts, and thread c < Kt slot c's row and block:
/// one pass. The padding rows and the blocks past the extent hold what prefill_plan() wrote.
template <class Routed>
__device__ __forceinline__ void one_token_plan(const RouteParams& p, Routed routed, int c, int n) {
  const int E = p.experts, G = p.groups, K = p.top_k, Kt = p.slots, B = p.block;
  trace_point_by(p, 3, c == 0);  // no count, totals or scan phases: their stamps coincide
  trace_point_by(p, 4, c == 0);
  trace_point_by(p, 5, c == 0);
  for (int g = c; g < G; g += n) {
    int below = K + g - E, here = 1;  // a shared group: above every routed expert
    if (g < E) {
      below = 0;
      here = 0;
#pragma unroll 8
      for (int k = 0; k < K; ++k) {
        const int e = routed(k);
        below += e < g ? 1 : 0;
        here += e == g ? 1 : 0;
      }
    }
    p.expert_counts[g] = here;
    p.expert_offsets[g] = below * B;
  }
  trace_point_by(p, 6, c == 0);
  if (c < Kt) {
    int g = E + c - K, rank = c;
    if (c < K) {
      g = routed(c);
      rank = 0;
#pragma unroll 8
      for (int k = 0; k < K; ++k) rank += routed(k) < g ? 1 : 0;
    }
    p.sorted_slots[rank * B] = c;
    p.slot_rows[c] = rank * B;
    p.block_experts[rank] = g;
  }
  if (c == 0) {
    p.expert_offsets[G] = Kt * B;
    p.extent[0] = Kt * B;
    p.extent[1] = Kt;
  }
  trace_point_by(p, 7, c == 0);
}

/// Plan phases B and C for a single CTA with T * Kt <= 32 slots and more than one token, once `routed(t, k)` gives
/// token t's routed slot k's expert, by the threads c = 0 .. n - 1 of a crew (whole warps; `sync` is a barrier of
/// the crew). The crew's first warp: lane s holds slot s's group; its rank among the slots of its group
/// (match_any; lanes are in ascending token order) is its row in the segment, and one pass over the lanes gives
/// every slot the padded rows and the number of the segments below its group. The segments go to a table in shared
/// memory (`seg`, 32 entries, and `nseg`, 2 words) in group order; then every thread writes its share of counts and
/// offsets (a binary search per group) and block_experts (padding rows and blocks past the extent:
/// prefill_plan()).
template <bool kThreadPerSegment, class Routed, class Sync>
__device__ __forceinline__ void tiny_plan(const RouteParams& p, Routed routed, TinySegment* seg, int* nseg, int c,
                                          int n, Sync sync) {
  const int E = p.experts, G = p.groups, K = p.top_k, Kt = p.slots, B = p.block;
  const int slots = p.tokens * Kt, lane = c & 31;
  if (c < 32) {
    const int t = static_cast<int>(rm::magic_div(lane, p.slot_magic)), k = lane - t * Kt;  // lane / Kt, lane % Kt
    const bool valid = lane < slots;
    const int g = !valid ? G : (k < K ? routed(t, k) : E + k - K);
    const uint32_t lt = (1u << lane) - 1u;
    const uint32_t same = __match_any_sync(kFullMask, g);
    const int count = __popc(same), rank = __popc(same & lt);
    const bool leader = valid && (same & lt) == 0;
    const int padded = leader ? static_cast<int>(rm::magic_div(count + B - 1, p.block_magic)) * B : 0;
    // Padded rows and segments of the groups below g, from the leaders (their groups' lowest slots; other lanes
    // contribute 0): with few groups a pass over the leaders (a dependent chain per leader), else independent
    // shuffles from all 32 lanes.
    const uint32_t leaders = __ballot_sync(kFullMask, leader);
    int offset = 0, below = 0;
    auto add_lane = [&](int j) {
      const int gj = __shfl_sync(kFullMask, g, j), pj = __shfl_sync(kFullMask, padded, j);
      offset += gj < g ? pj : 0;
      below += gj < g && pj > 0 ? 1 : 0;
    };
    if (__popc(leaders) <= 8) {
      for (uint32_t m = leaders; m != 0; m &= m - 1) add_lane(__ffs(m) - 1);
    } else {
#pragma unroll 8
      for (int j = 0; j < 32; ++j) add_lane(j);
    }
    if (valid) {  // offset depends on g only: every slot of a group has its segment's first row
      const int row = offset + rank;
      p.sorted_slots[row] = lane;
      p.slot_rows[lane] = row;
    }
    if (leader) seg[below] = TinySegment{g, offset, count, padded};
    const int used = __reduce_add_sync(kFullMask, padded);
    if (lane == 0) {
      nseg[0] = __popc(leaders);
      nseg[1] = used;
      p.expert_offsets[G] = used;
      p.extent[0] = used;
      p.extent[1] = static_cast<int>(rm::magic_div(used, p.block_magic));
    }
  }
  sync();
  trace_point_by(p, 3, c == 0);  // the tiny plan has no count, totals or scan phases: their stamps coincide
  trace_point_by(p, 4, c == 0);
  trace_point_by(p, 5, c == 0);
  const int ns = nseg[0], used = nseg[1];
  for (int g = c; g < G; g += n) {
    int lo = 0;  // first segment whose group is >= g
    for (int step = 32; step > 0; step >>= 1)
      if (lo + step <= ns && seg[lo + step - 1].group < g) lo += step;
    const bool here = lo < ns && seg[lo].group == g;
    p.expert_counts[g] = here ? seg[lo].count : 0;
    p.expert_offsets[g] = lo < ns ? seg[lo].offset : used;
  }
  trace_point_by(p, 6, c == 0);
  // Segments' blocks (padding rows and blocks past the extent: prefill_plan()): kThreadPerSegment, a thread per
  // segment (at most 32 blocks each: one per slot when B = 1); else a warp per segment, a lane per block.
  if constexpr (kThreadPerSegment) {
    for (int i = c; i < ns; i += n) {
      const TinySegment s = seg[i];
      const int b1 = plan_div(p, s.offset + s.padded, B, p.block_magic);
      for (int b = plan_div(p, s.offset, B, p.block_magic); b < b1; ++b) p.block_experts[b] = s.group;
    }
  } else {
    for (int i = c >> 5; i < ns; i += n >> 5) {
      const TinySegment s = seg[i];
      const int b1 = plan_div(p, s.offset + s.padded, B, p.block_magic);
      for (int b = plan_div(p, s.offset, B, p.block_magic) + lane; b < b1; b += 32) p.block_experts[b] = s.group;
    }
  }
  trace_point_by(p, 7, c == 0);
}

/// Calls of at most kDecodeTokens tokens on one CTA take a decode instance (decode_plan, decode_counts): warp t
/// routes token t and writes its slots while the warps without tokens (the crew), as soon as every routing warp has
/// selected its experts (a named barrier), build the plan (T * Kt <= 32: decode_plan) or count the histograms (phase
/// B's first step: decode_counts). That leaves the token loop of the general instances free of the hand-off; the
/// general instances handle these calls as well. A crew of 8 warps or more: with 15 tokens (E = 8,
/// K = 2) a one-warp crew made the call 1.11x slower than the general instance.
inline constexpr int kDecodeTokens = 8;
inline constexpr int kCrewBarrier = 2;  // the crew's own barrier (0: __syncthreads(), 1: kSelectedBarrier)
/// LPT: the lanes of a token team (route_token.cuh's Team): 32, or 16 for two tokens per warp (general instances
/// only). A team is the unit of the token ranges, histograms and selection scratch below.
template <class In, int NC, bool kSigmoid, Instance kInstance, int LPT = 32>
__global__ void __launch_bounds__(kThreads, kCtasPerSm<In, NC, LPT>)
    route_fused_kernel(const __grid_constant__ RouteParams p) {
  static_assert(LPT == 32 || kInstance == Instance::general);
  constexpr int kTeams = kThreads / LPT;
  extern __shared__ __align__(16) unsigned char smem[];
  trace_point(p, 0);
  const SmemLayout L = SmemLayout::make(p.experts, p.groups, p.grouped && p.group_lanes == 0, p.info_words, kTeams);
  const int E = p.experts, G = p.groups, K = p.top_k, Kt = p.slots, T = p.tokens;
  const int e_pad = pad8(E);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int team = tid >> (LPT == 32 ? 5 : 4), tl = tid & (LPT - 1);  // token team, lane in the team
  const int nb = gridDim.x;
  uint16_t* hist = reinterpret_cast<uint16_t*>(smem + L.hist);  // [kTeams][e_pad]
  float* bias_s = reinterpret_cast<float*>(smem + L.bias);      // [bias_words(E)], zero past E
  uint2* sel = reinterpret_cast<uint2*>(smem + L.sel) + team * 32;
  uint4* cand = reinterpret_cast<uint4*>(smem + L.cand) + team * 32;
  int* cnt_s = reinterpret_cast<int*>(smem + L.counts);           // [G]
  int* offs_s = reinterpret_cast<int*>(smem + L.offsets);         // [G+1]
  int* base_s = reinterpret_cast<int*>(smem + L.base);            // [E]
  uint32_t* info_s = reinterpret_cast<uint32_t*>(smem + L.info);  // [tokens_per_cta, K] when info_words > 0
  uint32_t* masks = reinterpret_cast<uint32_t*>(hist);            // [E] token masks (token_masks: no histograms)
  uint32_t* wscratch = reinterpret_cast<uint32_t*>(smem + L.scratch) + warp * L.warp_words;
  const WarpScratch ws{wscratch, wscratch + e_pad};

  // The bias row into shared memory (a zero-padded row, -0 as +0: a key, value + bias, is then never -0; see
  // selection_key()). The general, token-mask and decode counts instances load and store it before the first logits
  // row's loads are issued: issued after them, the bias's loads queued behind the CTA's first rows (twenty-second
  // session: dsv3 T = 1024 / 2048-8192 0.970 / 0.955-0.971x of rows first, seed6 0.963-0.982x, with two tokens per
  // warp dsv3 T = 16384 0.957x; the decode counts instance, E = 512 K = 10 T = 6 / 8 0.977 / 0.967x). Loading it
  // into registers before the rows and storing it after them (forty-fourth session) was faster on some calls with a
  // bias (dsv3 T = 64 0.978x, E = 1024 K = 32 T = 64 / 1024 0.964 / 0.981x), slower on others (dsv3 T = 1024 /
  // 16384 1.014 / 1.046x) and on seed6, which has none (1.023-1.047x).
  auto bias_at = [&](int e) {  // 0 past E and without a bias
    float b = 0.0f;
    if (p.bias != nullptr && e < E)
      b = p.bias_bf16 ? load_one(static_cast<const Bf16*>(p.bias) + e)
                      : load_one(static_cast<const float*>(p.bias) + e);
    return b;
  };
  auto load_bias = [&] {
    for (int e = tid; e < bias_words(E); e += kThreads) bias_s[e] = rm::add(bias_at(e), 0.0f);
  };
  // The decode plan instance (T * Kt <= 32: one CTA, a few tokens) issues the row's loads first, then the bias's
  // into registers, and stores the bias just before the CTA's first barrier, after the plan's prefill and the
  // zeroed histograms (forty-fourth session: dsv3 T = 1 3.94-3.95 -> 3.68 us, 0.932-0.935x of loading the bias in
  // one step).
  constexpr int kBiasPerThread = (kMaxExperts + kThreads - 1) / kThreads;
  float bias_r[kBiasPerThread];
  auto issue_bias = [&] {
#pragma unroll
    for (int i = 0; i < kBiasPerThread; ++i) bias_r[i] = bias_at(tid + i * kThreads);
  };
  auto store_bias = [&] {
#pragma unroll
    for (int i = 0; i < kBiasPerThread; ++i) {
      const int e = tid + i * kThreads;
      if (e < bias_words(E)) bias_s[e] = rm::add(bias_r[i], 0.0f);
    }
  };
  if constexpr (kInstance != Instance::decode_plan) load_bias();
  const int cta_t0 = blockIdx.x * p.tokens_per_cta;
  const int cta_t1 = min(cta_t0 + p.tokens_per_cta, T);
  const int t0 = min(cta_t0 + team * p.tokens_per_team, cta_t1);
  const int t1 = min(t0 + p.tokens_per_team, cta_t1);
  RowRegs<In, NC, LPT> row;
  if (t0 < t1) row.load(p, t0, tl, kPadBits<In, kSigmoid>);
  if constexpr (kInstance == Instance::decode_plan) issue_bias();
  // A kernel launched after this one with programmatic stream serialization (the expert GEMV) may start now and
  // wait in griddepcontrol.wait for the plan: its launch latency hides behind the routing.
  asm volatile("griddepcontrol.launch_dependents;" :::);
  const uint32_t epoch = nb > 1 ? __ldcg(p.epoch) : 0u;  // grid_barrier(): stable until every CTA has arrived

  // Teams past the CTA's tokens keep empty histograms: only the active ones are zeroed and scanned.
  const int active_teams =
      cta_t1 > cta_t0 ? plan_div(p, cta_t1 - cta_t0 + p.tokens_per_team - 1, p.tokens_per_team, p.team_tokens_magic)
                      : 0;
  // The plan's rows and blocks (prefill_plan()): when every warp has tokens, all of them now; else the warps without
  // tokens, while the others route (below).
  const int busy_warps = LPT == 32 ? active_teams : (active_teams + 1) / 2;
  const int prefill_warp0 = busy_warps < kWarps ? busy_warps : 0;
  if (prefill_warp0 == 0) prefill_plan(p, T * Kt, 0);
  if constexpr (kInstance == Instance::token_masks) {
    for (int e = tid; e < E; e += kThreads) masks[e] = 0;
  } else if (!p.tiny) {  // a tiny plan ranks without histograms
    for (int i = tid; i < active_teams * e_pad / 2; i += kThreads) reinterpret_cast<uint32_t*>(hist)[i] = 0;
  }
  if constexpr (kInstance == Instance::decode_plan) store_bias();
  __syncthreads();
  trace_point(p, 1);
  if (prefill_warp0 > 0 && warp >= prefill_warp0) prefill_plan(p, T * Kt, prefill_warp0);

  // A. Route this warp's tokens, loading the next row while the current one is selected. The decode instance: warp t
  // routes token t and writes its slots, the crew builds the plan from the routing warps' `sel`.
  if constexpr (kInstance == Instance::decode_plan || kInstance == Instance::decode_counts) {
    if (warp < T) {
      const uint32_t info = route_token<In, NC, kSigmoid, kInstance>(p, warp, row, -1, lane, bias_s,
                                                                     hist + warp * e_pad, masks, ws, sel, cand);
      if constexpr (kInstance == Instance::decode_counts)
        if (lane < K) info_s[warp * K + lane] = info;
    } else {
      wait_selected();  // every routing warp's selection is in its `sel` (and, for counts, its histogram)
      const int c = tid - T * 32, n = kThreads - T * 32;
      trace_point_by(p, 2, c == 0);
      if constexpr (kInstance == Instance::decode_counts) {  // the general code's nb == 1 counts, into cnt_s
        for (int g = c; g < G; g += n) {
          if (g < E) base_s[g] = 0;
          cnt_s[g] = g < E ? warp_prefixes<kTeams>(hist, g, e_pad, T) : T;
        }
      } else {
        const uint2* selected = reinterpret_cast<const uint2*>(smem + L.sel);  // [warp][32] (expert, value)
        if (T == 1) {
          one_token_plan(
              p, [&](int k) { return static_cast<int>(selected[k].x); }, c, n);
        } else {
          // The segment table in the crew's first warp's candidate scratch, its two words in that warp's `sel`.
          auto* seg = reinterpret_cast<TinySegment*>(smem + L.cand) + T * 32;
          auto* nseg = reinterpret_cast<int*>(reinterpret_cast<uint2*>(smem + L.sel) + T * 32);
          tiny_plan<true>(
              p, [&](int t, int k) { return static_cast<int>(selected[t * 32 + k].x); }, seg, nseg, c, n,
              [n] { asm volatile("bar.sync %0, %1;" ::"n"(kCrewBarrier), "r"(n)
                                 : "memory"); });
        }
      }
    }
    if constexpr (kInstance == Instance::decode_plan) return;
  } else {
    uint16_t* my_hist = hist + team * e_pad;
    const uint32_t team_mask = Team<LPT>(lane).mask;
    for (int t = t0; t < t1; ++t) {
      const uint32_t info = route_token<In, NC, kSigmoid, kInstance, LPT>(p, t, row, t + 1 < t1 ? t + 1 : -1, lane,
                                                                          bias_s, my_hist, masks, ws, sel, cand);
      if (tl < K) {
        if (p.info_words > 0)
          info_s[(t - cta_t0) * K + tl] = info;
        else
          p.slot_rows[static_cast<int64_t>(t) * Kt + tl] = static_cast<int32_t>(info);
      }
      __syncwarp(team_mask);
    }
  }
  __syncthreads();
  if constexpr (kInstance == Instance::general || kInstance == Instance::token_masks) {
    trace_point(p, 2);
    if (p.tiny) {
      // The histogram and bias rows (offset 0, >= 16 * 8 * 2 + 256 * 4 bytes) are free after phase A: the segment
      // table (32 x 16 B) and two words (at byte 1024) fit, at an address that needs no register.
      auto* seg = reinterpret_cast<TinySegment*>(smem);
      if (T == 1)
        one_token_plan(
            p, [&](int k) { return static_cast<int>(info_s[k] >> 16); }, tid, kThreads);
      else
        tiny_plan<false>(
            p, [&](int t, int k) { return static_cast<int>(info_s[t * K + k] >> 16); }, seg,
            reinterpret_cast<int*>(seg + 64), tid, kThreads, [] { __syncthreads(); });
      return;
    }
  }

  // B. Counts: group g's count goes to the thread that owns it in the scan (kGroupsPerThread consecutive groups
  // per thread). One CTA: that thread also turns the per-warp histograms of its experts into per-warp exclusive
  // prefixes (token_masks: the popcount of the expert's token mask). Several CTAs: per-warp prefixes (or token-mask
  // popcounts) and the CTA's totals, published as the CTA's row and added to the expert totals; -- grid barrier --;
  // totals and the sums of earlier CTAs' rows are read back.
  int cnt[kGroupsPerThread];
  const int g0 = tid * kGroupsPerThread;
  if (nb == 1) {
#pragma unroll
    for (int i = 0; i < kGroupsPerThread; ++i) {
      const int g = g0 + i;
      if constexpr (kInstance == Instance::decode_counts) {  // the crew counted
        cnt[i] = g < G ? cnt_s[g] : 0;
      } else if constexpr (kInstance == Instance::token_masks) {
        if (g < E) base_s[g] = 0;
        cnt[i] = g < E ? __popc(masks[g]) : (g < G ? T : 0);
      } else {
        if (g < E) base_s[g] = 0;
        cnt[i] = g < E ? warp_prefixes<kTeams>(hist, g, e_pad, active_teams) : (g < G ? T : 0);
      }
    }
    trace_point(p, 3);
  } else {
    for (int e = tid; e < E; e += kThreads)
      base_s[e] =
          kInstance == Instance::token_masks ? __popc(masks[e]) : warp_prefixes<kTeams>(hist, e, e_pad, active_teams);
    int32_t* totals = p.totals + (epoch & 1u) * e_pad;
    uint16_t* my_row = p.cta_rows + static_cast<int64_t>(blockIdx.x) * e_pad;
    for (int e = tid; e < e_pad; e += kThreads) {
      const int c = e < E ? base_s[e] : 0;
      __stcg(my_row + e, static_cast<uint16_t>(c));
      if (c > 0) atomicAdd(totals + e, c);
    }
    if (blockIdx.x == 0) {  // the next call's buffer: nobody reads it in this call
      int32_t* next = p.totals + (~epoch & 1u) * e_pad;
      for (int e = tid; e < e_pad; e += kThreads) __stcg(next + e, 0);
    }
    trace_point(p, 3);
    grid_barrier(p.arrivals, p.epoch, epoch);
#pragma unroll
    for (int i = 0; i < kGroupsPerThread; ++i) {
      const int g = g0 + i;
      cnt[i] = g < E ? __ldcg(totals + g) : (g < G ? T : 0);
    }
    sum_earlier_rows(p.cta_rows, E, p.octet_magic, reinterpret_cast<int*>(smem + L.scratch), base_s);
  }
  trace_point(p, 4);

  // C. Offsets: padded counts scanned in one block scan (its barrier also orders the base_s writes above before
  // the reads below); then every CTA scatters its slots.
  const int B = p.block;
  int padded[kGroupsPerThread], off[kGroupsPerThread], used = 0;
#pragma unroll
  for (int i = 0; i < kGroupsPerThread; ++i) padded[i] = plan_div(p, cnt[i] + B - 1, B, p.block_magic) * B;
  {
    __shared__ typename BlockScan::TempStorage scan_storage;
    BlockScan(scan_storage).ExclusiveSum(padded, off, used);
  }
#pragma unroll
  for (int i = 0; i < kGroupsPerThread; ++i) {
    const int g = g0 + i;
    if (g < G) {
      cnt_s[g] = cnt[i];
      offs_s[g] = off[i];
      if (g < E) base_s[g] += off[i];
      if (blockIdx.x == 0) {
        p.expert_counts[g] = cnt[i];
        p.expert_offsets[g] = off[i];
      }
    }
  }
  if (tid == 0) {
    offs_s[G] = used;
    if (blockIdx.x == 0) {
      p.expert_offsets[G] = used;
      p.extent[0] = used;
      p.extent[1] = plan_div(p, used, B, p.block_magic);
    }
  }
  __syncthreads();
  trace_point(p, 5);
  const int s1 = cta_t1 * Kt;
  for (int s = cta_t0 * Kt + tid; s < s1; s += kThreads) {
    const int t = plan_div(p, s, Kt, p.slot_magic);
    const int k = s - t * Kt;
    int row_id;
    if (k < K) {
      const uint32_t packed = p.info_words > 0 ? info_s[(t - cta_t0) * K + k] : static_cast<uint32_t>(p.slot_rows[s]);
      const int e = static_cast<int>(packed >> 16);
      if constexpr (kInstance == Instance::token_masks) {  // t - cta_t0 < kWarps
        row_id = base_s[e] + __popc(masks[e] & ((1u << (t - cta_t0)) - 1u));
      } else {
        const int w = plan_div(p, t - cta_t0, p.tokens_per_team, p.team_tokens_magic);
        row_id = base_s[e] + hist[w * e_pad + e] + static_cast<int>(packed & 0xffffu);
      }
    } else {
      row_id = offs_s[E + k - K] + t;
    }
    p.sorted_slots[row_id] = s;
    p.slot_rows[s] = row_id;
  }
  trace_point(p, 6);

  // Block -> expert, a lane per group: chunk q of 32 consecutive groups goes to CTA q % nb (then its next warp, from
  // the last one down: the first warps scatter the CTA's slots above, and with few tokens per CTA only they do), and
  // each lane writes its group's block_experts entries (its segment ends where the next group's begins). Padding
  // rows and blocks past the extent keep what prefill_plan() wrote. A lane's work is its group's padded rows / B
  // stores: 40 on seed6 at T = 16384 (320 rows per expert), more with a few experts, small B and many tokens (E = 8,
  // B = 16, T = 16384: 256 serial stores per lane).
  for (int q = blockIdx.x + nb * (kWarps - 1 - warp); q * 32 < G; q += nb * kWarps) {
    const int g = q * 32 + lane;
    if (g < G && cnt_s[g] > 0) {
      const int b1 = plan_div(p, offs_s[g + 1], B, p.block_magic);
      for (int b = plan_div(p, offs_s[g], B, p.block_magic); b < b1; ++b) p.block_experts[b] = g;
    }
  }
  trace_point(p, 7);
}

}  // namespace moekit::detail::router

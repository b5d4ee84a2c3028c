// Warp-per-token top-k of the fused router (or half-warp-per-token: a Team of 16 lanes, two tokens per warp at
// once, where a grid gives each warp several tokens). One team reads a token's logits row (16-byte loads: lane l
// holds V consecutive experts of each LPT*V-wide chunk, NC chunks, so the expert capacity is a compile-time constant
// and every per-value loop unrolls into registers), computes each selection key once with routing_math (bit-identical
// to the CPU) as an order-preserving integer (0 = not selectable, NaN = 1), applies group limiting, then picks
// the K best. Usually by a threshold (the K-th largest lane maximum) that few values reach, ranking those few
// against each other; otherwise (many ties, a few lanes holding every winner) by K rounds of a warp argmax (a
// REDUX on the key; a second one on the expert only when keys tie), where each lane offers its own best and keeps
// its second best, so only a lane that wins twice rescans its keys (those below the last one it gave away: a
// lane's winners always leave in descending order). The whole path is one dependent chain per token, so it is
// written for latency: no per-value branches (the bias is a zero-padded shared row, the sigmoid's division has its
// rare slow path hoisted out of the value loop), the winners' values travel with their keys instead of being
// reloaded, and groups that sit in whole lanes are scored in registers.
#pragma once

#include <cstdint>

#include "moekit/routing.h"
#include "routing/routing_math.h"

namespace moekit::detail::router {

namespace rm = moekit::routing_math;

inline constexpr uint32_t kFullMask = 0xffffffffu;

/// The lanes that route one token: the whole warp (LPT = 32), or half of it (LPT = 16: a warp routes two tokens at
/// once, each half with its own shared scratch and histogram, as if it were a warp of 16 lanes). Every collective of
/// the token path names the team's lanes only, so the two halves may diverge.
template <int LPT>
struct Team {
  static_assert(LPT == 16 || LPT == 32);
  uint32_t mask;  // the team's lanes
  int base;       // its first lane
  int l;          // this lane's index in the team
  __device__ __forceinline__ explicit Team(int lane)
      : mask(LPT == 32 ? kFullMask : 0xffffu << (lane & 16)), base(LPT == 32 ? 0 : lane & 16), l(lane & (LPT - 1)) {}
};

/// Everything one launch reads and writes. Pointers are device memory; sizes in elements.
struct RouteParams {
  const void* logits = nullptr;  // [T, row_stride] fp32 or bf16, E valid columns
  int64_t row_stride = 0;
  const void* bias = nullptr;  // [E] fp32 or bf16, or null
  int bias_bf16 = 0;
  int tokens = 0, experts = 0, top_k = 0, slots = 0, groups = 0, block = 1;  // T, E, K, Kt, G, B
  int method = 0, renormalize = 0;
  float scale = 1.0f;
  int n_group = 1, topk_group = 1, group_size = 1;
  uint32_t group_magic = 0;  // rm::division_magic(group_size): expert / group_size == rm::magic_div(expert, magic)
  int grouped = 0;           // group limiting active (sigmoid_grouped, topk_group < n_group)
  int group_lanes = 0;       // > 0: a group is this many whole lanes (a power of two) and n_group <= 32
  int vector_ok = 0;         // rows 16-byte aligned and E a multiple of the vector width
  int plan_blocks = 0;       // capacity / B: the plan's blocks for this T (x B: its sorted_slots rows)
  int tokens_per_cta = 0, tokens_per_team = 0;
  int info_words = 0;  // > 0: (expert << 16 | rank) of routed slots kept in shared memory [tokens_per_cta, K]
  int tiny = 0;        // one CTA, one token per team and T * Kt <= 32: the plan is built by tiny_plan()
  uint32_t slot_magic = 0, block_magic = 0;  // rm::division_magic(Kt), rm::division_magic(B)
  uint32_t team_tokens_magic = 0;            // rm::division_magic(tokens_per_team)
  uint32_t octet_magic = 0;                  // rm::division_magic(pad8(E) / 8)
  int small_plan = 0;                        // capacity + B < 2^16: plan indices divide by the magics
  int prefill_blocks = 0;                    // plan blocks (and their rows) each CTA pre-fills: ceil(blocks / grid)
  int32_t* topk_ids = nullptr;               // [T, Kt]
  float* topk_weights = nullptr;             // [T, Kt]
  int32_t* expert_counts = nullptr;          // [G]
  int32_t* expert_offsets = nullptr;         // [G+1]
  int32_t* sorted_slots = nullptr;           // [capacity]
  int32_t* slot_rows = nullptr;      // [T, Kt]; (expert << 16 | rank in warp) until the scatter if info_words = 0
  int32_t* block_experts = nullptr;  // [capacity / B]
  int32_t* extent = nullptr;         // [2]
  int16_t* replay = nullptr;         // [R, K] or null
  uint32_t* epoch = nullptr;         // workspace: grid-barrier arrivals before this call | the call's parity (bit 0)
  uint32_t* arrivals = nullptr;      // workspace: 2 * grid-barrier arrivals of all calls (mod 2^32)
  int32_t* totals = nullptr;         // workspace [2][e_pad8]: expert totals, one buffer per call parity
  uint16_t* cta_rows = nullptr;      // workspace [kMaxCtas][e_pad8]: per-CTA expert counts
  uint64_t* trace = nullptr;         // null, or [grid][kTracePoints][2] (%globaltimer ns, clock64) for benchmarks
};

/// Phase boundaries the kernel stamps when RouteParams::trace is set (see route_cuda.h).
inline constexpr int kTracePoints = 8;

/// Thread `me` records its CTA's time at phase boundary `i` (a uniform branch when tracing is off).
__device__ __forceinline__ void trace_point_by(const RouteParams& p, int i, bool me) {
  if (p.trace != nullptr && me) {
    uint64_t ns;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
    p.trace[(blockIdx.x * kTracePoints + i) * 2] = ns;
    p.trace[(blockIdx.x * kTracePoints + i) * 2 + 1] = static_cast<uint64_t>(clock64());
  }
}

/// Thread 0 of each CTA records the time at phase boundary `i`.
__device__ __forceinline__ void trace_point(const RouteParams& p, int i) {
  trace_point_by(p, i, threadIdx.x == 0);
}

/// In the decode instances, the routing warps hand their selections (`sel`) to the warps without tokens by a named
/// barrier of the whole CTA: arrive_selected() arrives without waiting (the caller's shared-memory stores before the
/// arrival are visible to the waiters), wait_selected() waits for every thread.
inline constexpr int kSelectedBarrier = 1;  // barrier 0 is __syncthreads()'s
__device__ __forceinline__ void arrive_selected() {
  asm volatile("bar.arrive %0, %1;" ::"n"(kSelectedBarrier), "r"(blockDim.x) : "memory");
}
__device__ __forceinline__ void wait_selected() {
  asm volatile("bar.sync %0, %1;" ::"n"(kSelectedBarrier), "r"(blockDim.x) : "memory");
}

/// The fused router's kernel instances. The decode instances (calls of one CTA, one token per warp, at most
/// kDecodeTokens) hand each routing warp's selection to the warps without tokens: its selected experts for the plan
/// (decode_plan: arrive_selected(); T * Kt <= 32), or its selection counted in its histogram for phase B's counts
/// (decode_counts: wait_selected(), a full barrier of the CTA). token_masks: the other calls of one token per warp;
/// a routed slot sets its token's bit in its expert's token mask (a shared [E] array of the CTA, bit i for the CTA's
/// token i) instead of bumping a histogram. general: every call, with histograms.
enum class Instance { general, decode_plan, decode_counts, token_masks };

/// Raw bf16 bits, so the device code needs no cuda_bf16 header.
struct Bf16 {
  uint16_t bits;
};

__device__ __forceinline__ float element(const uint4& v, int i, float*) {
  const uint32_t w = i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
  return __uint_as_float(w);
}
__device__ __forceinline__ float element(const uint4& v, int i, Bf16*) {
  const uint32_t w = (i >> 1) == 0 ? v.x : (i >> 1) == 1 ? v.y : (i >> 1) == 2 ? v.z : v.w;
  return __uint_as_float((i & 1) ? (w & 0xffff0000u) : (w << 16));
}
__device__ __forceinline__ uint32_t scalar_bits(const float* p) {
  return __float_as_uint(__ldg(p));
}
__device__ __forceinline__ uint32_t scalar_bits(const Bf16* p) {
  return static_cast<uint32_t>(__ldg(reinterpret_cast<const unsigned short*>(p)));
}
__device__ __forceinline__ float load_one(const float* p) {
  return __ldg(p);
}
__device__ __forceinline__ float load_one(const Bf16* p) {
  return __uint_as_float(static_cast<uint32_t>(__ldg(reinterpret_cast<const unsigned short*>(p))) << 16);
}

/// Inverse of rm::ordered_key (NaN comes back as a NaN, -0 as +0).
__device__ __forceinline__ float from_ordered(uint32_t o) {
  return __uint_as_float((o & 0x80000000u) ? (o & 0x7fffffffu) : ~o);
}

/// Sum over a team's lanes [0, n) of values that are 0 in its lanes >= n (n <= LPT): a butterfly over the first
/// power of two >= n lanes only (3 steps for K = 8 instead of 5).
__device__ __forceinline__ float sum_first_lanes(float v, int n, uint32_t mask) {
  const int width = n <= 1 ? 1 : 1 << (32 - __clz(n - 1));
  for (int off = width >> 1; off > 0; off >>= 1) v += __shfl_xor_sync(mask, v, off);
  return v;
}

/// Sum over the LPT lanes of a team.
template <int LPT>
__device__ __forceinline__ float team_sum(float v, uint32_t mask) {
#pragma unroll
  for (int off = LPT / 2; off > 0; off >>= 1) v += __shfl_xor_sync(mask, v, off);
  return v;
}

/// e^x for the softmax denominator only (x <= 0): ex2.approx, within a few ulp near the max where terms matter.
__device__ __forceinline__ float fast_exp(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x * 1.4426950408889634f));
  return y;
}

/// exp(logit - max) with the reference's conventions: NaN -> 0, the max itself (also +inf) -> exactly 1.
__device__ __forceinline__ float softmax_term(float logit, float max) {
  if (logit != logit) return 0.0f;
  return logit == max ? 1.0f : rm::exp(rm::add(logit, -max));
}

/// One token's row as NC 16-byte vectors per lane: lane l of a team of LPT lanes holds experts (c*LPT + l)*V ..
/// +V-1 of chunk c. Columns past E hold `pad` (an element's bits: 0, or -inf so that a row max and a sum of
/// exponentials ignore them).
template <class In, int NC, int LPT = 32>
struct RowRegs {
  static constexpr int V = 16 / sizeof(In);
  uint4 v[NC];

  __device__ __forceinline__ void load(const RouteParams& p, int64_t t, int lane, uint32_t pad) {
    const In* row = static_cast<const In*>(p.logits) + t * p.row_stride;
    if (p.vector_ok && p.experts == LPT * V * NC) {  // a full row: no column past E, no per-vector check
#pragma unroll
      for (int c = 0; c < NC; ++c) v[c] = __ldg(reinterpret_cast<const uint4*>(row + (c * LPT + lane) * V));
      return;
    }
    const uint32_t pad_word = V == 4 ? pad : pad << 16 | pad;
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int e0 = (c * LPT + lane) * V;
      v[c] = make_uint4(pad_word, pad_word, pad_word, pad_word);
      if (p.vector_ok) {
        if (e0 < p.experts) v[c] = __ldg(reinterpret_cast<const uint4*>(row + e0));
      } else {
        uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
        for (int i = 0; i < V; ++i) {
          const uint32_t b = e0 + i < p.experts ? scalar_bits(row + e0 + i) : pad;
          if (V == 4)
            w[i] = b;
          else
            w[i >> 1] |= (i & 1) ? (b << 16) : b;
        }
        v[c] = make_uint4(w[0], w[1], w[2], w[3]);
      }
    }
  }
};

/// Selection key of a value that is not -0: rm::ordered_key() without its -0 step, NaN as 1 (below every number,
/// above "none" = 0). Two integer instructions, a compare and a select; no branch.
__device__ __forceinline__ uint32_t selection_key(float s) {
  const uint32_t o = rm::order_bits(__float_as_uint(s));
  return s != s ? 1u : o;
}

/// Bits of a column past E: -inf where the values feed a softmax (its row max and sum of exponentials then need no
/// mask), 0 before a sigmoid (keeps sigmoid_all() on its fast path). Selection keys mask such columns either way.
template <class In, bool kSigmoid>
inline constexpr uint32_t kPadBits = kSigmoid ? 0u : (sizeof(In) == 4 ? 0xff800000u : 0xff80u);

/// Expert held in value j (j = chunk * V + i) of lane l of a team of LPT lanes; j may be a run-time value.
template <int V, int LPT = 32>
__device__ __forceinline__ int expert_of(int j, int l) {
  return (j / V) * LPT * V + l * V + (j % V);
}

/// Per-warp shared memory for group limiting: keys [E] (then group scores) and 32 kept-group mask words.
struct WarpScratch {
  uint32_t* keys;
  uint32_t* kept;
};

/// A lane's candidate: key (0 = none), value index j and the value the weight is computed from.
struct Offer {
  uint32_t key;
  int j;
  float value;
};

/// The lane's best two values in selection order (key descending, then j ascending) among those whose bit in
/// `taken` is clear. A key of 0 means none.
template <int VPT>
__device__ __forceinline__ void lane_top2(const uint32_t (&k)[VPT], const float (&v)[VPT], uint32_t taken,
                                          Offer& first, Offer& second) {
  first = {0u, 0, 0.0f};
  second = {0u, 0, 0.0f};
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    const uint32_t key = (taken >> j) & 1u ? 0u : k[j];
    const bool above_first = key > first.key, above_second = key > second.key;
    second = above_first ? first : (above_second ? Offer{key, j, v[j]} : second);
    first = above_first ? Offer{key, j, v[j]} : first;
  }
}

/// Stores (a, b, c, d) to the shared address `addr` when `pred` holds.
__device__ __forceinline__ void st_shared4_if(bool pred, uint32_t addr, uint32_t a, uint32_t b, uint32_t c,
                                              uint32_t d) {
  asm volatile("{\n .reg .pred p;\n setp.ne.u32 p, %0, 0;\n @p st.shared.v4.u32 [%1], {%2, %3, %4, %5};\n}" ::"r"(
                   static_cast<uint32_t>(pred)),
               "r"(addr), "r"(a), "r"(b), "r"(c), "r"(d)
               : "memory");
}

/// The K best values (key descending, then expert ascending) into sel[0, K) as (expert, value), when at most 32
/// values reach the threshold below; returns false, having written nothing to sel, when more do (ties, a few
/// lanes holding everything), and the caller selects by rounds instead. The threshold is the K-th largest of
/// the team's LPT lane maxima (a bitonic sort across the lanes; K <= LPT): at least K values reach it, so the K best
/// are among those that do. Those candidates are compacted into `cand` (32 x (~expert, key, value, -) per team) and
/// each candidate's rank is counted against all of them: a fixed number of steps instead of K dependent rounds.
template <int V, int VPT, int LPT>
__device__ __forceinline__ bool select_by_threshold(const uint32_t (&k)[VPT], const float (&v)[VPT], int K,
                                                    const Team<LPT>& tm, uint4* cand, uint2* sel) {
  const int l = tm.l;
  uint32_t m = 0;
#pragma unroll
  for (int j = 0; j < VPT; ++j) m = max(m, k[j]);
#pragma unroll
  for (int size = 2; size <= LPT; size <<= 1)
#pragma unroll
    for (int stride = size >> 1; stride > 0; stride >>= 1) {  // descending: lane i ends with the (i+1)-th largest
      const uint32_t o = __shfl_xor_sync(tm.mask, m, stride);
      m = ((l & size) == 0) == ((l & stride) == 0) ? max(m, o) : min(m, o);
    }
  const uint32_t thr = max(__shfl_sync(tm.mask, m, tm.base + K - 1), 1u);  // key 0 is "none", never a candidate
  int n = 0;
#pragma unroll
  for (int j = 0; j < VPT; ++j) n += k[j] >= thr ? 1 : 0;
  int at = n;  // inclusive scan of the lanes' counts
#pragma unroll
  for (int off = 1; off < LPT; off <<= 1) {
    const int o = __shfl_up_sync(tm.mask, at, off, LPT);
    at += l >= off ? o : 0;
  }
  const int total = __shfl_sync(tm.mask, at, tm.base + LPT - 1);
  if (total > 32) return false;
  at -= n;
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(cand));
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    const bool c = k[j] >= thr;
    st_shared4_if(c, base + 16u * static_cast<uint32_t>(at), ~static_cast<uint32_t>(expert_of<V, LPT>(j, l)), k[j],
                  __float_as_uint(v[j]), 0u);
    at += c ? 1 : 0;
  }
  __syncwarp(tm.mask);
  // One candidate per lane (two per lane in a team of 16: up to 32 candidates).
#pragma unroll
  for (int q = 0; q < 32 / LPT; ++q) {
    const int ci = l + q * LPT;
    if (ci < total) {
      // (key, ~expert) as one 64-bit word: larger is selected first, equal keys prefer the lower expert.
      const uint4 me = cand[ci];
      const uint64_t order = static_cast<uint64_t>(me.y) << 32 | me.x;
      int rank = 0;
#pragma unroll 4
      for (int i = 0; i < total; ++i) rank += *reinterpret_cast<const uint64_t*>(cand + i) > order ? 1 : 0;
      if (rank < K) sel[rank] = make_uint2(~me.x, me.z);
    }
  }
  return true;
}

/// Stores (a, b) to the shared address `addr` when `pred` holds: one predicated instruction, no branch.
__device__ __forceinline__ void st_shared_if(bool pred, uint32_t addr, uint32_t a, uint32_t b) {
  asm volatile("{\n .reg .pred p;\n setp.ne.u32 p, %0, 0;\n @p st.shared.v2.u32 [%1], {%2, %3};\n}" ::"r"(
                   static_cast<uint32_t>(pred)),
               "r"(addr), "r"(a), "r"(b)
               : "memory");
}

/// 1 / d, bitwise equal to __fdiv_rn(1, d) for d in [1, 2^100]: the reciprocal estimate and the two FMA
/// refinements of CUDA's division fast path, whose operand check always passes in that range.
__device__ __forceinline__ float recip_in_range(float d) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d));
  r = __fmaf_rn(r, __fmaf_rn(-d, r, 1.0f), r);
  return __fmaf_rn(r, __fmaf_rn(-d, r, 1.0f), r);
}

/// rm::sigmoid(x) for x >= -69 (then 1 + exp(-x) <= 1 + 9.3e29 < 2^100), bit for bit. exp's argument is clamped
/// at -80 into exp_normal_range(): for x > 80, exp(-x) < 2^-115 and 1 + exp(-x) rounds to 1 either way.
__device__ __forceinline__ float sigmoid_in_range(float x) {
  return recip_in_range(rm::add(1.0f, rm::exp_normal_range(fmaxf(-x, -80.0f))));
}

/// s[j] = rm::sigmoid(x[j]) for every j, bit for bit: the exps and the reciprocals of all values interleave; the
/// exact division runs only in a lane that holds a value below -69 or a NaN.
template <int VPT>
__device__ __forceinline__ void sigmoid_all(const float (&x)[VPT], float (&s)[VPT]) {
  bool slow = false;
#pragma unroll
  for (int j = 0; j < VPT; ++j) slow |= !(x[j] >= -69.0f);
  if (slow) {
#pragma unroll
    for (int j = 0; j < VPT; ++j) s[j] = rm::sigmoid(x[j]);
  } else {
#pragma unroll
    for (int j = 0; j < VPT; ++j) s[j] = sigmoid_in_range(x[j]);
  }
}

/// Group limiting when a group is p.group_lanes whole lanes of a chunk and n_group <= LPT (the launcher checks
/// both against the team), all in registers: each lane's two best keys, a butterfly over the group's lanes, the
/// team's lane g then holds group g's score and counts the groups ahead of it. Same result as limit_groups().
template <int V, int VPT, int LPT>
__device__ __forceinline__ void limit_groups_in_lanes(const RouteParams& p, uint32_t (&k)[VPT], const Team<LPT>& tm) {
  constexpr int NC = VPT / V;
  constexpr int kLog2Lanes = LPT == 32 ? 5 : 4;
  const int l = tm.l;
  const int lpg = p.group_lanes, ng = p.n_group;
  const int lpg_shift = __ffs(lpg) - 1, per_chunk = LPT >> lpg_shift;  // lpg is a power of two: no divisions
  uint32_t a1[NC], a2[NC];
#pragma unroll
  for (int c = 0; c < NC; ++c) {
    a1[c] = 0;
    a2[c] = 0;
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const uint32_t o = k[c * V + i] == 1u ? 0u : k[c * V + i];  // the reference's NaN convention
      a2[c] = o > a1[c] ? a1[c] : max(a2[c], o);
      a1[c] = max(a1[c], o);
    }
  }
  for (int off = 1; off < lpg; off <<= 1) {
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const uint32_t b1 = __shfl_xor_sync(tm.mask, a1[c], off), b2 = __shfl_xor_sync(tm.mask, a2[c], off);
      a2[c] = max(min(a1[c], b1), max(a2[c], b2));
      a1[c] = max(a1[c], b1);
    }
  }
  // Lane g (< ng) fetches group g's score from the first lane of that group.
  const int src = tm.base + ((l & (per_chunk - 1)) << lpg_shift), mine_chunk = l >> (kLog2Lanes - lpg_shift);
  uint32_t mine = 0;
#pragma unroll
  for (int c = 0; c < NC; ++c) {
    const uint32_t score = rm::ordered_key(rm::add(from_ordered(a1[c]), from_ordered(a2[c])));
    const uint32_t got = __shfl_sync(tm.mask, score, src);
    if (c == mine_chunk) mine = got;
  }
  int rank = 0;
#pragma unroll 4
  for (int h = 0; h < ng; ++h) {
    const uint32_t oh = __shfl_sync(tm.mask, mine, tm.base + h);
    rank += (oh > mine) || (oh == mine && h < l);
  }
  const uint32_t kept = __ballot_sync(tm.mask, l < ng && rank < p.topk_group) >> tm.base;
#pragma unroll
  for (int c = 0; c < NC; ++c) {
    const int g = c * per_chunk + (l >> lpg_shift);
#pragma unroll
    for (int i = 0; i < V; ++i)
      if (g >= LPT || !((kept >> g) & 1u)) k[c * V + i] = 0u;  // groups >= n_group hold no valid expert
  }
}

/// Group limiting: group score = sum of its two best keys; keys of groups outside the topk_group best become 0.
template <int V, int VPT>
__device__ __forceinline__ void limit_groups(const RouteParams& p, uint32_t (&k)[VPT], int lane,
                                             const WarpScratch& ws) {
  const int E = p.experts;
  // Shared copy with the reference's key convention (NaN -> 0).
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    const int e = expert_of<V>(j, lane);
    if (e < E) ws.keys[e] = k[j] == 1u ? 0u : k[j];
  }
  __syncwarp();
  const int ng = p.n_group, gs = p.group_size;
  int lpg = 1;  // lanes per group: a power of two
  if (ng < 32) lpg = 1 << (31 - __clz(32 / ng));
  const int per_iter = 32 / lpg;
  for (int g0 = 0; g0 < ng; g0 += per_iter) {
    const int g = g0 + lane / lpg, s = lane & (lpg - 1);
    uint32_t a1 = 0, a2 = 0;
    if (g < ng)
      for (int j = s; j < gs; j += lpg) {
        const uint32_t o = ws.keys[g * gs + j];
        if (o > a1) {
          a2 = a1;
          a1 = o;
        } else if (o > a2) {
          a2 = o;
        }
      }
    for (int off = 1; off < lpg; off <<= 1) {
      const uint32_t b1 = __shfl_xor_sync(kFullMask, a1, off), b2 = __shfl_xor_sync(kFullMask, a2, off);
      const uint32_t hi = max(a1, b1), lo = max(min(a1, b1), max(a2, b2));
      a1 = hi;
      a2 = lo;
    }
    const float score = gs == 1 ? from_ordered(a1) : rm::add(from_ordered(a1), from_ordered(a2));
    __syncwarp();
    // Overwrites keys of groups <= g only, all read already.
    if (g < ng && s == 0) ws.keys[g] = rm::ordered_key(score);
    __syncwarp();
  }
  for (int g0 = 0; g0 < ng; g0 += 32) {
    const int g = g0 + lane;
    bool kept = false;
    if (g < ng) {
      const uint32_t og = ws.keys[g];
      int rank = 0;
      for (int h = 0; h < ng && rank < p.topk_group; ++h) {
        const uint32_t oh = ws.keys[h];
        rank += (oh > og) || (oh == og && h < g);
      }
      kept = rank < p.topk_group;
    }
    const uint32_t bits = __ballot_sync(kFullMask, kept);
    if (lane == 0) ws.kept[g0 >> 5] = bits;
  }
  __syncwarp();
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    const uint32_t e = static_cast<uint32_t>(expert_of<V>(j, lane));
    const uint32_t g = rm::magic_div(e, p.group_magic);
    if (e < static_cast<uint32_t>(E) && !((ws.kept[g >> 5] >> (g & 31)) & 1)) k[j] = 0;
  }
  __syncwarp();  // the next token's keys overwrite ws.keys
}

/// Routes token t from `row` and, once the keys are computed, starts loading token `next` (if >= 0) into `row`, in a
/// team of LPT lanes (Team: the warp, or half of it); `lane` is the lane's index in the warp and `sel`, `cand`,
/// `hist` and `ws` are the team's.
/// kSigmoid: the key is sigmoid(logit) + bias (sigmoid_grouped), else logit + bias. `bias_s` is the bias row in
/// shared memory, zero-padded to the kernel's expert capacity (all zeros without a bias: adding +0 changes no
/// key's order). `sel` is 32 (expert, value) pairs and `cand` 32 candidates of per-warp shared scratch. Writes the
/// token's ids, weights and replay row; returns (expert << 16 | rank in warp) of slot `lane` (lanes < K; ranks count
/// earlier tokens of this warp, so the plan is deterministic) and bumps the warp's histogram; a tiny plan (one token
/// per warp: every rank 0) needs neither, and token_masks sets the slot's bit in `masks` (the CTA's token masks)
/// instead. kInstance: see Instance (the instances other than general: teams of 32 lanes only).
template <class In, int NC, bool kSigmoid, Instance kInstance, int LPT = 32>
__device__ __forceinline__ uint32_t route_token(const RouteParams& p, int64_t t, RowRegs<In, NC, LPT>& row,
                                                int64_t next, int lane, const float* bias_s, uint16_t* hist,
                                                uint32_t* masks, const WarpScratch& ws, uint2* sel, uint4* cand) {
  static_assert(LPT == 32 || kInstance == Instance::general);
  constexpr int V = RowRegs<In, NC, LPT>::V;
  constexpr int VPT = NC * V;
  const int E = p.experts, K = p.top_k;
  const auto method = static_cast<RoutingMethod>(p.method);
  const Team<LPT> tm(lane);
  const int l = tm.l;

  float x[VPT];
#pragma unroll
  for (int c = 0; c < NC; ++c)
#pragma unroll
    for (int i = 0; i < V; ++i) x[c * V + i] = element(row.v[c], i, static_cast<In*>(nullptr));
  constexpr bool kEarlyNext = VPT <= 16;  // see the next row's load below
  if constexpr (!kEarlyNext)
#pragma unroll
    for (int c = 0; c < NC; ++c) row.v[c] = make_uint4(0, 0, 0, 0);  // dead until reloaded: frees 4 * NC registers

  // The value each weight comes from (sigmoid(logit) or the logit), then the selection keys: 0 for columns past
  // E, NaN as 1 (below every number, above "none"). The shared bias row holds no -0, so no sum is -0.
  float v[VPT];
  if constexpr (kSigmoid)
    sigmoid_all(x, v);
  else
#pragma unroll
    for (int j = 0; j < VPT; ++j) v[j] = x[j];
  uint32_t k[VPT];
#pragma unroll
  for (int c = 0; c < NC; ++c) {
    float b[V];
#pragma unroll
    for (int q = 0; q < V; q += 4) {
      const float4 b4 = *reinterpret_cast<const float4*>(bias_s + (c * LPT + l) * V + q);
      b[q] = b4.x;
      b[q + 1] = b4.y;
      b[q + 2] = b4.z;
      b[q + 3] = b4.w;
    }
#pragma unroll
    for (int i = 0; i < V; ++i) k[c * V + i] = selection_key(rm::add(v[c * V + i], b[i]));
  }
  if (E < LPT * VPT) {  // columns past E (a warp-uniform branch: most shapes fill the instance's capacity)
#pragma unroll
    for (int j = 0; j < VPT; ++j) k[j] = expert_of<V, LPT>(j, l) < E ? k[j] : 0u;
  }
  // The row registers are free now: the next row loads while this one is selected, except in the 32-value
  // instances, where keeping both would spill (there it loads once this token is done).
  if (kEarlyNext && next >= 0) row.load(p, next, l, kPadBits<In, kSigmoid>);
  if constexpr (kSigmoid) {  // only sigmoid_grouped limits groups
    if (p.grouped) {
      if (p.group_lanes > 0)
        limit_groups_in_lanes<V>(p, k, tm);
      else if constexpr (LPT == 32)  // teams of 16 lanes take only groups of whole lanes (the launcher's rule)
        limit_groups<V>(p, k, lane, ws);
    }
  }

  // softmax_topk's row max over non-NaN logits and full-row denominator: computed without a branch in every
  // logit-keyed instance, so that its reductions overlap the first offer scan below (other methods, and softmax_topk
  // renormalized, ignore them); in the 32-value instances after the rounds, when the keys' registers are free.
  // Columns past E hold -inf, so neither the max (fmaxf skips NaN) nor the sum needs a mask; a NaN logit, or a row
  // max of +-inf, makes the sum NaN, and only then (uniformly) is it redone with the exact conventions: NaN terms 0,
  // the max's terms 1.
  float row_max = 0.0f, denom = 1.0f;
  auto softmax_stats = [&] {
    float lane_max = -__int_as_float(0x7f800000);
#pragma unroll
    for (int j = 0; j < VPT; ++j) lane_max = fmaxf(lane_max, v[j]);
    row_max = from_ordered(__reduce_max_sync(tm.mask, rm::ordered_key(lane_max)));  // -inf if every logit NaN
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < VPT; ++j) s += fast_exp(v[j] - row_max);
    denom = team_sum<LPT>(s, tm.mask);
    if (denom != denom) {
      s = 0.0f;
#pragma unroll
      for (int j = 0; j < VPT; ++j) {
        const float term = v[j] == row_max ? 1.0f : fast_exp(v[j] - row_max);
        s += expert_of<V, LPT>(j, l) < E && v[j] == v[j] ? term : 0.0f;
      }
      denom = team_sum<LPT>(s, tm.mask);
    }
  };
  if constexpr (!kSigmoid && VPT <= 16) softmax_stats();

  // Selection: by threshold when at most 32 values reach it, else K rounds of warp argmax over the lanes'
  // offers, where the winner falls back to its second best. Ties on the key (rare) take a second REDUX for the
  // lowest expert.
  // The common path of a round has no divergent branch: the winner stores round r's expert and value to sel[r]
  // and updates its offers under predicates, and the rescan (a lane winning twice since its last scan) runs
  // warp-uniformly over the values not yet taken.
  bool selected = false;
  if constexpr (VPT <= 16) selected = select_by_threshold<V>(k, v, K, tm, cand, sel);  // 32 values: would spill
  if (!selected) {
    Offer first, second;
    uint32_t taken = 0;
    lane_top2(k, v, taken, first, second);
    bool second_known = true;
    uint32_t sel_addr;  // opaque to the compiler, so it stays in a register instead of being recomputed per round
    asm volatile("mov.b32 %0, %1;" : "=r"(sel_addr) : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(sel))));
    for (int r = 0; r < K; ++r) {
      const uint32_t best = __reduce_max_sync(tm.mask, first.key);
      const int mine = expert_of<V, LPT>(first.j, l);
      bool win = first.key == best;
      uint32_t winners = __ballot_sync(tm.mask, win);
      if (__popc(winners) > 1) {
        const uint32_t lo = 0xffffffffu - static_cast<uint32_t>(mine);
        const uint32_t lowest = __reduce_max_sync(tm.mask, win ? lo : 0u);  // every lane of the team takes part
        win = win && lo == lowest;
        winners = __ballot_sync(tm.mask, win);
      }
      // The winner stores (expert, value) to slot r with a predicated store: nothing in the round waits for it.
      st_shared_if(win, sel_addr + 8u * static_cast<uint32_t>(r), static_cast<uint32_t>(mine),
                   __float_as_uint(first.value));
      taken |= win ? 1u << first.j : 0u;
      const bool rescan = win && !second_known;
      first = win ? second : first;
      second_known = win ? !second_known : second_known;
      if (__any_sync(tm.mask, rescan)) {
        Offer f, s2;
        lane_top2(k, v, taken, f, s2);
        if (rescan) {
          first = f;
          second = s2;
          second_known = true;
        }
      }
    }
  }
  __syncwarp(tm.mask);
  if constexpr (!kSigmoid && VPT > 16) softmax_stats();
  if constexpr (kInstance == Instance::decode_plan) arrive_selected();  // the others build the plan meanwhile

  // Weights of the K routed slots (the team's lane r holds slot r).
  const bool routed = l < K;
  const uint2 chosen = routed ? reinterpret_cast<const uint2*>(sel)[l] : make_uint2(0, 0);
  const int expert = static_cast<int>(chosen.x);
  const float raw = __uint_as_float(chosen.y);
  if constexpr (kInstance == Instance::decode_counts) {  // one token per warp: its slots' ranks are 0
    if (routed) hist[expert] = 1;
    wait_selected();  // the others count the histograms meanwhile
  }
  float w = 0.0f;
  switch (method) {
    case RoutingMethod::softmax_topk:
      if (!p.renormalize) {
        w = routed && denom != 0.0f ? rm::div(softmax_term(raw, row_max), denom) : 0.0f;
        break;
      }
      [[fallthrough]];  // renormalized: the softmax over the K selected logits, as the contract computes it
    case RoutingMethod::topk_softmax: {
      const uint32_t om = __reduce_max_sync(tm.mask, routed ? rm::ordered_key(raw) : 0u);
      const float m = om == 0 ? -__int_as_float(0x7f800000) : from_ordered(om);
      w = routed ? softmax_term(raw, m) : 0.0f;
      const float sum = sum_first_lanes(w, K, tm.mask);
      w = sum != 0.0f ? rm::div(w, sum) : 0.0f;
      break;
    }
    case RoutingMethod::sigmoid_grouped:  // the value is the sigmoid already
    case RoutingMethod::pre_scored:
      w = routed ? raw : 0.0f;
      break;
    case RoutingMethod::llama4:
      w = routed ? rm::sigmoid(raw) : 0.0f;
      break;
  }
  // Softmax weights are normalized already and llama4 (K = 1) keeps its sigmoid: renormalize leaves them be.
  if (p.renormalize && (method == RoutingMethod::sigmoid_grouped || method == RoutingMethod::pre_scored)) {
    const float sum = sum_first_lanes(routed ? w : 0.0f, K, tm.mask);
    if (sum != 0.0f) w = rm::div(w, sum);
  }
  w = rm::mul(w, p.scale);

  const int64_t base = t * p.slots;
  uint32_t info = 0;
  if (routed) {
    info = static_cast<uint32_t>(expert) << 16;
    if constexpr (kInstance == Instance::token_masks) {
      const int i = static_cast<int>(t) - static_cast<int>(blockIdx.x) * p.tokens_per_cta;  // < kWarps
      atomicOr(masks + expert, 1u << i);
    } else if (!p.tiny && kInstance != Instance::decode_counts) {
      const uint32_t r = hist[expert];
      hist[expert] = static_cast<uint16_t>(r + 1);
      info |= r;
    }
    p.topk_ids[base + l] = expert;
    p.topk_weights[base + l] = w;
    if (p.replay != nullptr) p.replay[t * K + l] = static_cast<int16_t>(expert);
  } else if (l < p.slots) {
    p.topk_ids[base + l] = E + l - K;
    p.topk_weights[base + l] = 1.0f;
  }
  if (!kEarlyNext && next >= 0) row.load(p, next, l, kPadBits<In, kSigmoid>);
  __syncwarp(tm.mask);  // the next token's winners overwrite sel
  return info;
}

}  // namespace moekit::detail::router

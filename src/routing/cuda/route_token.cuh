// Warp-per-token top-k of the fused router: one warp reads a token's logits row (16-byte loads, lane l holding V
// consecutive experts of each 32*V-wide chunk), computes the selection keys with routing_math (bit-identical to
// the CPU), applies group limiting, then selects the K best (key, expert) pairs:
//   1. threshold tau = K-th largest of the 32 lane maxima, so at least K keys are >= tau and all top-K are;
//   2. the keys >= tau (usually a few dozen) are compacted into shared memory, at most kCandidateCap of them;
//   3. K rounds of two warp max-reductions (REDUX) over the lanes' heads of their sorted candidates.
// When ties push the candidate count past the cap, K rounds run over all keys instead (slow but exact).
#pragma once

#include <cstdint>

#include "moekit/routing.h"
#include "routing/routing_math.h"

namespace moekit::detail::router {

namespace rm = moekit::routing_math;

inline constexpr uint32_t kFullMask = 0xffffffffu;
inline constexpr int kCandidateCap = 128;  // 4 per lane

/// Everything one launch reads and writes. Pointers are device memory; sizes in elements.
struct RouteParams {
  const void* logits = nullptr;  // [T, row_stride] fp32 or bf16, E valid columns
  int64_t row_stride = 0;
  const void* bias = nullptr;    // [E] fp32 or bf16, or null
  int bias_bf16 = 0;
  int tokens = 0, experts = 0, top_k = 0, slots = 0, groups = 0, block = 1;  // T, E, K, Kt, G, B
  int method = 0, renormalize = 0;
  float scale = 1.0f;
  int n_group = 1, topk_group = 1, group_size = 1;
  uint32_t group_magic = 0;      // ceil(2^32 / group_size): expert / group_size == umulhi(expert, magic)
  int grouped = 0;               // group limiting active (sigmoid_grouped, topk_group < n_group)
  int vector_ok = 0;             // rows 16-byte aligned and E a multiple of the vector width
  int64_t capacity = 0;          // sorted_slots rows for this T
  int tokens_per_cta = 0, tokens_per_warp = 0;
  int32_t* topk_ids = nullptr;       // [T, Kt]
  float* topk_weights = nullptr;     // [T, Kt]
  int32_t* expert_counts = nullptr;  // [G]
  int32_t* expert_offsets = nullptr; // [G+1]
  int32_t* sorted_slots = nullptr;   // [capacity]
  int32_t* slot_rows = nullptr;      // [T, Kt]; holds (expert << 16 | rank in warp) until the scatter
  int32_t* block_experts = nullptr;  // [capacity / B]
  int32_t* extent = nullptr;         // [2]
  int16_t* replay = nullptr;         // [R, K] or null
  int32_t* cta_hist = nullptr;       // workspace [gridDim.x, E]
  uint32_t* barrier = nullptr;       // workspace [2]: arrivals, generation
};

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
__device__ __forceinline__ uint32_t scalar_bits(const float* p) { return __float_as_uint(__ldg(p)); }
__device__ __forceinline__ uint32_t scalar_bits(const Bf16* p) {
  return static_cast<uint32_t>(__ldg(reinterpret_cast<const unsigned short*>(p)));
}
__device__ __forceinline__ float load_one(const float* p) { return __ldg(p); }
__device__ __forceinline__ float load_one(const Bf16* p) {
  return __uint_as_float(static_cast<uint32_t>(__ldg(reinterpret_cast<const unsigned short*>(p))) << 16);
}

/// Inverse of rm::ordered_key (NaN comes back as a NaN, -0 as +0).
__device__ __forceinline__ float from_ordered(uint32_t o) {
  return __uint_as_float((o & 0x80000000u) ? (o & 0x7fffffffu) : ~o);
}

/// rm::packed_key() of an already ordered key.
__device__ __forceinline__ uint64_t pack(uint32_t ordered, int expert) {
  return static_cast<uint64_t>(ordered) << 32 | (0xffffffffu - static_cast<uint32_t>(expert));
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(kFullMask, v, off);
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

/// One token's row as NC 16-byte vectors per lane: lane l holds experts (c*32 + l)*V .. +V-1 of chunk c.
template <class In, int NC>
struct RowRegs {
  static constexpr int V = 16 / sizeof(In);
  uint4 v[NC];

  __device__ __forceinline__ void load(const RouteParams& p, int64_t t, int lane) {
    const In* row = static_cast<const In*>(p.logits) + t * p.row_stride;
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int e0 = (c * 32 + lane) * V;
      v[c] = make_uint4(0, 0, 0, 0);
      if (p.vector_ok) {
        if (e0 < p.experts) v[c] = __ldg(reinterpret_cast<const uint4*>(row + e0));
      } else {
        uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
        for (int i = 0; i < V; ++i) {
          if (e0 + i < p.experts) {
            const uint32_t b = scalar_bits(row + e0 + i);
            if (V == 4) w[i] = b;
            else w[i >> 1] |= (i & 1) ? (b << 16) : b;
          }
        }
        v[c] = make_uint4(w[0], w[1], w[2], w[3]);
      }
    }
  }
};

/// Per-warp shared memory: [scratch_words] u32 (group keys, then candidates) and 32 kept-group mask words.
struct WarpScratch {
  uint32_t* keys;      // [E] ordered keys (grouped), aliased by the candidates
  uint64_t* cands;     // [kCandidateCap]
  uint32_t* kept;      // [32] bit g: group g kept
};

/// Routes token t: writes its ids, weights, replay row and (expert << 16 | rank) into slot_rows, and bumps the
/// warp's expert histogram `hist` [E] (ranks are per warp in token order, so the plan is deterministic).
template <class In, int NC>
__device__ __forceinline__ void route_token(const RouteParams& p, int64_t t, const RowRegs<In, NC>& row, int lane,
                                            const float* bias_s, uint16_t* hist, const WarpScratch& ws) {
  constexpr int V = RowRegs<In, NC>::V;
  constexpr int VPT = NC * V;
  const int E = p.experts, K = p.top_k;
  const auto method = static_cast<RoutingMethod>(p.method);

  float x[VPT];
  uint32_t vmask = 0;
#pragma unroll
  for (int c = 0; c < NC; ++c)
#pragma unroll
    for (int i = 0; i < V; ++i) {
      x[c * V + i] = element(row.v[c], i, static_cast<In*>(nullptr));
      if ((c * 32 + lane) * V + i < E) vmask |= 1u << (c * V + i);
    }

  // softmax_topk: the row max over non-NaN logits and (without renormalization) the full-row denominator. Terms
  // follow the reference's conventions: NaN -> 0, the max itself -> exactly 1.
  float row_max = 0.0f, denom = 1.0f;
  if (method == RoutingMethod::softmax_topk) {
    uint32_t om = 0;
#pragma unroll
    for (int j = 0; j < VPT; ++j)
      if (vmask >> j & 1) om = max(om, rm::ordered_key(x[j]));
    row_max = from_ordered(__reduce_max_sync(kFullMask, om));
    if (row_max != row_max) row_max = -__int_as_float(0x7f800000);  // every logit NaN
    if (!p.renormalize) {
      float s = 0.0f;
#pragma unroll
      for (int j = 0; j < VPT; ++j)
        if ((vmask >> j & 1) && x[j] == x[j]) s += x[j] == row_max ? 1.0f : fast_exp(x[j] - row_max);
      denom = warp_sum(s);
    }
  }

  // Selection keys as order-preserving integers.
  uint32_t hk[VPT];
#pragma unroll
  for (int c = 0; c < NC; ++c)
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const int j = c * V + i;
      float key = method == RoutingMethod::sigmoid_grouped ? rm::sigmoid(x[j]) : x[j];
      if (bias_s != nullptr && (vmask >> j & 1)) key = rm::add(key, bias_s[(c * 32 + lane) * V + i]);
      hk[j] = rm::ordered_key(key);
    }

  // Group limiting: group score = sum of its two best keys; keep the topk_group best groups.
  if (p.grouped) {
#pragma unroll
    for (int c = 0; c < NC; ++c)
#pragma unroll
      for (int i = 0; i < V; ++i)
        if (vmask >> (c * V + i) & 1) ws.keys[(c * 32 + lane) * V + i] = hk[c * V + i];
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
    for (int c = 0; c < NC; ++c)
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const int j = c * V + i;
        const uint32_t g = __umulhi(static_cast<uint32_t>((c * 32 + lane) * V + i), p.group_magic);
        if ((vmask >> j & 1) && !((ws.kept[g >> 5] >> (g & 31)) & 1)) vmask &= ~(1u << j);
      }
  }

  // 1. tau = K-th largest lane maximum.
  uint32_t lane_max = 0;
#pragma unroll
  for (int j = 0; j < VPT; ++j)
    if (vmask >> j & 1) lane_max = max(lane_max, hk[j]);
  uint32_t tau = 0;
  {
    uint32_t xm = lane_max;
    int need = K;
    for (;;) {
      const uint32_t m = __reduce_max_sync(kFullMask, xm);
      const int c = __popc(__ballot_sync(kFullMask, xm == m));
      if (c >= need || m == 0) {
        tau = m;
        break;
      }
      need -= c;
      if (xm == m) xm = 0;
    }
  }
  // 2. Compact the candidates (valid keys >= tau).
  int mine = 0;
#pragma unroll
  for (int j = 0; j < VPT; ++j) mine += (vmask >> j & 1) && hk[j] >= tau;
  int incl = mine;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const int n = __shfl_up_sync(kFullMask, incl, off);
    if (lane >= off) incl += n;
  }
  const int total = __shfl_sync(kFullMask, incl, 31);
  uint64_t sel = 0;
  if (total <= kCandidateCap) {
    int pos = incl - mine;
#pragma unroll
    for (int c = 0; c < NC; ++c)
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const int j = c * V + i;
        if ((vmask >> j & 1) && hk[j] >= tau) ws.cands[pos++] = pack(hk[j], (c * 32 + lane) * V + i);
      }
    __syncwarp();
    uint64_t c0 = 0, c1 = 0, c2 = 0, c3 = 0;
    if (lane < total) c0 = ws.cands[lane];
    if (lane + 32 < total) c1 = ws.cands[lane + 32];
    if (lane + 64 < total) c2 = ws.cands[lane + 64];
    if (lane + 96 < total) c3 = ws.cands[lane + 96];
    __syncwarp();
    auto ce = [](uint64_t& a, uint64_t& b) {
      const uint64_t hi = a > b ? a : b, lo = a > b ? b : a;
      a = hi;
      b = lo;
    };
    if (total > 32) {
      ce(c0, c1);
      ce(c2, c3);
      ce(c0, c2);
      ce(c1, c3);
      ce(c1, c2);
    }
    // 3. K rounds: the best head wins and pops.
    for (int k = 0; k < K; ++k) {
      const uint32_t hi = static_cast<uint32_t>(c0 >> 32);
      const uint32_t mhi = __reduce_max_sync(kFullMask, hi);
      const uint32_t mlo = __reduce_max_sync(kFullMask, hi == mhi ? static_cast<uint32_t>(c0) : 0u);
      if (hi == mhi && static_cast<uint32_t>(c0) == mlo) {
        c0 = c1;
        c1 = c2;
        c2 = c3;
        c3 = 0;
      }
      if (lane == k) sel = static_cast<uint64_t>(mhi) << 32 | mlo;
    }
  } else {
    // Heavy ties: K rounds over every key.
    uint32_t taken = 0;
    for (int k = 0; k < K; ++k) {
      uint64_t best = 0;
      int bi = -1;
#pragma unroll
      for (int c = 0; c < NC; ++c)
#pragma unroll
        for (int i = 0; i < V; ++i) {
          const int j = c * V + i;
          if ((vmask >> j & 1) && !(taken >> j & 1)) {
            const uint64_t pk = pack(hk[j], (c * 32 + lane) * V + i);
            if (pk > best) {
              best = pk;
              bi = j;
            }
          }
        }
      const uint32_t hi = static_cast<uint32_t>(best >> 32);
      const uint32_t mhi = __reduce_max_sync(kFullMask, hi);
      const uint32_t mlo = __reduce_max_sync(kFullMask, hi == mhi ? static_cast<uint32_t>(best) : 0u);
      if (bi >= 0 && hi == mhi && static_cast<uint32_t>(best) == mlo) taken |= 1u << bi;
      if (lane == k) sel = static_cast<uint64_t>(mhi) << 32 | mlo;
    }
  }

  // Weights of the K routed slots (lane k holds slot k).
  const bool routed = lane < K;
  const int expert = routed ? rm::packed_expert(sel) : 0;
  const float raw = routed ? load_one(static_cast<const In*>(p.logits) + t * p.row_stride + expert) : 0.0f;
  float w = 0.0f;
  switch (method) {
    case RoutingMethod::softmax_topk:
      w = routed ? softmax_term(raw, row_max) : 0.0f;
      if (!p.renormalize) w = denom != 0.0f ? rm::div(w, denom) : 0.0f;
      break;
    case RoutingMethod::topk_softmax: {
      const uint32_t om = __reduce_max_sync(kFullMask, routed ? rm::ordered_key(raw) : 0u);
      const float m = om == 0 ? -__int_as_float(0x7f800000) : from_ordered(om);
      w = routed ? softmax_term(raw, m) : 0.0f;
      const float sum = warp_sum(w);
      w = sum != 0.0f ? rm::div(w, sum) : 0.0f;
      break;
    }
    case RoutingMethod::sigmoid_grouped:
    case RoutingMethod::llama4:
      w = routed ? rm::sigmoid(raw) : 0.0f;
      break;
    case RoutingMethod::pre_scored:
      w = routed ? raw : 0.0f;
      break;
  }
  // topk_softmax is normalized already and llama4 (K = 1) keeps its sigmoid: renormalize leaves them be.
  if (p.renormalize && method != RoutingMethod::topk_softmax && method != RoutingMethod::llama4) {
    const float sum = warp_sum(routed ? w : 0.0f);
    if (sum != 0.0f) w = rm::div(w, sum);
  }
  w = rm::mul(w, p.scale);

  const int64_t base = t * p.slots;
  if (routed) {
    const uint32_t r = hist[expert];
    hist[expert] = static_cast<uint16_t>(r + 1);
    p.topk_ids[base + lane] = expert;
    p.topk_weights[base + lane] = w;
    p.slot_rows[base + lane] = static_cast<int32_t>(static_cast<uint32_t>(expert) << 16 | r);
    if (p.replay != nullptr) p.replay[t * K + lane] = static_cast<int16_t>(expert);
  } else if (lane < p.slots) {
    p.topk_ids[base + lane] = E + lane - K;
    p.topk_weights[base + lane] = 1.0f;
  }
  __syncwarp();
}

}  // namespace moekit::detail::router

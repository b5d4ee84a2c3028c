// The dispatch/combine rules of expert parallelism, written once for the host (CPU simulation, tests) and the
// device (EP kernels): the contiguous partition, a token's destination ranks, the all-to-all dispatch table (per
// destination, the sending token of each row, in ascending token order), the receiver's pre-scored routing row
// (the token's K weights at its K ids, -inf elsewhere; a padding row scores K "inert" experts of other ranks so
// it costs no local GEMM rows when E - L >= K), and which fused-shared slots must be zeroed so each token's shared
// experts are counted exactly once (on its own rank).
#pragma once

#include <cstdint>
#include <vector>

#if defined(__CUDACC__)
#define MOEKIT_EP_HD __host__ __device__ __forceinline__
#else
#define MOEKIT_EP_HD inline
#endif

namespace moekit::ep {

// Partition of E experts over W ranks (E >= W): E / W each, the first E % W ranks one more.
MOEKIT_EP_HD int part_offset(int E, int W, int r) {
  const int base = E / W, rem = E % W;
  return r * base + (r < rem ? r : rem);
}
MOEKIT_EP_HD int part_count(int E, int W, int r) {
  return E / W + (r < E % W ? 1 : 0);
}
MOEKIT_EP_HD int part_owner(int E, int W, int e) {
  const int base = E / W, rem = E % W, big = rem * (base + 1);
  return e < big ? e / (base + 1) : rem + (e - big) / base;
}

/// Ranks one token's row must visit: the owners of its K routed experts, and `self` when there are shared experts
/// (they run where the token lives). ids = the token's [K+S] slot ids.
MOEKIT_EP_HD uint32_t dest_mask(const int32_t* ids, int K, int S, int E, int W, int self) {
  uint32_t m = S > 0 ? (1u << self) : 0u;
  for (int j = 0; j < K; ++j) {
    const int e = ids[j];
    if (e >= 0 && e < E) m |= 1u << part_owner(E, W, e);
  }
  return m;
}

/// Padding rows of the all-to-all receive buffer score these K experts: the ones right after the local range
/// (mod E), i.e. other ranks' experts whenever E - L >= K, which local GEMMs skip.
MOEKIT_EP_HD bool is_inert_expert(int e, int E, int local_offset, int local_count, int K) {
  const int d = ((e - local_offset - local_count) % E + E) % E;
  return d < K;
}

/// Both modes lay rows out in slabs of T rows per source rank (all-gather: gathered token p*T + t is token t of
/// rank p; all-to-all: receive row p*T + i came from rank p). A row's fused shared slots keep their weight only on
/// the rank the token lives on, so replicated shared experts are summed once.
MOEKIT_EP_HD bool keeps_shared(int64_t row, int64_t T, int self) {
  return row / T == self;
}

/// Layout of the exchange buffers for T tokens per rank: row i of the slab for peer p is row p*T + i.
/// A row's metadata is 2K int32: the K routed ids, then the K weights' fp32 bits.
MOEKIT_EP_HD int meta_width(int K) {
  return 2 * K;
}

/// Host version of the all-to-all dispatch table (the GPU builds the same with one CTA scan per destination).
struct DispatchTable {
  int world = 0;
  int64_t tokens = 0;
  std::vector<int32_t> send_token;  // [W, T] token of row i of destination d's slab; -1 past the count
  std::vector<int32_t> send_count;  // [W] rows for each destination
  std::vector<int32_t> token_pos;   // [T, W] row of token t in destination d's slab, -1 when not sent there
};

/// Builds the table of rank `self` from its routed slots ids [T, K+S].
inline DispatchTable build_dispatch_table(const int32_t* ids, int64_t T, int K, int S, int E, int W, int self) {
  DispatchTable d;
  d.world = W;
  d.tokens = T;
  d.send_token.assign(static_cast<size_t>(W * T), -1);
  d.send_count.assign(static_cast<size_t>(W), 0);
  d.token_pos.assign(static_cast<size_t>(T * W), -1);
  for (int64_t t = 0; t < T; ++t) {
    const uint32_t m = dest_mask(ids + t * (K + S), K, S, E, W, self);
    for (int r = 0; r < W; ++r) {
      if (((m >> r) & 1u) == 0) continue;
      const int pos = d.send_count[r]++;
      d.send_token[r * T + pos] = static_cast<int32_t>(t);
      d.token_pos[t * W + r] = pos;
    }
  }
  return d;
}

}  // namespace moekit::ep

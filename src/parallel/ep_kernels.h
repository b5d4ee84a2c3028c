// Launchers of the expert-parallel kernels (host-only declarations, no CUDA headers): the all-to-all dispatch
// table, packing of token rows into per-destination slabs, the receiver's pre-scored routing rows, masking of
// replicated shared slots, the all-to-all combine, and a hash fill for benchmark tensors. Each takes a Params
// struct of device pointers and sizes, launches on `stream` (a cudaStream_t), checks the launch (CudaError) and
// never allocates or synchronizes. The rules they follow are ep_bookkeeping.h's, shared with the CPU simulation.
#pragma once

#include <cstdint>

#include "moekit/tensor.h"

namespace moekit::ep_detail {

/// Per destination rank d (one CTA each, a block scan over the tokens): send_token[d*T + i] = the i-th token
/// (ascending) whose row goes to d, send_count[d] = their number, token_pos[t*W + d] = i or -1.
struct DispatchParams {
  const int32_t* ids = nullptr;  // [T, K+S] the rank's routed slots
  int64_t tokens = 0;
  int K = 0, S = 0, E = 0, W = 1, self = 0;
  int32_t* send_token = nullptr;  // [W, T]
  int32_t* send_count = nullptr;  // [W]
  int32_t* token_pos = nullptr;   // [T, W]
};
void launch_dispatch(const DispatchParams& p, Stream stream);

/// Row i < send_count[d] of slab d: hidden row send_token[d*T+i] and its metadata (K ids, K weight bits).
struct PackParams {
  const void* hidden = nullptr;    // [T, H] bf16
  const int32_t* ids = nullptr;    // [T, K+S]
  const float* weights = nullptr;  // [T, K+S]
  const int32_t* send_token = nullptr;
  const int32_t* send_count = nullptr;
  int64_t tokens = 0, hidden_size = 0;
  int K = 0, Kt = 0, W = 1;
  void* send_hidden = nullptr;   // [W*T, H] bf16
  int32_t* send_meta = nullptr;  // [W*T, 2K]
};
void launch_pack(const PackParams& p, Stream stream);

/// scores [W*T, E] fp32 for the receiver's pre_scored routing (see ep_bookkeeping.h).
struct ScoresParams {
  const int32_t* meta = nullptr;    // [W*T, 2K]
  const int32_t* counts = nullptr;  // [W] rows received from each rank
  int64_t tokens = 0;
  int W = 1, K = 0, E = 0, local_offset = 0, local_count = 0;
  float* scores = nullptr;
};
void launch_scores(const ScoresParams& p, Stream stream);

/// Zeroes weights[row, K..Kt) of every row whose slab is not `self` (keeps_shared), rows = W*T.
struct MaskSharedParams {
  float* weights = nullptr;  // [W*T, Kt]
  int64_t rows = 0, tokens = 0;
  int K = 0, Kt = 0, self = 0;
};
void launch_mask_shared(const MaskSharedParams& p, Stream stream);

/// out[t] = bf16(sum over d ascending with token_pos[t, d] >= 0 of back[d*T + token_pos[t, d]]) in fp32.
struct CombineParams {
  const void* back = nullptr;          // [W*T, H] bf16
  const int32_t* token_pos = nullptr;  // [T, W]
  int64_t tokens = 0, hidden = 0;
  int W = 1;
  void* out = nullptr;  // [T, H] bf16
};
void launch_combine(const CombineParams& p, Stream stream);

/// p[i] = uniform(-scale, scale) from a hash of (seed, first_index + i), as bf16 (bf16 = true) or fp32, so any
/// slice of a large logical tensor (one rank's experts) can be generated on its own and match the whole.
struct HashFillParams {
  void* p = nullptr;
  int64_t n = 0, first_index = 0;
  float scale = 1.0f;
  uint64_t seed = 1;
  bool bf16 = true;
};
void launch_hash_fill(const HashFillParams& p, Stream stream);

}  // namespace moekit::ep_detail

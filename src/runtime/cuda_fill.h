// Device twins of the synthetic fills in runtime/synthetic.h (internal): the same counter-based hash, so a CUDA
// runner's synthetic weights equal, bit for bit, what the CPU fills produce for the same seed, without a host copy.
// Only built with CUDA (MOEKIT_HAS_CUDA).
#pragma once

#include <cstdint>

#include "moekit/tensor.h"

namespace moekit::detail {

/// out[i] = uniform_at(seed, i, scale) (runtime/synthetic.h) for i < n, stored as bf16 (round to nearest even) when
/// `bf16`, else fp32. out: [n] device memory. Enqueues one kernel on `stream` (a cudaStream_t); no allocation, no
/// synchronization. Throws CudaError when the launch fails.
void fill_uniform_device(void* out, int64_t n, bool bf16, uint64_t seed, float scale, Stream stream);

}  // namespace moekit::detail

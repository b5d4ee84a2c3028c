// Device helpers of the MoE benchmark (host-only declarations): deterministic random fills of device tensors
// (a counter-based hash, so any tensor can be regenerated without storing it). Launches on the given stream (a
// cudaStream_t) and throws CudaError when the launch fails.
#pragma once

#include <cstdint>

#include "moekit/tensor.h"

namespace moekit::bench_detail {

/// p[i] = uniform(-scale, scale) rounded to bf16 (bf16 = true) or fp32, from hash(seed, i).
void fill_uniform(void* p, int64_t n, bool bf16, float scale, uint64_t seed, Stream stream);

}  // namespace moekit::bench_detail

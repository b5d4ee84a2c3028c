// Device helpers of the MoE benchmark (host-only declarations): deterministic random fills of device tensors
// (a counter-based hash, so any tensor can be regenerated without storing it). Launches on the given stream (a
// cudaStream_t) and throws CudaError when the launch fails.
#pragma once

#include <cstdint>

#include "moekit/tensor.h"

namespace moekit::bench_detail {

/// p[i] = uniform(-scale, scale) rounded to bf16 (bf16 = true) or fp32, from hash(seed, i).
void fill_uniform(void* p, int64_t n, bool bf16, float scale, uint64_t seed, Stream stream);

/// m[r, c] += v[c] for the fp32 row-major matrix m [rows, cols] and the fp32 vector v [cols].
void add_to_rows(float* m, int64_t rows, int64_t cols, const float* v, Stream stream);

}  // namespace moekit::bench_detail

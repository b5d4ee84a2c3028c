// Device twins of the synthetic fills in runtime/synthetic.h (internal): the same counter-based hash, so a CUDA
// runner's synthetic weights equal, bit for bit, what the CPU fills produce for the same seed, without a host copy;
// and the row copy that puts a caller's logits into a runner's timing inputs. Only built with CUDA
// (MOEKIT_HAS_CUDA).
#pragma once

#include <cstdint>

#include "moekit/tensor.h"

namespace moekit::detail {

/// out[i] = uniform_at(seed, i, scale) (runtime/synthetic.h) for i < n, stored as bf16 (round to nearest even) when
/// `bf16`, else fp32. out: [n] device memory. Enqueues one kernel on `stream` (a cudaStream_t); no allocation, no
/// synchronization. Throws CudaError when the launch fails.
void fill_uniform_device(void* out, int64_t n, bool bf16, uint64_t seed, float scale, Stream stream);

/// Fills dst [rows, row_bytes] (packed, device memory) with the n rows of src (device memory, row r at src + r *
/// src_pitch), repeated: dst row r = src row r mod n. Enqueues 1 + ceil(log2(rows / n)) copies on `stream`; no
/// allocation, no synchronization. Requires 1 <= n <= rows, row_bytes <= src_pitch, and dst not overlapping src.
/// Throws CudaError when a copy cannot be enqueued.
void cycle_rows_device(void* dst, int64_t rows, const void* src, int64_t n, size_t row_bytes, size_t src_pitch,
                       Stream stream);

}  // namespace moekit::detail

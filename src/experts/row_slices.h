// How the gather and activation passes (src/experts/cuda/experts_kernels.cu) split rows over warps: a row of n bf16
// elements is covered in passes of kRowPass elements; with few rows it is split into slices of whole passes, one
// warp each, until about a target number of warps is launched. In a header of its own so that the CPU tests check
// that the slices cover every row exactly once, for any shape.
#pragma once

#include <algorithm>
#include <cstdint>

namespace moekit::detail {

/// Elements of one row that one warp pass covers: two 16-byte chunks (8 bf16 each) per lane.
constexpr int kRowPass = 2 * 32 * 8;

/// Passes over a row of `n` elements (the last one may be partial).
constexpr int row_passes(int n) {
  return (n + kRowPass - 1) / kRowPass;
}

/// Passes per slice when a row of `passes` passes is split into `slices` slices (the kernel's view: gridDim.y).
constexpr int row_passes_per_slice(int passes, int slices) {
  return (passes + slices - 1) / slices;
}

/// Elements [begin, end) of a row of `n` elements that slice `slice` of `slices` covers: whole passes, back to back.
struct RowRange {
  int begin, end;
};
constexpr RowRange row_slice_range(int n, int slice, int slices) {
  const int per = row_passes_per_slice(row_passes(n), slices) * kRowPass;
  const int begin = slice * per;
  return {begin, std::min(n, begin + per)};
}

/// Slices per row for a grid of `rows` rows (>= 1): enough for about `target_warps` warps, at most one per pass, and
/// none empty, so that row_passes_per_slice(passes, result) is the per-slice count chosen here.
constexpr int64_t row_slices(int64_t passes, int64_t rows, int64_t target_warps) {
  const int64_t wanted = std::clamp<int64_t>((target_warps + rows - 1) / rows, 1, passes);
  const int64_t per_slice = (passes + wanted - 1) / wanted;
  return (passes + per_slice - 1) / per_slice;
}

}  // namespace moekit::detail

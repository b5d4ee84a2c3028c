// Types shared by the grouped-GEMM instantiations and the kernel that fills their per-group argument arrays:
// the problem shape (M, N, K) and the CuTe strides of A [M, K] row-major, B [N, K] (K-contiguous, CUTLASS's
// column-major B) and D [M, N] row-major, or column-major for the swapped-operand GEMMs (weights as A, the plan's
// rows as B: D^T column-major is the row-major [rows, N] output). Light headers only, so the fill kernel's file
// stays cheap to compile.
#pragma once

#include "cute/layout.hpp"
#include "cutlass/detail/layout.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/layout/matrix.h"

namespace moekit::detail {

using GroupedLayoutA = cutlass::layout::RowMajor;
using GroupedLayoutB = cutlass::layout::ColumnMajor;
using GroupedLayoutD = cutlass::layout::RowMajor;
using GroupedProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;
// The ptr-array kernels' per-group strides: (leading dimension, 1, batch 0).
using GroupedStrideA = cute::remove_pointer_t<cutlass::detail::TagToStrideA_t<GroupedLayoutA*>>;
using GroupedStrideB = cute::remove_pointer_t<cutlass::detail::TagToStrideB_t<GroupedLayoutB*>>;
using GroupedStrideD = cute::remove_pointer_t<cutlass::detail::TagToStrideC_t<GroupedLayoutD*>>;
using GroupedLayoutDT = cutlass::layout::ColumnMajor;
using GroupedStrideDT = cute::remove_pointer_t<cutlass::detail::TagToStrideC_t<GroupedLayoutDT*>>;
static_assert(sizeof(GroupedStrideD) == sizeof(GroupedStrideDT), "both D strides share one array");

/// A stride whose first mode (rows of A/D, N of B) steps by `ld` elements.
template <class Stride>
__host__ __device__ inline Stride leading_stride(int64_t ld) {
  Stride s{};
  cute::get<0>(s) = ld;
  return s;
}

/// The column-major D stride: its second mode (N) steps by `ld` elements.
__host__ __device__ inline GroupedStrideDT column_stride(int64_t ld) {
  GroupedStrideDT s{};
  cute::get<1>(s) = ld;
  return s;
}

}  // namespace moekit::detail

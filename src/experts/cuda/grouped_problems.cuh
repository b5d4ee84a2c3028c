// The device side of the per-group argument fill for both grouped GEMMs, from the route plan's expert counts and
// padded offsets (group sizes never visit the host): run by its own one-CTA kernel (grouped_problems.cu) or by an
// extra CTA of the gather (experts_kernels.cu). Another rank's routed expert gets no rows (M = 0, N = 0 when
// swapped), which the CUTLASS group scheduler skips. Alignment CUTLASS cannot check without host shapes holds by
// construction: every row offset is a multiple of H, 2I or I elements (multiples of 8 bf16 = 16 bytes) from
// 256-byte aligned buffers, and weight bases were checked 16-byte aligned when the layer was built.
#pragma once

#include <cuda_runtime.h>

#include "experts/cuda/experts_device.cuh"
#include "experts/cuda/sm90_grouped_types.cuh"

namespace moekit::detail {

/// Group g of one GEMM: `rows` of x (K elements each) times the expert's [n, K] weights into `rows` rows of d (n
/// each). Plain: M = rows, A = x, B = w, D row-major; swapped: M = n, N = rows, A = w, B = x, D^T column-major.
__device__ __forceinline__ void fill_group(const GroupedGemmArgs& a, bool swap, int g, int rows, int n, int k,
                                           const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* d) {
  using Shape = GroupedProblemShape::UnderlyingProblemShape;
  // Both operands are K-contiguous with rows of k elements, whichever side they are on.
  static_cast<GroupedStrideA*>(a.stride_a)[g] = leading_stride<GroupedStrideA>(k);
  static_cast<GroupedStrideB*>(a.stride_b)[g] = leading_stride<GroupedStrideB>(k);
  a.ptr_d[g] = d;
  if (swap) {
    static_cast<Shape*>(a.problem_shapes)[g] = Shape{n, rows, k};
    a.ptr_a[g] = w;
    a.ptr_b[g] = x;
    static_cast<GroupedStrideDT*>(a.stride_d)[g] = column_stride(n);
  } else {
    static_cast<Shape*>(a.problem_shapes)[g] = Shape{rows, n, k};
    a.ptr_a[g] = x;
    a.ptr_b[g] = w;
    static_cast<GroupedStrideD*>(a.stride_d)[g] = leading_stride<GroupedStrideD>(n);
  }
}

/// Fills groups `first`, `first + step`, ... of both GEMMs; the plan must be complete.
__device__ __forceinline__ void fill_grouped_problems(const FillProblemsParams& p, int first, int step) {
  using bf16 = __nv_bfloat16;
  const int h = p.hidden, i2 = 2 * p.intermediate, in = p.intermediate;
  for (int g = first; g < p.plan.groups; g += step) {
    const int local = local_expert(p.map, g);
    const int m = local < 0 ? 0 : p.plan.expert_counts[g];
    const int64_t off = p.plan.expert_offsets[g];
    const int64_t w = local < 0 ? 0 : local;
    fill_group(p.gemm1, p.swap1, g, m, i2, h, static_cast<const bf16*>(p.a1) + off * h,
               static_cast<const bf16*>(p.w13) + w * i2 * h, static_cast<bf16*>(p.c1) + off * i2);
    fill_group(p.gemm2, p.swap2, g, m, h, in, static_cast<const bf16*>(p.act) + off * in,
               static_cast<const bf16*>(p.w2) + w * h * in, static_cast<bf16*>(p.y) + off * h);
  }
}

}  // namespace moekit::detail

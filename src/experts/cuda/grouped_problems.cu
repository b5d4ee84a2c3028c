// Fills the per-group argument arrays of both grouped GEMMs on the device from the route plan's expert counts and
// padded offsets (group sizes never visit the host). One CTA loops over the G groups; another rank's routed
// expert gets M = 0, which the CUTLASS group scheduler skips. Alignment CUTLASS cannot check without host shapes
// holds by construction: every row offset is a multiple of H, 2I or I elements (multiples of 8 bf16 = 16 bytes)
// from 256-byte aligned buffers, and weight bases were checked 16-byte aligned when the layer was built.
#include <cuda_runtime.h>

#include "experts/cuda/experts_device.cuh"
#include "experts/cuda/sm90_grouped_types.cuh"

namespace moekit::detail {
namespace {

constexpr int kFillThreads = 256;

__global__ void __launch_bounds__(kFillThreads) fill_grouped_problems_kernel(FillProblemsParams p) {
  wait_for_predecessor();  // the router's plan; also orders this call after the previous call's last kernel
  allow_dependents();
  using Shape = GroupedProblemShape::UnderlyingProblemShape;
  const int64_t h = p.hidden, i2 = 2 * p.intermediate, in = p.intermediate;
  auto* shapes1 = static_cast<Shape*>(p.gemm1.problem_shapes);
  auto* shapes2 = static_cast<Shape*>(p.gemm2.problem_shapes);
  for (int g = threadIdx.x; g < p.plan.groups; g += kFillThreads) {
    const int local = local_expert(p.map, g);
    const int m = local < 0 ? 0 : p.plan.expert_counts[g];
    const int64_t off = p.plan.expert_offsets[g];
    const int64_t w = local < 0 ? 0 : local;
    using bf16 = __nv_bfloat16;
    shapes1[g] = Shape{m, static_cast<int>(i2), static_cast<int>(h)};
    p.gemm1.ptr_a[g] = static_cast<const bf16*>(p.a1) + off * h;
    p.gemm1.ptr_b[g] = static_cast<const bf16*>(p.w13) + w * i2 * h;
    p.gemm1.ptr_d[g] = static_cast<bf16*>(p.c1) + off * i2;
    static_cast<GroupedStrideA*>(p.gemm1.stride_a)[g] = leading_stride<GroupedStrideA>(h);
    static_cast<GroupedStrideB*>(p.gemm1.stride_b)[g] = leading_stride<GroupedStrideB>(h);
    static_cast<GroupedStrideD*>(p.gemm1.stride_d)[g] = leading_stride<GroupedStrideD>(i2);
    shapes2[g] = Shape{m, static_cast<int>(h), static_cast<int>(in)};
    p.gemm2.ptr_a[g] = static_cast<const bf16*>(p.act) + off * in;
    p.gemm2.ptr_b[g] = static_cast<const bf16*>(p.w2) + w * h * in;
    p.gemm2.ptr_d[g] = static_cast<bf16*>(p.y) + off * h;
    static_cast<GroupedStrideA*>(p.gemm2.stride_a)[g] = leading_stride<GroupedStrideA>(in);
    static_cast<GroupedStrideB*>(p.gemm2.stride_b)[g] = leading_stride<GroupedStrideB>(in);
    static_cast<GroupedStrideD*>(p.gemm2.stride_d)[g] = leading_stride<GroupedStrideD>(h);
  }
}

}  // namespace

GroupedArraySizes grouped_array_sizes() {
  return {sizeof(GroupedProblemShape::UnderlyingProblemShape), sizeof(GroupedStrideA), sizeof(GroupedStrideB),
          sizeof(GroupedStrideD)};
}

void launch_fill_problems(const FillProblemsParams& p, Stream stream) {
  launch_dependent(fill_grouped_problems_kernel, dim3(1), dim3(kFillThreads), stream, p,
                   "fill_grouped_problems_kernel");
}

}  // namespace moekit::detail

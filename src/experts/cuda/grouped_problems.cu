// The per-group argument fill as a kernel of its own, for calls whose GEMM1 is the decode GEMV and GEMM2 a grouped
// GEMM (with a grouped GEMM1 the gather's extra CTA fills them: launch_gather).
#include "experts/cuda/grouped_problems.cuh"

namespace moekit::detail {
namespace {

constexpr int kFillThreads = 256;

__global__ void __launch_bounds__(kFillThreads) fill_grouped_problems_kernel(FillProblemsParams p) {
  wait_for_predecessor();  // the router's plan; also orders this call after the previous call's last kernel
  allow_dependents();
  fill_grouped_problems(p, threadIdx.x, kFillThreads);
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

// Instantiates GEMM1 with swapped operands (out^T = W x^T: a 128-column weight tile as A,
// up to 32 of the plan's rows as B) and the gated activation in its epilogue
// (sm90_gated_epilogue.cuh), cooperative schedule (one instantiation per file; see sm90_grouped_gemm.cuh).
#include "experts/cuda/sm90_grouped_gemm.cuh"

namespace moekit::detail {

GroupedGemmOps sm90_grouped_gemm_gated_swap_ab_cooperative_128x32x64() {
  return Sm90GroupedGemm<128, 32, 64, true, GroupedForm::swap_gated>::ops();
}

}  // namespace moekit::detail

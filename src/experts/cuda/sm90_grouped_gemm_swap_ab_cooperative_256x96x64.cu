// Instantiates the sm90 ptr-array grouped GEMM with swapped operands (out^T = W x^T: a 256-column weight tile as A,
// up to 96 of the plan's rows as B), cooperative: one row tile for experts of 65-96 routed rows, where 64-row tiles
// need two (see sm90_grouped_gemm.cuh).
#include "experts/cuda/sm90_grouped_gemm.cuh"

namespace moekit::detail {

GroupedGemmOps sm90_grouped_gemm_swap_ab_cooperative_256x96x64() {
  return Sm90GroupedGemm<256, 96, 64, true, GroupedForm::swap_ab>::ops();
}

}  // namespace moekit::detail

// Instantiates the sm90 ptr-array grouped GEMM with swapped operands (out^T = W x^T: a 128-column weight tile as A,
// up to 32 of the plan's rows as B) and the cooperative schedule, for a few rows per expert (one instantiation per
// file so that two compile in parallel; see sm90_grouped_gemm.cuh).
#include "experts/cuda/sm90_grouped_gemm.cuh"

namespace moekit::detail {

GroupedGemmOps sm90_grouped_gemm_swap_ab_cooperative_128x32x64() {
  return Sm90GroupedGemm<128, 32, 64, true, GroupedForm::swap_ab>::ops();
}

}  // namespace moekit::detail

// Instantiates GEMM1 with swapped operands (out^T = W x^T: a 128-row weight tile as A, up to 32 of the plan's rows as
// B) and the gated activation in its epilogue for w13 in two blocks (gate-first or up-first; A's tiles from
// sm90_halves_mainloop.cuh, 64 rows of each block), cooperative schedule (one instantiation per file; see
// sm90_grouped_gemm.cuh).
#include "experts/cuda/sm90_grouped_gemm.cuh"

namespace moekit::detail {

GroupedGemmOps sm90_grouped_gemm_gated_halves_swap_ab_cooperative_128x32x64() {
  return Sm90GroupedGemm<128, 32, 64, true, GroupedForm::swap_gated_halves>::ops();
}

}  // namespace moekit::detail

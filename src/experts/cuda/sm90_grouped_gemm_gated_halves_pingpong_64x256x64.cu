// Instantiates GEMM1 with the gated activation in its epilogue for w13 in two blocks (gate-first or up-first; B's
// tiles from sm90_halves_mainloop.cuh) with a 64x256x64 CTA tile and the pingpong schedule (one instantiation per
// file; see sm90_grouped_gemm.cuh).
#include "experts/cuda/sm90_grouped_gemm.cuh"

namespace moekit::detail {

GroupedGemmOps sm90_grouped_gemm_gated_halves_pingpong_64x256x64() {
  return Sm90GroupedGemm<64, 256, 64, false, GroupedForm::gated_halves>::ops();
}

}  // namespace moekit::detail

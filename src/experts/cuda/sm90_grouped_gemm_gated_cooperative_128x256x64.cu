// Instantiates GEMM1 with the gated activation in its epilogue (sm90_gated_epilogue.cuh) with a 128x256x64 CTA
// tile and the cooperative schedule (one instantiation per file; see sm90_grouped_gemm.cuh).
#include "experts/cuda/sm90_grouped_gemm.cuh"

namespace moekit::detail {

GroupedGemmOps sm90_grouped_gemm_gated_cooperative_128x256x64() {
  return Sm90GroupedGemm<128, 256, 64, true, GroupedForm::gated>::ops();
}

}  // namespace moekit::detail

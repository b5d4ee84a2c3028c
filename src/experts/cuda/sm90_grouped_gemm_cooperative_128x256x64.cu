// Instantiates the sm90 ptr-array grouped GEMM with a 128x256x64 CTA tile and the cooperative schedule (one
// instantiation per file so that two compile in parallel; see sm90_grouped_gemm.cuh).
#include "experts/cuda/sm90_grouped_gemm.cuh"

namespace moekit::detail {

GroupedGemmOps sm90_grouped_gemm_cooperative_128x256x64() {
  return Sm90GroupedGemm<128, 256, 64, true>::ops();
}

}  // namespace moekit::detail

// Instantiates the sm90 ptr-array grouped GEMM with a 64x256x64 CTA tile and the pingpong schedule (one
// instantiation per file so that two compile in parallel; see sm90_grouped_gemm.cuh).
#include "experts/cuda/sm90_grouped_gemm.cuh"

namespace moekit::detail {

GroupedGemmOps sm90_grouped_gemm_pingpong_64x256x64() {
  return Sm90GroupedGemm<64, 256, 64, false>::ops();
}

}  // namespace moekit::detail

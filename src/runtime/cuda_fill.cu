// Synthetic fills on the device for the CUDA runners: one grid-stride kernel evaluating detail::uniform_at
// (runtime/synthetic.h) per element; and a row copy that repeats a caller's rows by doubling copies. mix64 is
// constexpr and compiled for the device through --expt-relaxed-constexpr, so host and device share one definition
// of the hash.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "moekit/error.h"
#include "runtime/cuda_fill.h"
#include "runtime/synthetic.h"

namespace moekit::detail {
namespace {

__global__ void fill_uniform_kernel(void* out, int64_t n, bool bf16, uint64_t seed, float scale) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += stride) {
    // Same expression as uniform_at(): 24 random bits scaled to [-scale, scale).
    const uint64_t bits = mix64(seed * 0x632be59bd9b4e019ull + static_cast<uint64_t>(i)) >> 40;
    const float v = (static_cast<float>(bits) * (1.0f / 8388608.0f) - 1.0f) * scale;
    if (bf16)
      static_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16_rn(v);
    else
      static_cast<float*>(out)[i] = v;
  }
}

}  // namespace

void fill_uniform_device(void* out, int64_t n, bool bf16, uint64_t seed, float scale, Stream stream) {
  if (n <= 0) return;
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, 4096);
  fill_uniform_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(out, n, bf16,
                                                                                                         seed, scale);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw CudaError("layer", std::string("fill_uniform_kernel launch failed: ") + cudaGetErrorString(err));
}

void cycle_rows_device(void* dst, int64_t rows, const void* src, int64_t n, size_t row_bytes, size_t src_pitch,
                       Stream stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  auto check = [](cudaError_t err) {
    if (err != cudaSuccess)
      throw CudaError("layer", std::string("cycle_rows_device: cudaMemcpyAsync failed: ") + cudaGetErrorString(err));
  };
  char* out = static_cast<char*>(dst);
  check(cudaMemcpy2DAsync(out, row_bytes, src, src_pitch, row_bytes, static_cast<size_t>(n), cudaMemcpyDeviceToDevice,
                          s));
  // The first `filled` rows hold whole periods of n, so copying them on doubles the filled rows and keeps the cycle.
  for (int64_t filled = n; filled < rows; filled *= 2) {
    const int64_t copy = std::min(filled, rows - filled);
    check(cudaMemcpyAsync(out + filled * row_bytes, out, static_cast<size_t>(copy) * row_bytes,
                          cudaMemcpyDeviceToDevice, s));
  }
}

}  // namespace moekit::detail

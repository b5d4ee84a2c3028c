// Device helpers of the MoE benchmark: counter-based random fills (splitmix64 of seed ^ index, so fills are
// reproducible and need no state).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <string>

#include "bench/moe_bench_kernels.h"
#include "moekit/error.h"

namespace moekit::bench_detail {
namespace {

__device__ __forceinline__ uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

__global__ void fill_uniform_kernel(void* p, int64_t n, bool bf16, float scale, uint64_t seed) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += stride) {
    const uint64_t r = splitmix64(seed ^ (static_cast<uint64_t>(i) * 0xd1b54a32d192ed03ull));
    const float u = (static_cast<float>(r >> 40) * (1.0f / 16777216.0f)) * 2.0f - 1.0f;  // [-1, 1)
    if (bf16)
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(u * scale);
    else
      static_cast<float*>(p)[i] = u * scale;
  }
}

__global__ void add_to_rows_kernel(float* m, int64_t n, int64_t cols, const float* v) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += stride)
    m[i] += v[i % cols];
}

void check(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw CudaError("bench", std::string(what) + " launch failed: " + cudaGetErrorString(err));
}

}  // namespace

void fill_uniform(void* p, int64_t n, bool bf16, float scale, uint64_t seed, Stream stream) {
  if (n == 0) return;
  fill_uniform_kernel<<<1024, 256, 0, static_cast<cudaStream_t>(stream)>>>(p, n, bf16, scale, seed);
  check("fill_uniform_kernel");
}

void add_to_rows(float* m, int64_t rows, int64_t cols, const float* v, Stream stream) {
  if (rows * cols == 0) return;
  add_to_rows_kernel<<<1024, 256, 0, static_cast<cudaStream_t>(stream)>>>(m, rows * cols, cols, v);
  check("add_to_rows_kernel");
}

}  // namespace moekit::bench_detail

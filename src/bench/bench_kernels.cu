// The empty kernel behind the launch-latency ceilings: whatever it costs is the floor of any one-kernel call.
#include <cuda_runtime.h>

#include <string>

#include "bench_kernels.h"
#include "moekit/error.h"

namespace moekit::bench {
namespace {

__global__ void empty_kernel() {}

}  // namespace

void launch_empty_kernel(Stream stream) {
  empty_kernel<<<1, 32, 0, static_cast<cudaStream_t>(stream)>>>();
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    throw CudaError("bench", std::string("launch of empty_kernel failed: ") + cudaGetErrorString(e));
}

}  // namespace moekit::bench

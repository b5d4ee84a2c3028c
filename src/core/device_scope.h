// Makes a CUDA device current for a scope and restores the caller's device afterwards, so that moekit's
// allocations and copies never change which device the caller's later CUDA calls go to. CUDA builds only.
#pragma once

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <string_view>

#include "moekit/error.h"

namespace moekit::detail {

/// Throws CudaError for `op` ("{call} failed: {reason}") when `err` is not cudaSuccess, after clearing the error so
/// that it does not surface again in an unrelated later call.
inline void check_cuda(cudaError_t err, std::string_view op, std::string_view call) {
  if (err == cudaSuccess) return;
  cudaGetLastError();
  throw CudaError(op, fmt::format("{} failed: {}", call, cudaGetErrorString(err)));
}

class CurrentDeviceScope {
 public:
  /// Makes `index` current; a failure throws CudaError for `op`. Costs one cudaGetDevice where `index` is current
  /// already (the usual case on a call's path).
  CurrentDeviceScope(int index, std::string_view op) {
    check_cuda(cudaGetDevice(&previous_), op, "cudaGetDevice");
    if (previous_ != index) {
      check_cuda(cudaSetDevice(index), op, fmt::format("cudaSetDevice({})", index));
      switched_ = true;
    }
  }
  ~CurrentDeviceScope() {
    if (switched_) cudaSetDevice(previous_);  // best effort: a destructor must not throw
  }
  CurrentDeviceScope(const CurrentDeviceScope&) = delete;
  CurrentDeviceScope& operator=(const CurrentDeviceScope&) = delete;

 private:
  int previous_ = 0;
  bool switched_ = false;
};

}  // namespace moekit::detail

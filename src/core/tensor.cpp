// TensorView helpers: contiguous construction, element count, contiguity, description.
#include "moekit/tensor.h"

#include <fmt/format.h>

#include "moekit/error.h"

namespace moekit {

std::string device_name(const Device& d) {
  return d.is_cpu() ? "cpu" : fmt::format("cuda:{}", d.index);
}

TensorView TensorView::contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape, Device device) {
  if (shape.size() > kMaxDims)
    throw InvalidArgument("tensor", fmt::format("ndim ({}) must be <= {}", shape.size(), kMaxDims));
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.device = device;
  v.ndim = static_cast<int>(shape.size());
  int i = 0;
  for (int64_t s : shape) {
    if (s < 0) throw InvalidArgument("tensor", fmt::format("shape[{}] ({}) must be >= 0", i, s));
    v.shape[i++] = s;
  }
  int64_t stride = 1;
  for (int d = v.ndim - 1; d >= 0; --d) {
    v.strides[d] = stride;
    if (__builtin_mul_overflow(stride, v.shape[d], &stride))
      throw InvalidArgument("tensor", fmt::format("shape {} must hold at most 2^63 - 1 elements", v.describe()));
  }
  return v;
}

int64_t TensorView::numel() const {
  if (ndim == 0) return 0;
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) n *= shape[d];
  return n;
}

bool TensorView::is_contiguous() const {
  int64_t expected = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    if (shape[d] != 1 && strides[d] != expected) return false;
    expected *= shape[d];
  }
  return true;
}

std::string TensorView::describe() const {
  std::string s = "[";
  for (int d = 0; d < ndim; ++d) s += (d ? ", " : "") + std::to_string(shape[d]);
  return s + "] " + std::string(dtype_name(dtype)) + " " + device_name(device);
}

}  // namespace moekit

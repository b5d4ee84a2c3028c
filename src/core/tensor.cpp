// TensorView helpers: contiguous construction, element count, contiguity, description.
#include "moekit/tensor.h"

#include <fmt/format.h>

#include <utility>

#include "core/in_place.h"
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

namespace {

// [begin, end) of the bytes from a view's lowest element to its highest; empty when it has no elements or data.
std::pair<uintptr_t, uintptr_t> byte_span(const TensorView& v) {
  if (v.data == nullptr || v.numel() == 0) return {0, 0};
  int64_t low = 0, high = 0;  // element offsets from data
  for (int d = 0; d < v.ndim; ++d) (v.strides[d] < 0 ? low : high) += (v.shape[d] - 1) * v.strides[d];
  const auto at = reinterpret_cast<uintptr_t>(v.data);
  const int64_t size = dtype_size(v.dtype);
  return {at + static_cast<uintptr_t>(low * size), at + static_cast<uintptr_t>((high + 1) * size)};
}

}  // namespace

bool TensorView::overlaps(const TensorView& other) const {
  if (!(device == other.device)) return false;
  const auto [a0, a1] = byte_span(*this);
  const auto [b0, b1] = byte_span(other);
  return a0 < a1 && b0 < b1 && a0 < b1 && b0 < a1;
}

std::string TensorView::describe() const {
  std::string s = "[";
  for (int d = 0; d < ndim; ++d) s += (d ? ", " : "") + std::to_string(shape[d]);
  return s + "] " + std::string(dtype_name(dtype)) + " " + device_name(device);
}

}  // namespace moekit

namespace moekit::detail {

std::string in_place_problem(const TensorView& out, std::string_view out_name, const TensorView& in,
                             std::string_view in_name) {
  if (out.data == in.data || !out.overlaps(in)) return {};
  const auto from = reinterpret_cast<uintptr_t>(in.data), to = reinterpret_cast<uintptr_t>(out.data);
  return fmt::format("{} ({}) must be {} itself (in place) or share no byte with it; it starts {} bytes {} {}",
                     out_name, out.describe(), in_name, to > from ? to - from : from - to,
                     to > from ? "after" : "before", in_name);
}

std::string shared_bytes_problem(const TensorView& a, std::string_view a_name, const TensorView& b,
                                 std::string_view b_name) {
  if (!a.overlaps(b)) return {};
  return fmt::format("{} ({}) must share no byte with {}", a_name, a.describe(), b_name);
}

}  // namespace moekit::detail

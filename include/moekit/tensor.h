// Non-owning tensor views: a pointer, a dtype, a device, and up to 4 dimensions with strides in elements.
// Views never allocate or free; the caller owns the memory and keeps it alive across the call (and across
// CUDA-graph replays). `Stream` is an opaque handle for a cudaStream_t, so public headers need no CUDA headers.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "moekit/dtype.h"

namespace moekit {

/// Opaque CUDA stream (a cudaStream_t); nullptr is the legacy default stream.
using Stream = void*;

/// Where a tensor lives.
enum class DeviceType : uint8_t { cpu, cuda };

/// The host (index unused) or CUDA device `index`.
struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;
  bool is_cpu() const { return type == DeviceType::cpu; }
  bool is_cuda() const { return type == DeviceType::cuda; }
  static Device cpu() { return {}; }
  static Device cuda(int index = 0) { return {DeviceType::cuda, index}; }
  friend bool operator==(const Device&, const Device&) = default;
};

/// "cpu" or "cuda:N".
std::string device_name(const Device& d);

struct TensorView {
  static constexpr int kMaxDims = 4;

  void* data = nullptr;
  DType dtype = DType::f32;
  Device device{};
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};
  std::array<int64_t, kMaxDims> strides{};  // in elements

  /// A row-major contiguous view. Throws InvalidArgument for more than kMaxDims dims, a negative extent, or more
  /// elements than int64 holds.
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape, Device device = {});

  /// A default-constructed view (ndim 0) stands for an absent optional tensor.
  bool present() const { return ndim > 0; }
  int64_t size(int d) const { return shape[d]; }
  int64_t stride(int d) const { return strides[d]; }
  /// Product of the shape; 0 for an absent view (ndim 0).
  int64_t numel() const;
  /// Row-major without gaps (a dimension of size 1 may have any stride).
  bool is_contiguous() const;
  /// Whether `data` is a multiple of `bytes` (a power of two): element accesses need their size, TMA and vector
  /// loads 16.
  bool starts_aligned(int64_t bytes) const {
    return reinterpret_cast<uintptr_t>(data) % static_cast<uintptr_t>(bytes) == 0;
  }
  /// "[3, 8] bf16 cuda:0"
  std::string describe() const;
  /// Whether the bytes this view's elements span (from its lowest element to its highest) share a byte with
  /// `other`'s on the same device. Absent views, views without data and views of no elements overlap nothing.
  bool overlaps(const TensorView& other) const;

  /// The data pointer as T* (no check of dtype).
  template <class T>
  T* as() const {
    return static_cast<T*>(data);
  }
};

}  // namespace moekit

// Device queries through the CUDA runtime; without a CUDA build (or a driver) they report no devices.
#include "moekit/device.h"

#include <fmt/format.h>

#include <utility>

#include "core/capture.h"
#include "moekit/error.h"

#if MOEKIT_HAS_CUDA
#include <cuda_runtime_api.h>

#include "core/device_scope.h"
#endif

namespace moekit {

bool built_with_cuda() {
#if MOEKIT_HAS_CUDA
  return true;
#else
  return false;
#endif
}

int cuda_device_count() {
#if MOEKIT_HAS_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
#else
  return 0;
#endif
}

DeviceInfo device_info(int index) {
  int n = cuda_device_count();
  if (index < 0 || index >= n)
    throw NotSupported("device_info",
                       fmt::format("device index ({}) must be < the number of CUDA devices ({})", index, n));
  DeviceInfo info;
#if MOEKIT_HAS_CUDA
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, index) != cudaSuccess)
    throw CudaError("device_info", fmt::format("cudaGetDeviceProperties({}) failed", index));
  info.index = index;
  info.name = p.name;
  info.cc_major = p.major;
  info.cc_minor = p.minor;
  info.sm_count = p.multiProcessorCount;
  info.global_mem_bytes = static_cast<long long>(p.totalGlobalMem);
  info.l2_bytes = p.l2CacheSize;
  info.max_smem_per_block_optin = static_cast<int>(p.sharedMemPerBlockOptin);
  if (cudaDeviceGetAttribute(&info.memory_clock_khz, cudaDevAttrMemoryClockRate, index) != cudaSuccess ||
      cudaDeviceGetAttribute(&info.memory_bus_bits, cudaDevAttrGlobalMemoryBusWidth, index) != cudaSuccess)
    throw CudaError("device_info",
                    fmt::format("cudaDeviceGetAttribute({}) of the memory clock or bus failed", index));
  cudaRuntimeGetVersion(&info.cuda_runtime_version);
  cudaDriverGetVersion(&info.driver_version);
#endif
  return info;
}

double peak_dram_bytes_per_s(const DeviceInfo& info) {
  return 2.0 * 1e3 * info.memory_clock_khz * (info.memory_bus_bits / 8.0);
}

bool device_is_sm90(int index) {
  if (index < 0 || index >= cuda_device_count()) return false;
  DeviceInfo d = device_info(index);
  return d.cc_major == 9 && d.cc_minor == 0;
}

#if MOEKIT_HAS_CUDA
namespace {
void check(cudaError_t e, const char* call) {
  detail::check_cuda(e, "device", call);
}

int device_of(const void* device_ptr) {
  cudaPointerAttributes a{};
  check(cudaPointerGetAttributes(&a, device_ptr), "cudaPointerGetAttributes");
  if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged)
    throw InvalidArgument("device", "the device-side pointer must point to CUDA device memory");
  return a.device;
}

// cudaMemcpy and cudaMemset order themselves after the legacy default stream only, not after streams created with
// cudaStreamNonBlocking (as engines' and moekit's own are), and a copy from pageable host memory may return before
// its bytes have reached the device. The helpers below wait for every stream of the device before and after, so
// that they are synchronous with respect to all of the caller's work.
template <class Op>
void on_quiet_device(int device, const char* what, Op op) {
  detail::CurrentDeviceScope scope(device, "device");
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  check(op(), what);
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}
}  // namespace

DeviceBuffer::DeviceBuffer(size_t bytes, int device) : bytes_(bytes), device_(device) {
  detail::CurrentDeviceScope scope(device, "device");
  if (bytes > 0) check(cudaMalloc(&data_, bytes), "cudaMalloc");
}

DeviceBuffer::~DeviceBuffer() {
  if (data_) cudaFree(data_);
}

void DeviceBuffer::upload(const void* host, size_t bytes) {
  if (bytes > bytes_)
    throw InvalidArgument("device",
                          fmt::format("upload of {} bytes must be <= the buffer's {} bytes", bytes, bytes_));
  if (bytes == 0) return;
  on_quiet_device(device_, "cudaMemcpy(host to device)",
                  [&] { return cudaMemcpy(data_, host, bytes, cudaMemcpyHostToDevice); });
}

void DeviceBuffer::download(void* host, size_t bytes) const {
  if (bytes > bytes_)
    throw InvalidArgument("device",
                          fmt::format("download of {} bytes must be <= the buffer's {} bytes", bytes, bytes_));
  if (bytes == 0) return;
  on_quiet_device(device_, "cudaMemcpy(device to host)",
                  [&] { return cudaMemcpy(host, data_, bytes, cudaMemcpyDeviceToHost); });
}

void copy_to_host(void* host_dst, const void* device_src, size_t bytes) {
  if (bytes == 0) return;
  on_quiet_device(device_of(device_src), "cudaMemcpy(device to host)",
                  [&] { return cudaMemcpy(host_dst, device_src, bytes, cudaMemcpyDeviceToHost); });
}

void copy_to_device(void* device_dst, const void* host_src, size_t bytes) {
  if (bytes == 0) return;
  on_quiet_device(device_of(device_dst), "cudaMemcpy(host to device)",
                  [&] { return cudaMemcpy(device_dst, host_src, bytes, cudaMemcpyHostToDevice); });
}

void fill_device_bytes(void* device_dst, unsigned char value, size_t bytes) {
  if (bytes == 0) return;
  on_quiet_device(device_of(device_dst), "cudaMemset", [&] { return cudaMemset(device_dst, value, bytes); });
}

void device_synchronize(int device) {
  detail::CurrentDeviceScope scope(device, "device");
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}
#else
DeviceBuffer::DeviceBuffer(size_t, int) {
  throw NotSupported("device", "device memory needs CUDA: moekit was built without CUDA");
}
DeviceBuffer::~DeviceBuffer() = default;
void DeviceBuffer::upload(const void*, size_t) {
  throw NotSupported("device", "device memory needs CUDA: moekit was built without CUDA");
}
void DeviceBuffer::download(void*, size_t) const {
  throw NotSupported("device", "device memory needs CUDA: moekit was built without CUDA");
}
void copy_to_host(void*, const void*, size_t) {
  throw NotSupported("device", "device memory needs CUDA: moekit was built without CUDA");
}
void copy_to_device(void*, const void*, size_t) {
  throw NotSupported("device", "device memory needs CUDA: moekit was built without CUDA");
}
void fill_device_bytes(void*, unsigned char, size_t) {
  throw NotSupported("device", "device memory needs CUDA: moekit was built without CUDA");
}
void device_synchronize(int) {
  throw NotSupported("device", "device_synchronize needs CUDA: moekit was built without CUDA");
}
#endif

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(other.data_), bytes_(other.bytes_), device_(other.device_) {
  other.data_ = nullptr;
  other.bytes_ = 0;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    DeviceBuffer old(std::move(*this));
    data_ = other.data_;
    bytes_ = other.bytes_;
    device_ = other.device_;
    other.data_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

}  // namespace moekit

namespace moekit::detail {

bool stream_is_capturing(Stream stream) {
#if MOEKIT_HAS_CUDA
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &status) != cudaSuccess) {
    cudaGetLastError();  // the query's error is not the caller's
    return true;
  }
  return status != cudaStreamCaptureStatusNone;
#else
  (void)stream;
  return false;
#endif
}

}  // namespace moekit::detail

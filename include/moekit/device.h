// What moekit can see of the machine's CUDA devices. Safe to call in a build without CUDA or on a machine
// without a GPU: it then reports zero devices instead of throwing.
#pragma once

#include <cstddef>
#include <string>

namespace moekit {

struct DeviceInfo {
  int index = -1;
  std::string name;  // e.g. "NVIDIA H200"
  int cc_major = 0;  // compute capability
  int cc_minor = 0;
  int sm_count = 0;
  long long global_mem_bytes = 0;
  int l2_bytes = 0;
  int memory_clock_khz = 0;  // peak DRAM clock
  int memory_bus_bits = 0;   // DRAM bus width
  int max_smem_per_block_optin = 0;
  int cuda_runtime_version = 0;  // e.g. 13000
  int driver_version = 0;
};

/// The peak DRAM bandwidth of `info` in bytes per second: 2 transfers per clock of memory_clock_khz over
/// memory_bus_bits (an H100 SXM: 2619 MHz x 5120 bits, 3.35 TB/s; an H200: 3201 MHz x 6144 bits, 4.92 TB/s); 0 where
/// either field is 0.
double peak_dram_bytes_per_s(const DeviceInfo& info);

/// True when this build of moekit contains CUDA kernels.
bool built_with_cuda();

/// Number of usable CUDA devices; 0 without CUDA support, a driver or a GPU. Never throws.
int cuda_device_count();

/// Properties of device `index`. Throws NotSupported when there is no such device.
DeviceInfo device_info(int index = 0);

/// True when device `index` exists and is a Hopper part with sm_90 (the only architecture moekit kernels target).
bool device_is_sm90(int index = 0);

/// Owning device memory for tools, tests and bindings that must not include CUDA headers. Allocation happens in the
/// constructor (cudaMalloc on `device`); upload/download are synchronous like copy_to_device/copy_to_host below.
/// Throws NotSupported in a build without CUDA, CudaError when a CUDA call fails.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(size_t bytes, int device = 0);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  /// The device pointer (null when empty), its size in bytes and its CUDA device.
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  int device() const { return device_; }
  /// Copies `bytes` (<= this->bytes()) from host memory, after the device's pending work; the bytes are in
  /// place when it returns.
  void upload(const void* host, size_t bytes);
  /// Copies `bytes` (<= this->bytes()) to host memory, after the device's pending work.
  void download(void* host, size_t bytes) const;

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  int device_ = 0;
};

/// Synchronous copies between host memory and device memory that moekit or the caller allocated, and a byte fill
/// of device memory. Each waits for the work pending on every stream of the device that holds the device-side
/// bytes (blocking or not: plain cudaMemcpy and cudaMemset order themselves after the legacy default stream
/// only), then copies or fills, and returns when the bytes are in place. Not for the hot path, and not while a
/// stream of that device captures a graph in global mode. Throws InvalidArgument when the device-side pointer is
/// not CUDA device or managed memory, NotSupported without CUDA, CudaError on failure.
void copy_to_host(void* host_dst, const void* device_src, size_t bytes);
void copy_to_device(void* device_dst, const void* host_src, size_t bytes);
void fill_device_bytes(void* device_dst, unsigned char value, size_t bytes);

/// Waits for all work on `device`. Throws CudaError with the failure of any earlier asynchronous work.
void device_synchronize(int device = 0);

}  // namespace moekit

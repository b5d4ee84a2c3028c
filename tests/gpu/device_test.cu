// The synchronous device-memory helpers of moekit/device.h against work on a stream created with
// cudaStreamNonBlocking, which plain cudaMemcpy / cudaMemset do not wait for: a kernel on such a stream sleeps, then
// writes or reads a buffer, and each helper, called while it sleeps, must act after it. Skips without an sm90 GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "gpu/gpu_test.h"
#include "moekit/device.h"
#include "moekit/error.h"

namespace moekit {
namespace {

#define MOEKIT_REQUIRE_SM90() MOEKIT_SKIP_WITHOUT_SM90("the helpers are tested against an sm90 device")

constexpr unsigned long long kSleepNs = 50'000'000;  // 50 ms: far longer than issuing the helper takes

__device__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ void sleep_ns(unsigned long long ns) {
  const unsigned long long start = global_ns();
  while (global_ns() - start < ns) __nanosleep(100'000);
}

// Sleeps, then writes `value` into p[0..n).
__global__ void sleep_then_write(int* p, int n, int value, unsigned long long ns) {
  sleep_ns(ns);
  for (int i = 0; i < n; ++i) p[i] = value;
}

// Sleeps, then copies p[0] into seen[0].
__global__ void sleep_then_read(const int* p, int* seen, unsigned long long ns) {
  sleep_ns(ns);
  seen[0] = p[0];
}

class GpuDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    MOEKIT_REQUIRE_SM90();
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) {
      EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
      cudaStreamDestroy(stream_);
    }
  }
  cudaStream_t stream_ = nullptr;
};

TEST_F(GpuDevice, CopiesToTheHostWaitForNonBlockingStreams) {
  constexpr int n = 256;
  DeviceBuffer buf(n * 4);
  const std::vector<int> zeros(n, 0);
  buf.upload(zeros.data(), n * 4);

  sleep_then_write<<<1, 1, 0, stream_>>>(static_cast<int*>(buf.data()), n, 42, kSleepNs);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  std::vector<int> got(n, -1);
  copy_to_host(got.data(), buf.data(), n * 4);
  EXPECT_EQ(got, std::vector<int>(n, 42)) << "copy_to_host read before the kernel's write";

  sleep_then_write<<<1, 1, 0, stream_>>>(static_cast<int*>(buf.data()), n, 7, kSleepNs);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  buf.download(got.data(), n * 4);
  EXPECT_EQ(got, std::vector<int>(n, 7)) << "DeviceBuffer::download read before the kernel's write";
}

TEST_F(GpuDevice, CopiesToTheDeviceWaitForKernelsThatStillReadTheBytes) {
  DeviceBuffer buf(4), seen(4);
  const int before = 5, after = 9;
  buf.upload(&before, 4);

  sleep_then_read<<<1, 1, 0, stream_>>>(static_cast<const int*>(buf.data()), static_cast<int*>(seen.data()),
                                        kSleepNs);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  copy_to_device(buf.data(), &after, 4);  // must not overwrite what the sleeping kernel has yet to read
  int got = -1;
  seen.download(&got, 4);
  EXPECT_EQ(got, before) << "copy_to_device wrote before the kernel read";
  buf.download(&got, 4);
  EXPECT_EQ(got, after);

  sleep_then_read<<<1, 1, 0, stream_>>>(static_cast<const int*>(buf.data()), static_cast<int*>(seen.data()),
                                        kSleepNs);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  buf.upload(&before, 4);
  seen.download(&got, 4);
  EXPECT_EQ(got, after) << "DeviceBuffer::upload wrote before the kernel read";
}

TEST_F(GpuDevice, FillsComeAfterNonBlockingStreamsWrites) {
  constexpr int n = 64;
  DeviceBuffer buf(n * 4);
  sleep_then_write<<<1, 1, 0, stream_>>>(static_cast<int*>(buf.data()), n, 42, kSleepNs);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  fill_device_bytes(buf.data(), 0xa5, n * 4);
  std::vector<int> got(n, 0);
  buf.download(got.data(), n * 4);
  EXPECT_EQ(got, std::vector<int>(n, static_cast<int>(0xa5a5a5a5u))) << "the kernel's write landed after the fill";
}

TEST_F(GpuDevice, HostPointersAreNotDeviceMemory) {
  std::vector<int> host(4, 0), other(4, 0);
  EXPECT_THROW(copy_to_device(host.data(), other.data(), 16), InvalidArgument);
  EXPECT_THROW(copy_to_host(other.data(), host.data(), 16), InvalidArgument);
  EXPECT_THROW(fill_device_bytes(host.data(), 0, 16), InvalidArgument);
  // Nothing to copy: no pointer is looked at.
  EXPECT_NO_THROW(copy_to_device(nullptr, nullptr, 0));
}

}  // namespace
}  // namespace moekit

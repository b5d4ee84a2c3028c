// The benchmark's data kernels against their host definitions: fill_uniform (the counter-based hash fill of
// weights, hidden states and logits, fp32 and bf16) bit for bit, and add_to_rows (bench moe --logit-skew's
// per-expert logit offsets) exactly, on odd sizes and fresh random inputs (the seed is printed; MOEKIT_TEST_SEED
// replays one). Skips without an sm90 GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "bench/moe_bench_kernels.h"
#include "gpu/gpu_test.h"
#include "moekit/device.h"

namespace moekit {
namespace {

#define MOEKIT_REQUIRE_SM90() MOEKIT_SKIP_WITHOUT_SM90("the benchmark's kernels are built for sm_90a")

uint32_t test_seed() {
  return test::run_seed("bench_test");
}

void ck(cudaError_t err) {
  ASSERT_EQ(err, cudaSuccess) << cudaGetErrorString(err);
}

// The fill's definition: splitmix64 of seed ^ (i * odd constant), the top 24 bits as a uniform in [-1, 1), scaled.
float host_uniform(uint64_t seed, int64_t i, float scale) {
  uint64_t x = seed ^ (static_cast<uint64_t>(i) * 0xd1b54a32d192ed03ull);
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  const float u = (static_cast<float>(x >> 40) * (1.0f / 16777216.0f)) * 2.0f - 1.0f;
  return u * scale;
}

// fp32 -> bf16 bits, round to nearest even (finite inputs).
uint16_t host_bf16(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  b += 0x7fffu + ((b >> 16) & 1u);
  return static_cast<uint16_t>(b >> 16);
}

TEST(GpuBenchKernels, FillUniformMatchesItsHostDefinition) {
  MOEKIT_REQUIRE_SM90();
  std::mt19937_64 rng(test_seed());
  const int64_t n = 100003;  // not a multiple of the grid's stride
  const uint64_t seed = rng();
  const float scale = 0.37f;
  void* d = nullptr;
  ck(cudaMalloc(&d, n * 4));
  for (bool bf16 : {false, true}) {
    bench_detail::fill_uniform(d, n, bf16, scale, seed, nullptr);
    ck(cudaDeviceSynchronize());
    if (bf16) {
      std::vector<uint16_t> got(n);
      ck(cudaMemcpy(got.data(), d, n * 2, cudaMemcpyDeviceToHost));
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], host_bf16(host_uniform(seed, i, scale))) << "bf16, i = " << i;
    } else {
      std::vector<float> got(n);
      ck(cudaMemcpy(got.data(), d, n * 4, cudaMemcpyDeviceToHost));
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(got[i], host_uniform(seed, i, scale)) << "fp32, i = " << i;
        ASSERT_TRUE(got[i] >= -scale && got[i] < scale) << got[i];
      }
    }
  }
  ck(cudaFree(d));
}

TEST(GpuBenchKernels, AddToRowsAddsTheVectorToEveryRow) {
  MOEKIT_REQUIRE_SM90();
  std::mt19937 rng(test_seed() + 1);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {37, 513}, {1000, 256}, {0, 8}}) {
    std::vector<float> m(rows * cols), v(cols);
    for (float& x : m) x = u(rng);
    for (float& x : v) x = u(rng);
    float *dm = nullptr, *dv = nullptr;
    ck(cudaMalloc(&dm, (m.size() + 1) * 4));
    ck(cudaMalloc(&dv, v.size() * 4));
    copy_to_device(dm, m.data(), m.size() * 4);
    copy_to_device(dv, v.data(), v.size() * 4);
    bench_detail::add_to_rows(dm, rows, cols, dv, nullptr);
    ck(cudaDeviceSynchronize());
    std::vector<float> got(m.size());
    ck(cudaMemcpy(got.data(), dm, got.size() * 4, cudaMemcpyDeviceToHost));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        ASSERT_EQ(got[r * cols + c], m[r * cols + c] + v[c]) << rows << "x" << cols << " at " << r << ", " << c;
    ck(cudaFree(dm));
    ck(cudaFree(dv));
  }
}

}  // namespace
}  // namespace moekit

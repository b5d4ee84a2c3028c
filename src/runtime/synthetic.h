// Deterministic pseudo-random fills for synthetic weights and timing inputs (internal). A counter-based generator
// (splitmix64 of seed * an odd constant + index, so that neighbouring seeds are not shifted copies of one stream):
// any buffer's contents depend only on the seed, not on fill order or threads.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <thread>
#include <vector>

#include "moekit/cuda_experts.h"  // kSyntheticBiasScale
#include "moekit/dtype.h"

namespace moekit::detail {

/// splitmix64: a bijective 64-bit mix; consecutive inputs give independent-looking outputs.
constexpr uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// Uniform in [-scale, scale) for element `i` of the stream `seed`.
inline float uniform_at(uint64_t seed, uint64_t i, float scale) {
  const uint64_t bits = mix64(seed * 0x632be59bd9b4e019ull + i) >> 40;  // 24 random bits
  return (static_cast<float>(bits) * (1.0f / 8388608.0f) - 1.0f) * scale;
}

/// Runs fill(begin, end) over [0, n) split across the hardware threads (large n only). Each element depends only on
/// its index, so the split does not change the result.
template <class Fill>
void parallel_fill(size_t n, Fill fill) {
  const size_t threads = std::min<size_t>(std::max(1u, std::thread::hardware_concurrency()), n / (1u << 20) + 1);
  if (threads <= 1) return fill(size_t{0}, n);
  std::vector<std::thread> pool;
  for (size_t t = 0; t < threads; ++t) pool.emplace_back(fill, n * t / threads, n * (t + 1) / threads);
  for (std::thread& th : pool) th.join();
}

/// One synthetic stream: seed and scale of uniform_at().
struct SyntheticStream {
  uint64_t seed;
  float scale;
};
/// Every runner's synthetic timing inputs (Runner::time_tactics() without a caller's logits), so that the runners
/// time the same hidden states and routing: hidden [max_tokens, H] in [-1, 1), logits [max_tokens, E] in [-2, 2).
inline constexpr SyntheticStream kTimingHidden{11, 1.0f}, kTimingLogits{12, 2.0f};
/// The stream of every runner's synthetic selection bias (presets with one: deepseek-v3, kimi-k2) among the synthetic
/// weights of `weight_seed` (Runner::build_synthetic(); w13, w2, b13 and b2 take weight_seed + 0..3), uniform in
/// [-kSyntheticBiasScale, kSyntheticBiasScale) as `bench moe`'s: it moves selections yet sends rows to every expert,
/// as a trained load-balancing bias does. A scale of 0.5 outweighs the sigmoid keys of logits in [-2, 2) (45-89 of
/// 256 experts get rows), and the tuner would time a routing no engine sees.
constexpr SyntheticStream synthetic_routing_bias(uint64_t weight_seed) {
  return {weight_seed + 4, kSyntheticBiasScale};
}

inline void fill_uniform_bf16(std::span<uint16_t> out, uint64_t seed, float scale) {
  parallel_fill(out.size(), [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) out[i] = float_to_bf16(uniform_at(seed, i, scale));
  });
}

inline void fill_uniform_f32(std::span<float> out, uint64_t seed, float scale) {
  parallel_fill(out.size(), [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) out[i] = uniform_at(seed, i, scale);
  });
}

}  // namespace moekit::detail

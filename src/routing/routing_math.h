// Arithmetic shared bit-for-bit by the CPU reference and the CUDA router: a portable exp/sigmoid built from
// explicitly rounded operations (no contraction into FMA, no fast-math), and the total order on selection keys.
// Identical keys on every backend are what make the selected ids match exactly, also for near-ties.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define MOEKIT_HD __host__ __device__ __forceinline__
#else
#define MOEKIT_HD inline
#endif

namespace moekit::routing_math {

#if defined(__CUDA_ARCH__)
MOEKIT_HD float mul(float a, float b) {
  return __fmul_rn(a, b);
}
MOEKIT_HD float add(float a, float b) {
  return __fadd_rn(a, b);
}
MOEKIT_HD float div(float a, float b) {
  return __fdiv_rn(a, b);
}
MOEKIT_HD float fma(float a, float b, float c) {
  return __fmaf_rn(a, b, c);
}
MOEKIT_HD float round_int(float a) {
  return rintf(a);
}
MOEKIT_HD uint32_t bits(float f) {
  return __float_as_uint(f);
}
MOEKIT_HD float from_bits(uint32_t u) {
  return __uint_as_float(u);
}
#else
MOEKIT_HD float mul(float a, float b) {
  volatile float r = a * b;  // volatile: no contraction with a neighbouring add
  return r;
}
MOEKIT_HD float add(float a, float b) {
  volatile float r = a + b;
  return r;
}
MOEKIT_HD float div(float a, float b) {
  return a / b;
}
MOEKIT_HD float fma(float a, float b, float c) {
  return __builtin_fmaf(a, b, c);
}
MOEKIT_HD float round_int(float a) {
  return __builtin_rintf(a);
}
MOEKIT_HD uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
MOEKIT_HD float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
#endif

/// e^(x - k ln 2) for k = round(x / ln 2): Cody-Waite reduction by ln 2 and a degree-6 polynomial on
/// [-ln2/2, ln2/2], the common part of exp() and exp_normal_range().
MOEKIT_HD float exp_reduced(float x, float k) {
  float r = fma(k, -0.693145751953125f, x);
  r = fma(k, -1.428606765330187045e-06f, r);
  float p = 1.3888889225e-3f;  // 1/720
  p = fma(p, r, 8.3333337680e-3f);
  p = fma(p, r, 4.1666667908e-2f);
  p = fma(p, r, 1.6666667163e-1f);
  p = fma(p, r, 0.5f);
  p = fma(p, r, 1.0f);
  return fma(p, r, 1.0f);
}

/// exp(x) in fp32, within 3 ulp of the correctly rounded value, bitwise identical on host and device:
/// exp_reduced(), then an exact scaling by 2^k. Branch-free (the special cases are selected at the end), so a warp
/// evaluating several values interleaves them.
MOEKIT_HD float exp(float x) {
  const bool nan = x != x, over = x > 88.72283935546875f, under = x < -103.97208404541016f;
  const float xc = nan ? 0.0f : (over ? 88.72283935546875f : (under ? -103.97208404541016f : x));
  const float k = round_int(mul(xc, 1.44269502162933349609375f));
  float p = exp_reduced(xc, k);
  // 2^k as up to three exact power-of-two factors (k may be below the normal range or 128); a factor of 1 is exact.
  int ki = static_cast<int>(k);
  const int low = ki < -126 ? ki + 126 : 0;  // in [-24, -1] when used: 2^low is normal
  ki = ki < -126 ? -126 : ki;
  const int high = ki > 127 ? 1 : 0;
  ki -= high;
  p = mul(p, from_bits(static_cast<uint32_t>(low + 127) << 23));
  p = mul(p, from_bits(static_cast<uint32_t>(high + 127) << 23));
  const float e = mul(p, from_bits(static_cast<uint32_t>(ki + 127) << 23));
  return nan ? x : (over ? from_bits(0x7f800000u) : (under ? 0.0f : e));
}

/// exp(x) for x in [-87, 88], where 2^k is a normal number and no special case applies: bit for bit what exp()
/// returns there (its factors 2^low and 2^high are 1), without the special-case selects and those two products.
MOEKIT_HD float exp_normal_range(float x) {
  const float k = round_int(mul(x, 1.44269502162933349609375f));
  return mul(exp_reduced(x, k), from_bits(static_cast<uint32_t>(static_cast<int>(k) + 127) << 23));
}

/// 1 / (1 + exp(-x)), IEEE-rounded division.
MOEKIT_HD float sigmoid(float x) {
  return div(1.0f, add(1.0f, exp(-x)));
}

/// The bits of a float that is neither NaN nor -0, mapped to an unsigned integer with the float's order: negative
/// values flip every bit, the others the sign bit.
MOEKIT_HD uint32_t order_bits(uint32_t u) {
  return u ^ (static_cast<uint32_t>(static_cast<int32_t>(u) >> 31) | 0x80000000u);
}

/// Maps a key to an unsigned integer with the same order: NaN lowest (below -inf), -0 equal to +0.
/// Branch-free: adding +0 turns -0 into +0, then order_bits().
MOEKIT_HD uint32_t ordered_key(float key) {
  const uint32_t u = bits(add(key, 0.0f));
  const uint32_t o = order_bits(u);
  return key != key ? 0u : o;
}

/// A (key, expert) pair as one integer: larger is selected first; equal keys prefer the lower expert id.
MOEKIT_HD uint64_t packed_key(float key, int expert) {
  return (static_cast<uint64_t>(ordered_key(key)) << 32) |
         static_cast<uint32_t>(0xffffffffu - static_cast<uint32_t>(expert));
}

/// The expert id packed by packed_key().
MOEKIT_HD int packed_expert(uint64_t packed) {
  return static_cast<int>(0xffffffffu - static_cast<uint32_t>(packed & 0xffffffffu));
}

/// ceil(2^32 / d) truncated to 32 bits (so 0 for d = 1), d in [1, 2^16]: the constant of magic_div().
MOEKIT_HD uint32_t division_magic(uint32_t d) {
  return static_cast<uint32_t>(((uint64_t{1} << 32) + d - 1) / d);
}

/// n / d for n < 2^16 from magic = division_magic(d): n * magic / 2^32 exceeds n / d by n * (magic * d - 2^32) /
/// (d * 2^32) < 1 / d, while n / d is at least 1 / d below the next integer, so the floor is exact; a magic of 0
/// stands for d = 1. The CUDA router divides by Kt, B and the group size this way (a multiply-high instead of an
/// integer division).
MOEKIT_HD uint32_t magic_div(uint32_t n, uint32_t magic) {
#if defined(__CUDA_ARCH__)
  return magic == 0 ? n : __umulhi(n, magic);
#else
  return magic == 0 ? n : static_cast<uint32_t>((uint64_t{n} * magic) >> 32);
#endif
}

}  // namespace moekit::routing_math

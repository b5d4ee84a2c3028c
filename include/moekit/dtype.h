// Element types moekit understands, their sizes and names, and exact host conversions for the 16-bit float
// formats (round-to-nearest-even, NaN preserved) used by the CPU reference and the tests.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace moekit {

/// Element type of a tensor view: fp32, bf16, fp16, fp8 e4m3, int32, int16, int8, uint8.
enum class DType : uint8_t { f32, bf16, f16, f8e4m3, i32, i16, i8, u8 };

/// Bytes per element.
constexpr int dtype_size(DType t) {
  switch (t) {
    case DType::f32:
    case DType::i32:
      return 4;
    case DType::bf16:
    case DType::f16:
    case DType::i16:
      return 2;
    case DType::f8e4m3:
    case DType::i8:
    case DType::u8:
      return 1;
  }
  return 0;
}

/// Short name: "fp32", "bf16", "fp16", "fp8_e4m3", "int32", "int16", "int8", "uint8".
std::string_view dtype_name(DType t);

/// Parses a name produced by dtype_name(). Throws InvalidArgument listing the valid names.
DType parse_dtype(std::string_view name);

/// bf16 bits -> float (exact).
inline float bf16_to_float(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// float -> bf16 bits, round to nearest even; NaN stays NaN.
inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

/// Rounds a float to the nearest bf16 value and back.
inline float round_to_bf16(float f) {
  return bf16_to_float(float_to_bf16(f));
}

/// ||got - want|| / ||want|| (Frobenius) over n bf16 values, in double: the accuracy measure of every moekit check
/// and benchmark (DESIGN §10). The absolute norm when `want` is all zero; NaN in `got` gives NaN (fails any <=).
inline double relative_frobenius_bf16(const uint16_t* got, const uint16_t* want, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double g = bf16_to_float(got[i]), w = bf16_to_float(want[i]);
    num += (g - w) * (g - w);
    den += w * w;
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

}  // namespace moekit

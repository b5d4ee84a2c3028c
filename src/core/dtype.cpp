// dtype names and parsing.
#include "moekit/dtype.h"

#include <array>
#include <string>

#include "moekit/error.h"

namespace moekit {
namespace {
constexpr std::array<std::pair<DType, std::string_view>, 8> kNames{{
    {DType::f32, "fp32"},
    {DType::bf16, "bf16"},
    {DType::f16, "fp16"},
    {DType::f8e4m3, "fp8_e4m3"},
    {DType::i32, "int32"},
    {DType::i16, "int16"},
    {DType::i8, "int8"},
    {DType::u8, "uint8"},
}};
}  // namespace

std::string_view dtype_name(DType t) {
  for (const auto& [d, n] : kNames)
    if (d == t) return n;
  return "unknown";
}

DType parse_dtype(std::string_view name) {
  std::string valid;
  for (const auto& [d, n] : kNames) {
    if (n == name) return d;
    valid += (valid.empty() ? "" : ", ") + std::string(n);
  }
  throw InvalidArgument("dtype", "unknown dtype '" + std::string(name) + "' (expected one of: " + valid + ")");
}

}  // namespace moekit

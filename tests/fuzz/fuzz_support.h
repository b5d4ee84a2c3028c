// What the fuzz targets share: the input reader, violations, and the outcome counts the smoke tests check.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "moekit/dtype.h"

namespace moekit::fuzz {

/// Reads the input front to back; past its end every read is 0, so any input decodes to some call.
class Bytes {
 public:
  Bytes(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t u8() { return at_ < size_ ? data_[at_++] : 0; }
  uint32_t u32() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v = v << 8 | u8();
    return v;
  }
  /// One of `n` choices.
  int pick(int n) { return u8() % n; }
  /// True with probability about `percent` / 100 (0 when the input is used up).
  bool chance(int percent) { return at_ < size_ && u8() % 100 < percent; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t at_ = 0;
};

/// Small dyadic values (exact in bf16, and sums of their products stay exact in fp32 for the sizes fuzzed), with
/// zeros and repeats for ties.
inline float small_value(Bytes& in) {
  static const float kValues[] = {0.0f,  0.5f,   -0.5f, 1.0f,  -1.0f, 2.0f, -2.0f,
                                  0.25f, -0.25f, 1.5f,  -1.5f, 3.0f,  -3.0f};
  return kValues[in.pick(sizeof(kValues) / sizeof(kValues[0]))];
}

/// `n` (at least one) small values as bf16 bits.
inline std::vector<uint16_t> bf16_values(Bytes& in, int64_t n) {
  std::vector<uint16_t> v(static_cast<size_t>(n > 1 ? n : 1));
  for (uint16_t& x : v) x = float_to_bf16(small_value(in));
  return v;
}

/// A broken property: printed, then the process aborts (libFuzzer keeps the input, ctest reports the crash).
[[noreturn]] inline void violation(const std::string& what) {
  std::fprintf(stderr, "fuzz: %s\n", what.c_str());
  std::abort();
}

inline void require(bool ok, const std::string& what) {
  if (!ok) violation(what);
}

/// How the inputs run so far ended: a checked result, or a rejection by InvalidArgument (a violation aborts).
struct Outcomes {
  int64_t accepted = 0;
  int64_t rejected = 0;
};

/// Counts a call that succeeded; `valid` says whether the documented rules allow its input (`context` names it).
inline void accepted(Outcomes& o, bool valid, const std::string& context) {
  require(valid, "an input that breaks a documented rule was accepted" + context);
  ++o.accepted;
}

/// Counts a call rejected with message `what`, which must name its operation ("moekit::op: ...").
inline void rejected(Outcomes& o, bool valid, const std::string& what, const std::string& context) {
  if (valid) violation("a valid input was rejected: " + what + context);
  require(what.rfind("moekit::", 0) == 0 && what.find(": ") != std::string::npos,
          "an error message without its operation: " + what);
  ++o.rejected;
}

}  // namespace moekit::fuzz

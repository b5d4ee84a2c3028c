// Relative Frobenius error between bf16 arrays, the accuracy measure every GPU check and benchmark of moekit
// reports (DESIGN §10). Host-only, header-only.
#pragma once

#include <cmath>
#include <cstdint>

#include "moekit/dtype.h"

namespace moekit {

/// ||got - want|| / ||want|| over n bf16 values, in double; the absolute norm when `want` is all zero.
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

// The fuzz targets: each decodes one call from `data` and checks its outcome (fuzz_support.h: a broken property
// aborts). Driven by libFuzzer (the *_fuzzer binaries, MOEKIT_BUILD_FUZZERS=ON) and by fuzz_test.cpp under ctest.
#pragma once

#include <cstddef>
#include <cstdint>

#include "fuzz_support.h"

namespace moekit::fuzz {

/// The targets, and where each keeps its outcome counts.
enum class Target { route, experts, layer, ep, tuning_cache, count };
inline Outcomes& outcomes(Target t) {
  static Outcomes all[static_cast<int>(Target::count)];
  return all[static_cast<int>(t)];
}

void route_input(const uint8_t* data, size_t size);    // moekit::route() on the CPU backend (route_fuzz.cpp)
void experts_input(const uint8_t* data, size_t size);  // moekit::experts_reference() (experts_fuzz.cpp)
void layer_input(const uint8_t* data, size_t size);    // moekit::MoELayer on the reference runner (layer_fuzz.cpp)
void ep_input(const uint8_t* data, size_t size);       // moekit::ep_simulate() (ep_fuzz.cpp)
void tuning_cache_input(const uint8_t* data, size_t size);  // the autotuner's cache file (tuning_cache_fuzz.cpp)

}  // namespace moekit::fuzz

/// The libFuzzer entry point of a target's binary: `MOEKIT_FUZZ_ENTRY(route_input)` in its source, compiled in only
/// when MOEKIT_LIBFUZZER is defined.
#ifdef MOEKIT_LIBFUZZER
#define MOEKIT_FUZZ_ENTRY(target)                                           \
  extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { \
    moekit::fuzz::target(data, size);                                       \
    return 0;                                                               \
  }
#else
#define MOEKIT_FUZZ_ENTRY(target)
#endif

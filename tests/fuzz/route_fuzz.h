// The route() fuzz target (route_fuzz.cpp), for the libFuzzer entry point and the smoke test that drives it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace moekit::fuzz {

/// How the inputs run so far ended: a checked plan, or a rejection by InvalidArgument (a violation aborts).
struct Outcomes {
  int64_t accepted = 0;
  int64_t rejected = 0;
};
Outcomes& route_outcomes();

}  // namespace moekit::fuzz

/// libFuzzer's entry point: decodes one route() call from `data` and checks its outcome.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

// The message a call throws, for the tests that compare error messages word for word.
#pragma once

#include <exception>
#include <string>

#include "moekit/error.h"

namespace moekit::testing {

/// What error_of() returns where the call throws nothing.
inline constexpr const char* kNoThrow = "no throw";

/// The what() of the E (InvalidArgument unless given) that `f` throws; kNoThrow where `f` returns, and "wrong
/// exception type: " followed by the what() of any other std::exception.
template <class E = InvalidArgument, class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("wrong exception type: ") + e.what();
  }
  return kNoThrow;
}

}  // namespace moekit::testing

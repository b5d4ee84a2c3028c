// moekit error hierarchy (DESIGN §8).
// Every error is an exception derived from moekit::Error whose message reads
// "moekit::<op>: <what was wrong>", e.g. "moekit::route: top_k (9) must be <= num_experts (8)".
// One validate() per op is shared by all backends, so CPU and GPU reject the same inputs with the same words.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace moekit {

/// Base of every exception moekit throws. what() is "moekit::<op>: <message>".
class Error : public std::runtime_error {
 public:
  Error(std::string_view op, std::string_view message);
  /// The operation that failed, e.g. "route".
  const std::string& op() const noexcept { return op_; }

 private:
  std::string op_;
};

/// A caller broke a documented precondition (shape, dtype, limit, lifecycle order).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

/// The request is valid but this backend, build or device cannot serve it.
class NotSupported : public Error {
 public:
  using Error::Error;
};

/// A CUDA runtime or library call failed; the message names the call and the CUDA error string.
class CudaError : public Error {
 public:
  using Error::Error;
};

/// A broken internal invariant: a moekit bug. Please report it.
class Internal : public Error {
 public:
  using Error::Error;
};

}  // namespace moekit

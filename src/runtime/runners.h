// Factories of the runners moekit ships, for the registry (internal to the runtime library).
#pragma once

#include <memory>

#include "moekit/layer.h"

namespace moekit::detail {

/// The CPU reference runner: route() into a host RoutePlan, then experts_reference(). Always registered, last.
std::unique_ptr<Runner> make_reference_runner();

/// The bf16 CUDA runner ("cuda_bf16"), registered by register_cuda_runners().
std::unique_ptr<Runner> make_cuda_bf16_runner();

/// Preference of the CUDA runners under "auto" (reference is always tried last).
inline constexpr int kCudaPreference = 100;

}  // namespace moekit::detail

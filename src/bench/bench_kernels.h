// Kernels the harness itself launches (ceilings). Host-only declarations.
#pragma once

#include "moekit/tensor.h"

namespace moekit::bench {

/// Launches an empty kernel (1 block of 32 threads) on `stream`; throws CudaError when the launch fails.
void launch_empty_kernel(Stream stream);

}  // namespace moekit::bench

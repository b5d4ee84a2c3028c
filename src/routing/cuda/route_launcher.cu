// The fused CUDA router's launcher (the kernel lands next; until then CUDA plans are refused clearly).
#include "moekit/error.h"
#include "routing/cuda/route_cuda.h"

namespace moekit::detail {

void route_cuda(const RoutingConfig&, const TensorView&, const TensorView&, RoutePlanView&, Stream,
                const TensorView&) {
  throw NotSupported("route", "the fused CUDA router is not built yet; route on a CPU plan");
}

}  // namespace moekit::detail

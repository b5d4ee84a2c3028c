// Validation shared by every expert-parallel entry point (the NCCL layer and the CPU simulation).
#pragma once

#include "moekit/experts.h"
#include "moekit/routing.h"

namespace moekit::ep {

/// Validates both configs and that routing's E, K and S equal the experts'. Throws InvalidArgument (op "ep" for a
/// disagreement, the config's own op otherwise).
void validate_configs(const ExpertConfig& experts, const RoutingConfig& routing);

}  // namespace moekit::ep

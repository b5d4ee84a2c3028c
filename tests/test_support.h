// Helpers shared by the CPU and GPU tests.
#pragma once

#include "moekit/routing.h"

namespace moekit {

/// A routing config from its fields in declaration order (tests list many; positional keeps case tables short).
inline RoutingConfig routing_config(RoutingMethod method, int num_experts, int top_k, int num_shared_experts = 0,
                                    bool renormalize = false, int n_group = 1, int topk_group = 1,
                                    float routed_scaling_factor = 1.0f) {
  RoutingConfig c;
  c.method = method;
  c.num_experts = num_experts;
  c.top_k = top_k;
  c.num_shared_experts = num_shared_experts;
  c.renormalize = renormalize;
  c.n_group = n_group;
  c.topk_group = topk_group;
  c.routed_scaling_factor = routed_scaling_factor;
  return c;
}

}  // namespace moekit

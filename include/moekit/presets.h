// Named model presets (DESIGN §11): the routing and expert shapes of real MoE models, used by the demo, the
// benchmarks and the tests.
#pragma once

#include <span>
#include <string_view>

#include "moekit/experts.h"
#include "moekit/routing.h"

namespace moekit {

struct Preset {
  std::string_view name;         // e.g. "deepseek-v3"
  std::string_view description;  // model family it stands for
  RoutingConfig routing;
  ExpertConfig experts;
  bool has_bias = false;           // routing uses a selection bias (DeepSeek's correction bias)
  bool has_expert_biases = false;  // b13/b2 present (GPT-OSS)
  int block = 64;                  // default plan block size
};

/// Every preset, in a fixed order.
std::span<const Preset> presets();

/// The preset with this name. Throws InvalidArgument listing the known names.
const Preset& find_preset(std::string_view name);

}  // namespace moekit

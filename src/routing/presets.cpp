// Model presets (DESIGN §11). Shapes follow the models' published configurations; block sizes are the plan block
// the GPU path uses by default for that preset.
#include "moekit/presets.h"

#include <array>
#include <string>

#include "moekit/error.h"

namespace moekit {
namespace {

const std::array<Preset, 7> kPresets{{
    {"mixtral-8x7b", "Mixtral 8x7B: softmax top-2, renormalized",
     make_routing_config(RoutingMethod::softmax_topk, 8, 2, 0, true), make_expert_config(8, 2, 4096, 14336, 0), false,
     false, 128},
    {"qwen3-30b-a3b", "Qwen3-30B-A3B: top-8 of 128 with softmax over the selected",
     make_routing_config(RoutingMethod::topk_softmax, 128, 8, 0, true), make_expert_config(128, 8, 2048, 768, 0),
     false, false, 64},
    {"deepseek-v3", "DeepSeek-V3/R1: sigmoid + bias, 8 groups keep 4, top-8 of 256, scale 2.5, 1 shared expert",
     make_routing_config(RoutingMethod::sigmoid_grouped, 256, 8, 1, true, 8, 4, 2.5f),
     make_expert_config(256, 8, 7168, 2048, 1), true, false, 64},
    {"qwen3-next-80b", "Qwen3-Next-80B-A3B: top-10 of 512 with softmax over the selected",
     make_routing_config(RoutingMethod::topk_softmax, 512, 10, 0, true), make_expert_config(512, 10, 2048, 512, 0),
     false, false, 64},
    {"gpt-oss-120b", "GPT-OSS-120B: top-4 of 128, clamped SwiGLU, interleaved gate/up, expert biases",
     make_routing_config(RoutingMethod::topk_softmax, 128, 4, 0, true),
     make_expert_config(128, 4, 2880, 2880, 0, Activation::swiglu_clamped, GateUpLayout::interleaved), false, true,
     64},
    {"kimi-k2", "Kimi-K2: sigmoid + bias, top-8 of 384 in one group, scale 2.827, 1 shared expert",
     make_routing_config(RoutingMethod::sigmoid_grouped, 384, 8, 1, true, 1, 1, 2.827f),
     make_expert_config(384, 8, 7168, 2048, 1), true, false, 64},
    {"llama4-scout", "Llama-4 Scout: top-1 of 16 with a sigmoid weight on the expert's input, 1 shared expert",
     make_routing_config(RoutingMethod::llama4, 16, 1, 1, false),
     make_expert_config(16, 1, 5120, 8192, 1, Activation::silu_gated, GateUpLayout::gate_first, true), false, false,
     64},
}};

}  // namespace

std::span<const Preset> presets() {
  return kPresets;
}

const Preset& find_preset(std::string_view name) {
  std::string names;
  for (const Preset& p : kPresets) {
    if (p.name == name) return p;
    names += (names.empty() ? "" : ", ") + std::string(p.name);
  }
  throw InvalidArgument("preset", "unknown preset '" + std::string(name) + "' (known: " + names + ")");
}

}  // namespace moekit

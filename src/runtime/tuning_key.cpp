// Token buckets and the tuning cache key (DESIGN §6). Buckets are dense where tactic choice changes fastest (small
// T, where tile shapes and the small-M path compete) and sparse where GEMMs are long and the best tile is stable.
// The key is a readable one-line string so that a persisted cache can be inspected and diffed by eye.
#include <fmt/format.h>

#include <bit>

#include "moekit/error.h"
#include "moekit/layer.h"
#include "moekit/tuner.h"

namespace moekit {
namespace {

int64_t round_up(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}

}  // namespace

int64_t token_bucket(int64_t tokens) {
  if (tokens < 1 || tokens > kMaxTunedTokens)
    throw InvalidArgument("tuner", fmt::format("tokens ({}) must be in [1, {}]", tokens, kMaxTunedTokens));
  const auto next_pow2 = [](int64_t t) { return static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(t))); };
  if (tokens <= 256) return next_pow2(tokens);
  if (tokens <= 2048) return round_up(tokens, 256);
  if (tokens <= 4096) return round_up(tokens, 512);
  return next_pow2(tokens);
}

std::vector<int64_t> token_buckets(int64_t max_tokens) {
  const int64_t last = token_bucket(max_tokens);
  std::vector<int64_t> buckets;
  for (int64_t b = 1;; b = token_bucket(b + 1)) {
    buckets.push_back(b);
    if (b >= last) break;
  }
  return buckets;
}

std::string tuning_key(const Runner& runner, const LayerSpec& spec, int64_t tokens) {
  const ExpertConfig& e = spec.experts;
  const RoutingConfig& r = spec.routing;
  const QuantConfig& q = spec.quant;
  return fmt::format(
      "runner={}@{} E={} local={}@{} K={} S={} H={} I={} act={} gate_up={} bias={}{} routing={} groups={}/{} w={} "
      "a={} blocks={}x{}/{} T={}",
      runner.name(), runner.version(), e.num_experts, e.local_experts(), e.local_expert_offset, e.top_k,
      e.num_shared_experts, e.hidden, e.intermediate, activation_name(e.activation), gate_up_layout_name(e.gate_up),
      spec.expert_biases ? 1 : 0, e.routing_weight_on_input ? " weight_on_input=1" : "",
      routing_method_name(r.method), r.n_group, r.topk_group, weight_format_name(q.weight_format),
      activation_format_name(q.activation_format), q.block_n, q.block_k, q.activation_block, token_bucket(tokens));
}

}  // namespace moekit

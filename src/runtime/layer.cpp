// MoELayer: validates its configs, weights and options, selects and builds a runner, and runs the tactic pair the
// tuner chose for each token bucket. Choices are memoized per bucket and dropped whenever the tuner's cache changes
// (its generation counter), so a steady-state forward() validates its inputs, does one array lookup and calls the
// runner, whose execute() checks the inputs again against its own spec and workspace (a caller may re-check or
// rebuild the runner through runner()).
#include "moekit/layer.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "core/capture.h"
#include "moekit/error.h"

namespace moekit {

struct MoELayer::State {
  LayerSpec spec;
  std::unique_ptr<Runner> runner;
  std::vector<BackendVerdict> verdicts;
  int64_t max_tokens = 0;
  Autotuner* tuner = nullptr;
  std::vector<int64_t> buckets;                   // every bucket up to token_bucket(max_tokens)
  std::vector<std::optional<TacticChoice>> memo;  // per bucket
  uint64_t memo_generation = 0;

  void drop_memo_if_stale() {
    const uint64_t g = tuner->generation();
    if (g == memo_generation) return;
    std::fill(memo.begin(), memo.end(), std::nullopt);
    memo_generation = g;
  }

  // A bucket's tuned winner, else (no entry, or the entry confirmed the default) the runner's default for this T: the
  // heuristic's thresholds need not fall on bucket edges; it is a table lookup, no allocation. Inside a tuning scope
  // an untuned bucket is tuned first, on the scope's logits or else on this call's `logits`: the engine's routing.
  TacticPair pick(int64_t tokens, const TensorView& logits, Stream stream) {
    drop_memo_if_stale();
    const size_t i =
        static_cast<size_t>(std::lower_bound(buckets.begin(), buckets.end(), token_bucket(tokens)) - buckets.begin());
    const TuneOptions* scope = TuningScope::active();
    // A memoized "not tuned" is only final outside a tuning scope: inside one, the bucket gets tuned first.
    if (!memo[i] || (!memo[i]->tuned && scope)) {
      TacticChoice c = tuner->choose(*runner, spec, tokens);
      if (!c.tuned && scope) {
        // Tuning times kernels and synchronizes: inside a graph capture it would break the caller's capture.
        if (runner->device().is_cuda() && detail::stream_is_capturing(stream))
          throw InvalidArgument(
              "layer",
              fmt::format("forward() of {} tokens must not tune inside a CUDA-graph capture: bucket {} has no "
                          "tuned entry and a TuningScope is active; run forward() once before capturing "
                          "(inside the scope: it tunes the bucket), or capture outside the scope",
                          tokens, token_bucket(tokens)));
        const int64_t request[] = {tokens};
        TuneOptions options = *scope;
        if (!options.logits.present()) options.logits = logits;
        tuner->tune(*runner, spec, request, options);
        c = tuner->choose(*runner, spec, tokens);
        drop_memo_if_stale();
      }
      memo[i] = c;
    }
    return memo[i]->per_token ? runner->default_tactics(tokens) : memo[i]->tactics;
  }
};

MoELayer::MoELayer(const ExpertConfig& experts, const RoutingConfig& routing, const QuantConfig& quant,
                   const LayerWeights& weights, const LayerOptions& options)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.spec = LayerSpec{experts, routing, quant, weights.experts.b13.present() || weights.experts.b2.present(),
                     weights.routing_bias.present()};
  s.spec.validate();
  if (options.max_tokens < 1 || options.max_tokens > kMaxTunedTokens)
    throw InvalidArgument("layer",
                          fmt::format("max_tokens ({}) must be in [1, {}]", options.max_tokens, kMaxTunedTokens));
  // The layer runs where its weights live. bf16 weights are checked here, before any backend filtering, so a
  // broken tensor is reported as such rather than as "no backend supports this layer".
  const Device device = weights.experts.w13.device;
  if (quant.weight_format == WeightFormat::bf16) validate_expert_weights(experts, weights.experts, device);
  RunnerSelection selection = select_runner(s.spec, device, options.backends);
  s.runner = std::move(selection.runner);
  s.verdicts = std::move(selection.verdicts);
  s.runner->build(weights, options.max_tokens);
  s.max_tokens = options.max_tokens;
  s.tuner = options.tuner ? options.tuner : &Autotuner::global();
  s.buckets = token_buckets(options.max_tokens);
  s.memo.assign(s.buckets.size(), std::nullopt);
  s.memo_generation = s.tuner->generation();
}

MoELayer::~MoELayer() = default;
MoELayer::MoELayer(MoELayer&&) noexcept = default;
MoELayer& MoELayer::operator=(MoELayer&&) noexcept = default;

MoELayer::State& MoELayer::state() const {
  if (!state_) throw InvalidArgument("layer", "this MoELayer holds no runner (it was moved from)");
  return *state_;
}

void MoELayer::forward(const TensorView& hidden, const TensorView& logits, const TensorView& out, Stream stream,
                       const TensorView& replay) {
  State& s = state();
  const LayerInputs in{hidden, logits, out, replay};
  validate_layer_inputs(s.spec, in, s.max_tokens, s.runner->device());
  const int64_t tokens = hidden.shape[0];
  if (tokens == 0) return;
  s.runner->execute(in, s.pick(tokens, logits, stream), stream);
}

std::vector<TuneResult> MoELayer::tune(std::span<const int64_t> tokens, const TuneOptions& options) {
  State& s = state();
  return s.tuner->tune(*s.runner, s.spec, tokens, options);
}

TacticChoice MoELayer::choice(int64_t tokens) const {
  State& s = state();
  return s.tuner->choose(*s.runner, s.spec, tokens);
}

const LayerSpec& MoELayer::spec() const {
  return state().spec;
}
Runner& MoELayer::runner() {
  return *state().runner;
}
std::string_view MoELayer::backend() const {
  return state().runner->name();
}
const std::vector<BackendVerdict>& MoELayer::verdicts() const {
  return state().verdicts;
}
int64_t MoELayer::max_tokens() const {
  return state().max_tokens;
}

}  // namespace moekit

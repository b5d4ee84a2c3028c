// The unified MoE layer (DESIGN §6): configs that validate themselves, runners with a strict lifecycle
// (check_support -> build -> execute), a registry of runners in preference order, and MoELayer, the one object a
// user holds: it picks the first backend that supports its layer (or explains why none does) and runs the tactic
// pair the autotuner chose for each token bucket.
//
//   MoELayer layer(expert_cfg, routing_cfg, quant_cfg, {.experts = w}, {.backends = {"auto"}, .max_tokens = 4096});
//   layer.forward(hidden, logits, out, stream);
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/experts.h"
#include "moekit/presets.h"
#include "moekit/routing.h"
#include "moekit/tensor.h"
#include "moekit/tuner.h"

namespace moekit {

// ---- quantization -----------------------------------------------------------------------------------------------

/// How expert weights are stored. Only bf16 runs today; the others are valid configurations that every runner
/// rejects with a reason until their kernels land.
enum class WeightFormat : uint8_t {
  bf16,
  fp8_e4m3_block,    // fp8 with [block_n x block_k] fp32 scales (DeepSeek-V3)
  fp8_e4m3_tensor,   // fp8 with one scale per expert tensor (W8A8)
  fp8_e4m3_channel,  // fp8 with one scale per output row (W8A8)
  int4_group,        // 4-bit integers with a scale per group of QuantConfig::block_k along K (weight-only)
  mxfp4,             // OCP MXFP4, 32-element blocks with an e8m0 scale (weight-only)
};
/// How activations enter the GEMMs.
enum class ActivationFormat : uint8_t {
  bf16,
  fp8_e4m3_token_block,  // fp8 with a dynamic scale per token and block of activation_block along K
  fp8_e4m3_tensor,       // fp8 with one dynamic scale per tensor
};

std::string_view weight_format_name(WeightFormat f);              // "bf16", "fp8_e4m3_block", ..., "mxfp4"
WeightFormat parse_weight_format(std::string_view name);          // throws InvalidArgument listing the names
std::string_view activation_format_name(ActivationFormat f);      // "bf16", "fp8_e4m3_token_block", "fp8_e4m3_tensor"
ActivationFormat parse_activation_format(std::string_view name);  // throws InvalidArgument listing the names

struct QuantConfig {
  WeightFormat weight_format = WeightFormat::bf16;
  ActivationFormat activation_format = ActivationFormat::bf16;
  int block_n = 128;           // fp8_e4m3_block: scale block rows
  int block_k = 128;           // fp8_e4m3_block: scale block columns; int4_group: group size
  int activation_block = 128;  // fp8_e4m3_token_block: elements per activation scale

  /// Throws InvalidArgument (op "quant") for unknown formats, block sizes that are not powers of 2 in 16..1024,
  /// fp8 activations without an fp8 weight format, or a weight-only format (int4_group, mxfp4) with non-bf16
  /// activations.
  void validate() const;
};

/// Everything about a layer except its tensors: what runners judge support on and what the tuner keys on.
struct LayerSpec {
  ExpertConfig experts;
  RoutingConfig routing;
  QuantConfig quant;
  bool expert_biases = false;  // b13/b2 present
  bool routing_bias = false;   // a selection bias [E] is present

  /// Validates the three configs and that they agree: routing num_experts, top_k and num_shared_experts must equal
  /// the expert config's. Throws InvalidArgument (op of the failing config, "layer" for a disagreement).
  void validate() const;
};

/// The layer of a preset: its routing and expert configs, bf16, and the biases it has. Not validated.
LayerSpec preset_layer_spec(const Preset& preset);

/// A layer's tensors. The caller owns them and keeps them alive as long as the layer (runners may keep views).
struct LayerWeights {
  ExpertWeights experts;    // w13 [E', 2I, H], w2 [E', H, I] bf16; optional b13 [E', 2I], b2 [E', H]
  TensorView routing_bias;  // optional [E] fp32/bf16, selection only
};

/// One forward call's tensors, on the layer's device.
struct LayerInputs {
  TensorView hidden;  // [T, H] bf16, contiguous
  TensorView logits;  // [T, E] fp32/bf16, unit stride in E
  TensorView out;     // [T, H] bf16, contiguous (written); hidden itself or no byte of it
  TensorView replay;  // optional [R, K] int16, R >= T (routing replay); no byte of logits, hidden or out
};

/// Checks one forward call against `spec` on `device` for a layer built for `max_tokens`: shapes, dtypes,
/// contiguity, device, T <= max_tokens, out either hidden itself or sharing no byte with it (validate_route_args for
/// logits and replay). Throws InvalidArgument.
void validate_layer_inputs(const LayerSpec& spec, const LayerInputs& in, int64_t max_tokens, Device device);

// ---- runners ------------------------------------------------------------------------------------------------------

/// Whether a runner can serve a layer, and if not, why (one clause, e.g. "moekit was built without CUDA").
struct Support {
  bool ok = false;
  std::string reason;
  /// A runner that serves the layer.
  static Support yes() { return {true, {}}; }
  /// A runner that does not, with the clause that says why.
  static Support no(std::string why) { return {false, std::move(why)}; }
};

/// One implementation of the whole layer (routing + experts). The public non-virtual members enforce the lifecycle
///   check_support(spec, device) -> build(weights, max_tokens) -> execute(inputs, tactics, stream)
/// for every runner; steps out of order throw errors naming the runner and the missing step, e.g.
///   "moekit::layer: runner 'reference': execute() called before build()".
/// A runner serves one layer at a time; it is not thread-safe.
class Runner {
 public:
  virtual ~Runner() = default;

  /// Registry name, e.g. "reference", "cuda_bf16".
  virtual std::string_view name() const = 0;
  /// Changes whenever the runner's tactics or their behaviour change; part of every tuning key.
  virtual std::string_view version() const = 0;

  /// Validates `spec` (contract errors throw InvalidArgument), then asks the runner. Remembers the spec and device;
  /// every call undoes a previous build (the workspace belonged to the previous spec). Does not allocate device
  /// memory.
  Support check_support(const LayerSpec& spec, Device device);

  /// Prepares to run: re-lays out `weights` if the runner needs to and allocates workspace for up to `max_tokens`
  /// tokens (validate_expert_weights for bf16 layers). Idempotent: a second call with the same weights and
  /// max_tokens does nothing. Allocates. Throws InvalidArgument before a successful check_support() (NotSupported
  /// after a failed one) or for bad weights / max_tokens < 1.
  void build(const LayerWeights& weights, int64_t max_tokens);

  /// Builds with weights the runner generates itself (deterministic from `seed`, owned by the runner), for tuning
  /// and benchmarks without a checkpoint: expert weights scaled like trained ones and, for a spec with a selection
  /// bias, a bias uniform in [-0.01, 0.01), small enough that every expert still gets rows. Same lifecycle rules as
  /// build().
  void build_synthetic(int64_t max_tokens, uint64_t seed = 1);

  /// Runs the layer on `inputs` with `tactics` on `stream` (no allocation on CUDA runners; capturable in a graph).
  /// T = 0 does nothing. Throws InvalidArgument before build(), for bad inputs (validate_layer_inputs) or tactic
  /// indices out of range.
  void execute(const LayerInputs& inputs, const TacticPair& tactics, Stream stream = nullptr);

  /// Seconds one end-to-end run with `tactics` takes on `tokens` tokens of the runner's own synthetic inputs
  /// (the tuner's timing callback). Requires build(); 1 <= tokens <= max_tokens(). Synchronizes the device.
  double time_tactics(const TacticPair& tactics, int64_t tokens);

  /// Seconds per run of every entry of `order`, timed in that order on `tokens` tokens of the same inputs as
  /// time_tactics() (the tuner's stages: a comparison wants its timings next to each other). A runner may prepare
  /// every distinct pair first and then time the entries back to back, so that the device does not idle between
  /// them and a change of its clocks falls on neighbouring entries alike (cuda_bf16 does); the base times each entry
  /// with time_tactics()'s callback in turn. Requires build(); 1 <= tokens <= max_tokens(); every pair in range.
  /// An empty order times nothing. `on_timed`, where set, is called once per entry as its timing is known (the
  /// tuner's progress). Synchronizes the device.
  std::vector<double> time_schedule(std::span<const TacticPair> order, int64_t tokens,
                                    const std::function<void()>& on_timed = {});

  /// Makes time_tactics() and time_schedule() route rows of `logits` instead of the runner's synthetic logits, so
  /// that tuning sees the routing an engine's layer gets (skewed experts, hot experts); an absent view ({}) goes back
  /// to the synthetic logits. `logits`: [N, E] fp32 or bf16 with unit stride in E, N >= 1, on the runner's device
  /// (validated as route()'s logits). The runner copies min(N, max_tokens()) rows into its own timing inputs,
  /// repeated to fill max_tokens() rows (row r is row r mod N), keeping the dtype, so the caller may free `logits`
  /// afterwards; a timing at T tokens routes T consecutive rows of that copy. Synchronizes the device. Requires
  /// build(); a later build() goes back to the synthetic logits. Autotuner::tune() calls it for TuneOptions::logits.
  void set_timing_logits(const TensorView& logits);

  /// The deterministic pair used when the tuner has no entry for T's bucket, or when the entry's winner is this pair
  /// at the T the bucket was timed at; asked for T itself (the tuner asks it for the T it times). Allocation-free:
  /// MoELayer::forward() calls it per call on such buckets. Requires a successful check_support().
  TacticPair default_tactics(int64_t tokens) const;

  /// The runner's GEMM1 / GEMM2 tactics for the checked spec (non-empty after a successful check_support()).
  virtual std::span<const Tactic> gemm1_tactics() const = 0;
  virtual std::span<const Tactic> gemm2_tactics() const = 0;

  /// Whether the last check_support() succeeded, and whether build() has run since.
  bool supported() const { return supported_; }
  bool built() const { return built_; }
  /// The spec and device of the last successful check_support() (default values before).
  const LayerSpec& spec() const { return spec_; }
  Device device() const { return device_; }
  /// max_tokens of the last build (0 before).
  int64_t max_tokens() const { return max_tokens_; }

 protected:
  /// Support for an already validated spec. Must not throw for a merely unsupported layer: say why instead.
  virtual Support do_check_support(const LayerSpec& spec, Device device) = 0;
  /// Build for the checked spec; weights are already validated for bf16 layers.
  virtual void do_build(const LayerWeights& weights, int64_t max_tokens) = 0;
  /// Allocate and fill owned synthetic weights for the checked spec and return views of them.
  virtual LayerWeights make_synthetic_weights(uint64_t seed) = 0;
  /// Execute with validated inputs (T >= 1) and in-range tactics.
  virtual void do_execute(const LayerInputs& inputs, const TacticPair& tactics, Stream stream) = 0;
  /// Time one run on synthetic inputs (see time_tactics); tactics in range, 1 <= tokens <= max_tokens().
  virtual double do_time_tactics(const TacticPair& tactics, int64_t tokens) = 0;
  /// Time every entry of a non-empty, validated order, calling on_timed (if set) once per entry as its timing is
  /// known (see time_schedule); the base calls do_time_tactics() for each entry in turn.
  virtual std::vector<double> do_time_schedule(std::span<const TacticPair> order, int64_t tokens,
                                               const std::function<void()>& on_timed);
  /// Route later timings on a copy of `logits` (validated, N >= 1, on the device), or on the synthetic logits when
  /// it is absent (see set_timing_logits).
  virtual void do_set_timing_logits(const TensorView& logits) = 0;
  /// Default heuristic; the base picks the first tactic of each list.
  virtual TacticPair do_default_tactics(int64_t tokens) const;

 private:
  [[noreturn]] void fail_step(std::string_view step, std::string_view missing) const;
  void check_timing_args(std::string_view what, const TacticPair& tactics, int64_t tokens) const;
  void require_built(std::string_view step) const;

  LayerSpec spec_{};
  Device device_{};
  bool checked_ = false;    // check_support() has run
  bool supported_ = false;  // ... and said yes
  std::string reason_;      // ... or why not
  bool built_ = false;
  int64_t max_tokens_ = 0;
  LayerWeights built_weights_{};
};

// ---- registry -----------------------------------------------------------------------------------------------------

/// Makes a new, unchecked runner (what make_runner() calls for a registered name).
using RunnerFactory = std::function<std::unique_ptr<Runner>()>;

struct RunnerInfo {
  std::string name;    // what backends lists and the registry use
  int preference = 0;  // "auto" tries higher first; equal preferences keep registration order
  RunnerFactory make;
};

/// Adds a runner (or replaces the one with the same name, so registering twice is harmless). Thread-safe.
/// Throws InvalidArgument for an empty name, the reserved names "auto" and "reference", or an empty factory.
void register_runner(RunnerInfo info);

/// Removes a registered runner; returns whether it was registered. "reference" cannot be removed (InvalidArgument).
bool unregister_runner(std::string_view name);

/// Registered names in "auto" order (preference descending). "reference" is always registered, last.
std::vector<std::string> registered_runners();

/// A new, unchecked instance of the named runner. Throws InvalidArgument listing the registered names.
std::unique_ptr<Runner> make_runner(std::string_view name);

/// Registers the CUDA runner "cuda_bf16" (the fused GPU router and the sm90 bf16 experts), preferred over
/// "reference". An explicit call, never a static initializer. In a build without CUDA or without an sm90 GPU it still
/// registers, and answers check_support() with ok = false and the reason ("moekit was built without CUDA", ...).
void register_cuda_runners();

/// One backend's verdict during selection.
struct BackendVerdict {
  std::string name;
  Support support;
};

struct RunnerSelection {
  std::unique_ptr<Runner> runner;        // checked and supported, not built
  std::vector<BackendVerdict> verdicts;  // every backend tried, in order (the chosen one last)
};

/// Expands `backends` ("auto" = every registered runner in preference order; duplicates tried once) and returns the
/// first runner whose check_support(spec, device) is ok. Throws InvalidArgument for an invalid spec, an empty list
/// or an unknown name, and NotSupported when no backend fits, listing every backend with its reason:
///   "moekit::layer: no backend supports this layer on cpu: cuda_bf16: moekit was built without CUDA;
///    reference: weight_format (fp8_e4m3_block) is not supported (bf16 only)"   (one line)
RunnerSelection select_runner(const LayerSpec& spec, Device device, std::span<const std::string> backends);

// ---- the layer ----------------------------------------------------------------------------------------------------

/// How MoELayer picks and sizes its runner.
struct LayerOptions {
  std::vector<std::string> backends{"auto"};  // runner names tried in order, "auto" = every one (select_runner)
  // Required, 1..kMaxTunedTokens: the largest T forward() accepts (workspace is sized for it).
  int64_t max_tokens = 0;
  Autotuner* tuner = nullptr;  // nullptr = Autotuner::global(); must outlive the layer
};

/// One MoE layer on one device. Not thread-safe: one forward() at a time per layer (layers are independent). On a
/// GPU every call reuses the layer's workspace (its route plan and intermediate rows): calls enqueued on different
/// streams must be ordered by the caller (an event), or they overwrite each other's intermediates; a layer per
/// stream avoids that.
class MoELayer {
 public:
  /// Validates the configs (errors propagate: InvalidArgument naming the field), the weights (bf16 layers), the
  /// routing bias and the options; selects a runner (select_runner) on the weights' device and builds it.
  /// Allocates the runner's workspace. Throws InvalidArgument or NotSupported as select_runner() and build() do.
  MoELayer(const ExpertConfig& experts, const RoutingConfig& routing, const QuantConfig& quant,
           const LayerWeights& weights, const LayerOptions& options);
  ~MoELayer();
  /// A moved-from layer holds nothing: its members but destruction and assignment throw InvalidArgument.
  MoELayer(MoELayer&&) noexcept;
  MoELayer& operator=(MoELayer&&) noexcept;

  /// out [T, H] bf16 = the MoE layer applied to hidden [T, H] bf16 routed by logits [T, E] (+ the layer's bias),
  /// T <= max_tokens; optional replay [R, K] int16 receives the routed ids. Runs the tuner's choice: the cached
  /// winner of T's bucket, else (no entry, or a winner that is the default where the bucket was timed) the runner's
  /// default heuristic for T; inside a TuningScope a bucket without an entry is tuned first (on the scope's logits,
  /// else on this call's). `out` may be `hidden` itself (in place: each row of hidden is read before that row of
  /// out is written); an out that overlaps hidden otherwise is rejected.
  /// The first call per bucket looks the choice up (host allocation); later calls reuse it until the tuner changes.
  /// Throws InvalidArgument for bad inputs, and where it would tune on a stream that is capturing a CUDA graph
  /// (tuning synchronizes; tune before capturing).
  void forward(const TensorView& hidden, const TensorView& logits, const TensorView& out, Stream stream = nullptr,
               const TensorView& replay = {});

  /// Explicitly tunes this layer's runner for `tokens` (see Autotuner::tune) on its tuner.
  std::vector<TuneResult> tune(std::span<const int64_t> tokens, const TuneOptions& options = {});

  /// The tactic pair forward() would run for `tokens`.
  TacticChoice choice(int64_t tokens) const;

  /// The spec the layer was built for, the runner that executes it and that runner's registry name.
  const LayerSpec& spec() const;
  Runner& runner();
  std::string_view backend() const;
  /// The verdict of every backend tried at construction (the chosen one last).
  const std::vector<BackendVerdict>& verdicts() const;
  /// The largest T a forward() accepts.
  int64_t max_tokens() const;

 private:
  struct State;
  State& state() const;  // throws InvalidArgument for a moved-from layer
  std::unique_ptr<State> state_;
};

}  // namespace moekit

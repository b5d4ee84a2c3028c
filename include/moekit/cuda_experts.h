// bf16 expert compute on an sm90 GPU (DESIGN §5): route plan + hidden [T, H] -> out [T, H].
// Pipeline per call, all on the caller's stream, no allocation and no host synchronization (CUDA-graph capturable):
//   grouped path: gather of hidden rows into plan order, beside which one CTA fills the problem shapes + pointer
//                 arrays on the device from the plan -> GEMM1 (CUTLASS sm90 ptr-array grouped GEMM, TMA + wgmma) ->
//                 bias + gated activation -> GEMM2 (grouped) -> deterministic fp32 combine; with interleaved gate/up
//                 rows, GEMM1 on the cooperative 128x256, pingpong 64x256 and swapped 32x128 tactics applies
//                 bias + activation in its epilogue and writes only the I act columns, and so does GEMM1 on the
//                 pingpong 64x256 and swapped 32x128 tactics with gate-first or up-first rows when I is a multiple
//                 of 128;
//   decode path:  a memory-bound kernel streaming the weights of each plan block with 16-byte loads (GEMM1 with
//                 bias + activation fused, then GEMM2), then the same combine.
// With ExpertConfig::routing_weight_on_input (Llama-4) the gather scales each routed row by its slot's weight (on
// the decode path too, which then reads the gathered rows instead of hidden) and the combine adds those rows'
// outputs unweighted.
// GEMM1 and GEMM2 each pick a kernel from cuda_expert_gemm_tactics(); a deterministic heuristic picks by default.
// The tactic table, the heuristic and tactic_gpu_of() are host code in every build, with or without CUDA.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/bench.h"
#include "moekit/device.h"
#include "moekit/experts.h"
#include "moekit/plan.h"
#include "moekit/tensor.h"

namespace moekit {

/// How one expert GEMM runs.
enum class GemmKernelKind : uint8_t {
  grouped,  // CUTLASS sm90 ptr-array grouped GEMM, device-side group sizes
  gemv,     // memory-bound decode kernel: each CTA streams one expert's weight rows for <= 8 rows at a time
};

/// One entry of the tactic table shared by GEMM1 and GEMM2.
struct GemmTacticInfo {
  std::string_view name;  // e.g. "sm90_cooperative_128x128x64"
  GemmKernelKind kind;
  // CTA tile of a grouped GEMM in plan rows x output columns x K; gemv: most rows per pass, weight rows per CTA
  // (twice as many when a weight row has at most 512 elements), 0
  int tile_m, tile_n, tile_k;
  // A grouped GEMM that computes out^T = W x^T (the weights on the MMA's M side, the rows on its narrow N side), so
  // that a few rows per expert do not fill a 64-row tile with padding
  bool swap_ab = false;
};

/// The tactics that exist, in a fixed order; indices into this table are ExpertTactic's values.
std::span<const GemmTacticInfo> cuda_expert_gemm_tactics();

/// Whether GEMM1 on tactic `gemm1` applies b13 and the gated activation itself for `config`'s w13 (the decode GEMV
/// always; a grouped tile where it has a fused gated epilogue for that gate/up arrangement: interleaved w13 on the
/// cooperative 128x256, pingpong 64x256 and swapped 32x128 tiles, gate-first / up-first w13 with I a multiple of 128
/// on the pingpong 64x256 and swapped 32x128 tiles); otherwise GEMM1 writes [rows, 2I] and a separate pass applies
/// them. Needs no device. Throws NotSupported naming the valid indices when `gemm1` is not one.
bool cuda_expert_gemm1_fuses_activation(const ExpertConfig& config, int gemm1);

/// Kernel choice for one call: indices into cuda_expert_gemm_tactics() for GEMM1 and GEMM2; -1 lets the
/// heuristic choose that GEMM.
struct ExpertTactic {
  int gemm1 = -1;
  int gemm2 = -1;
  friend bool operator==(const ExpertTactic&, const ExpertTactic&) = default;
};

/// The GPU whose measured rules the default heuristic applies. The rules were fitted on an H200 (peak DRAM 4.92 TB/s,
/// 37 GB/s per SM); where paired runs on an H100 SXM (3.35 TB/s, 25 GB/s per SM) favoured other tiles (the
/// cooperative 128x256 tile, which reads fewer bytes per FLOP, on large experts; swapped 96x256 tiles on many large
/// experts at 70-191 rows per expert, which hold up to 96 rows in one row tile and, with two, read the weights from
/// DRAM fewer times than 64x256 tiles), rules for h100 come first.
enum class TacticGpu : uint8_t {
  h200,  // the rules fitted on an H200; every GPU with at least kLeanDramPerSm of DRAM bandwidth per SM
  h100,  // the H100 SXM's rules first, then the H200's; GPUs with less
};

/// Peak DRAM bytes per second per SM below which a GPU takes TacticGpu::h100: between the H100 SXM's 25.4 GB/s and
/// the H200's 37.3 GB/s (an H100 NVL or a GH200 with HBM3, 29-30 GB/s, falls on the H100 side; neither measured).
inline constexpr double kLeanDramPerSm = 31e9;

/// The rules for the device `info` describes: h100 where peak_dram_bytes_per_s(info) / info.sm_count is below
/// kLeanDramPerSm, h200 otherwise, and where the memory clock, bus width or SM count is unknown (0).
TacticGpu tactic_gpu_of(const DeviceInfo& info);

/// "h200" or "h100".
std::string_view tactic_gpu_name(TacticGpu gpu);

/// The tactic the default heuristic picks for `config` at T tokens on a `gpu`: a table keyed on the GPU's rules, the
/// expected rows per active expert, T, the size of one expert's GEMM1 weights, the number of routed experts, the
/// routed rows per expert (T * top_k / num_experts), the number of shared experts and w13's gate/up arrangement (some
/// bands of rows per expert pick other tiles for interleaved w13 than for gate-first / up-first w13, whose fused
/// gated epilogue exists on fewer tiles). `moekit tactics --preset NAME [--gate-up LAYOUT] [--gpu h100]` prints the
/// picks. Deterministic, needs no device (the tuner asks before anything is built); every field >= 0.
ExpertTactic cuda_expert_default_tactic(const ExpertConfig& config, int64_t tokens, TacticGpu gpu);

struct CudaExpertsArgs {
  ExpertConfig config;
  ExpertWeights weights;   // on `device`; kept alive by the caller for the object's lifetime
  int64_t max_tokens = 0;  // largest T of any later run(); workspace is sized for it
  int block = 64;          // B of the plans run() will receive (the plan's padded segments)
  Device device = Device::cuda(0);
};

/// The bf16 expert layer on one sm90 GPU. Construction validates and allocates; run() only launches kernels. Every
/// run() uses the same workspace: runs on different streams must be ordered by the caller (an event).
class CudaExperts {
 public:
  /// Validates config and weights (validate_expert_weights, op "experts"), the 16-byte alignment of w13 and w2 (TMA
  /// and vector loads need it) and the 4-byte alignment of b13 and b2, max_tokens >= 1 and the block (1..256); then
  /// allocates all workspace for max_tokens with cudaMalloc and initializes the grouped-GEMM state.
  /// Throws InvalidArgument, NotSupported (no CUDA build, no sm90 device at args.device), CudaError.
  explicit CudaExperts(const CudaExpertsArgs& args);
  ~CudaExperts();
  /// A moved-from object owns nothing: its members but destruction and assignment throw InvalidArgument.
  CudaExperts(CudaExperts&&) noexcept;
  CudaExperts& operator=(CudaExperts&&) noexcept;
  CudaExperts(const CudaExperts&) = delete;
  CudaExperts& operator=(const CudaExperts&) = delete;

  /// out [T, H] bf16 = experts(hidden [T, H] bf16) for the plan's T = plan.view().tokens tokens.
  /// Preconditions (checked, InvalidArgument): plan on this device with E, K and S of the config and B of
  /// CudaExpertsArgs::block; T <= max_tokens;
  /// hidden and out contiguous bf16 on this device, 16-byte aligned, with T rows of H, out either hidden itself (in
  /// place: the kernels read hidden before they write out) or sharing no byte with it. Tactic indices must exist
  /// (NotSupported lists those that do). Enqueues kernels on `stream` (a cudaStream_t); no allocation, no host
  /// synchronization, capturable in a CUDA graph; the plan is read on the device when the kernels run, so a
  /// graph replay picks up new routing. Throws CudaError when a launch fails.
  void run(const RoutePlan& plan, const TensorView& hidden, const TensorView& out, Stream stream = nullptr,
           ExpertTactic tactic = {}) const;

  /// cuda_expert_default_tactic(config(), tokens, tactic_gpu()).
  ExpertTactic default_tactic(int64_t tokens) const;
  /// tactic_gpu_of(device_info()) of the object's device, taken at construction.
  TacticGpu tactic_gpu() const;

  /// The config the object was built for.
  const ExpertConfig& config() const;
  /// The largest T a run() accepts (the workspace is sized for it).
  int64_t max_tokens() const;
  /// Device bytes owned by this object (intermediate buffers, problem arrays, GEMM workspace).
  int64_t workspace_bytes() const;

 private:
  struct Impl;
  const Impl& impl() const;  // throws InvalidArgument for a moved-from object
  std::unique_ptr<Impl> impl_;
};

// ---- benchmark (`moekit bench moe`; defined in the moekit_bench library) ------------------------------------------

/// The scale of every synthetic selection bias (presets with one: deepseek-v3, kimi-k2): `bench moe`'s default
/// (MoeBenchOptions::bias_scale), `bench ep`'s, and the runners' synthetic weights that the tuner times on
/// (Runner::build_synthetic()), so that all of them route alike.
inline constexpr float kSyntheticBiasScale = 0.01f;

struct MoeBenchOptions {
  std::string preset;           // a name from presets()
  std::vector<int64_t> tokens;  // T values to time
  int samples = 100;            // cold-L2 kernel-time samples and graph replays per measurement (medians)
  int64_t verify_tokens = 64;   // each tactic pair is verified at min(T, verify_tokens) tokens before timing (>= 1)
  uint64_t seed = 1;            // weights, hidden states and logits are hash-generated from it
  ExpertTactic tactic{};        // -1 fields: the layer's default heuristic
  // Presets with a selection bias (deepseek-v3, kimi-k2): the bias is uniform in [-bias_scale, bias_scale), the
  // logits in [-2, 2). The default 0.01 moves selections (so verification covers the bias) and still sends rows to
  // every expert, as a trained load-balancing bias does (a NumPy model of deepseek-v3's routing at T = 1024: all
  // 256 experts, the busiest about twice the mean); 0.5, the setting of the numbers recorded before 2026-11-30,
  // outweighs the sigmoid keys (45-89 of 256 experts get rows). Finite, >= 0.
  float bias_scale = kSyntheticBiasScale;
  // Routing skew: each expert's logit gets a fixed offset uniform in [-logit_skew, logit_skew) (the same for every
  // token, on top of logits uniform in [-2, 2)), so that some experts draw more rows than others, as a trained
  // router's do on a real batch. 0, the default, makes every routed expert equally likely. MoeBenchRow's
  // max_expert_rows shows the skew it gives. Finite, >= 0.
  float logit_skew = 0.0f;
  // w13's gate/up arrangement instead of the preset's (the weights are synthetic either way): what an engine gets
  // that rearranges a checkpoint's w13 at load time, e.g. interleaved rows for GEMM1's fused gated epilogue.
  std::optional<GateUpLayout> gate_up;
  // Also time a reference in the same run: cuBLAS strided-batched GEMM1 and GEMM2 over as many experts' weights as
  // the call has active experts, each with the call's routed rows split evenly (rounded up). It has none of the
  // layer's work around the GEMMs (routing skew, gather, activation, combine), so it shows what the vendor's batched
  // GEMM reaches on the same weights and row count (MoeBenchRow::cublas_*).
  bool cublas_baseline = false;
  // Also measure the GEMM ceiling sustained: the cuBLAS GEMM back to back for this many seconds first, then timed
  // as the burst ceiling is (MoeBenchCeilings::gemm_sustained_tflop_per_s). Long graph replays at large T hold the
  // GPU at its power limit, a lower clock than the burst ceiling's; the sustained rate is that state's ceiling.
  // 0, the default: not measured. Finite, in [0, 60].
  double sustained_ceiling_s = 0;
};

/// Ceilings measured in the same run: device copy bandwidth (bytes read + written, from the harness), cuBLAS bf16
/// GEMM rate (8192^3, fp32 accumulation), and the per-kernel cost of an empty kernel replayed in a CUDA graph. The
/// floors use gemm_tflop_per_s; gemm_sustained_tflop_per_s is the same GEMM's rate after
/// MoeBenchOptions::sustained_ceiling_s seconds of it back to back (0 when not measured).
struct MoeBenchCeilings {
  double copy_tb_per_s = 0, gemm_tflop_per_s = 0, graph_launch_us = 0;
  double gemm_sustained_tflop_per_s = 0, sustained_s = 0;
};

struct MoeBenchRow {
  int64_t tokens = 0;
  std::string gemm1, gemm2;       // tactic names
  int active_experts = 0;         // local groups with at least one row
  double mean_expert_rows = 0;    // rows per local routed expert with rows (shared experts, which hold T, left out)
  int64_t max_expert_rows = 0;    // the busiest local routed expert's rows
  int kernels = 0;                // kernels one experts call launches
  double bytes = 0, flops = 0;    // fewest bytes (active weights once, hidden in, out) and the GEMM flops
  double floor_us = 0;            // max(bytes / copy bandwidth, flops / GEMM rate)
  double floor_sustained_us = 0;  // the same with the sustained GEMM rate (0 when not measured)
  double experts_cold_us = 0, experts_graph_us = 0;              // medians: cold-L2 kernel time / graph replay
  double route_experts_cold_us = 0, route_experts_graph_us = 0;  // router + experts
  double verify_error = 0;  // relative Frobenius error against experts_reference at min(T, verify_tokens) tokens
  // The same for 4 tokens (first to last) of the timed call at T itself; verify_error where T <= verify_tokens (that
  // run is the timed call, whole).
  double sampled_verify_error = 0;
  std::vector<bench::KernelStat> experts_kernels;        // the experts-only call's kernels in launch order (cold L2)
  std::vector<bench::KernelStat> route_experts_kernels;  // the same for router + experts (the router first)
  // MoeBenchOptions::cublas_baseline (else 0 / empty): the rows per expert of the even split, the cold-L2 kernel
  // time (median) of the two batched GEMMs and their kernels in launch order.
  int64_t cublas_rows_per_expert = 0;
  double cublas_cold_us = 0;
  std::vector<bench::KernelStat> cublas_kernels;
};

struct MoeBenchReport {
  std::string preset, device, timing_source;  // timing_source: "cupti", or "events (...)" with the reason
  std::optional<float> bias_scale;  // MoeBenchOptions::bias_scale for presets with a selection bias, else none
  float logit_skew = 0.0f;          // MoeBenchOptions::logit_skew
  GateUpLayout gate_up = GateUpLayout::gate_first;  // the arrangement timed (the preset's or the override)
  MoeBenchCeilings ceilings;
  std::vector<MoeBenchRow> rows;
};

/// Checks `options` without touching a device: a known preset, a non-empty token list of T >= 1, samples >= 1, a
/// finite bias_scale >= 0 and a finite logit_skew >= 0. Throws InvalidArgument naming the bad field. bench_moe()
/// calls it first; a caller can call it before setting up a device, so a bad argument is reported as such.
void check_moe_bench_options(const MoeBenchOptions& options);

/// Builds the preset's layer with random weights on the harness's device, routes random logits with the GPU router,
/// verifies every tactic pair it will time against experts_reference (relative Frobenius error <= 1e-2, else
/// Internal), then times experts-only and route + experts: cold-L2 kernel time (harness.kernel_time) and
/// CUDA-graph replay (harness.graph_time). Allocates freely (it is a benchmark). Throws InvalidArgument (unknown
/// preset, bad token list, samples or bias scale), NotSupported (no CUDA build or no sm90 GPU), CudaError, Internal.
MoeBenchReport bench_moe(bench::Harness& harness, const MoeBenchOptions& options);

}  // namespace moekit

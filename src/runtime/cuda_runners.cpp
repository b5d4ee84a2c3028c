// register_cuda_runners() and the bf16 CUDA runner "cuda_bf16": the fused GPU router (route() on a CUDA RoutePlan)
// followed by the grouped-GEMM experts (CudaExperts), both sized at build time for max_tokens and enqueued on the
// caller's stream with no allocation and no synchronization, so a forward() can be captured in a CUDA graph.
// Its GEMM1 and GEMM2 tactics are the rows of cuda_expert_gemm_tactics(), in table order. Timing for the tuner
// replays CUDA graphs of whole layer calls on the runner's own synthetic inputs (or a caller's logits,
// set_timing_logits()) and takes the median of event-timed samples. In a build without CUDA the runner only
// declines, saying why.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "moekit/device.h"
#include "moekit/error.h"
#include "moekit/layer.h"
#include "runtime/runners.h"

#if MOEKIT_HAS_CUDA
#include <cuda_runtime_api.h>

#include "core/device_scope.h"
#include "moekit/cuda_experts.h"
#include "moekit/plan.h"
#include "runtime/cuda_fill.h"
#include "runtime/synthetic.h"
#endif

namespace moekit::detail {
namespace {

// The cuda_bf16 runner's version (part of every tuning key): bumped when its tactic table or heuristic changes, so
// that a cache tuned without a tactic is not reused, or when what it times changes. 2: the swapped-operand grouped
// GEMM. 3: synthetic selection bias of scale kSyntheticBiasScale instead of 0.5 (deepseek-v3, kimi-k2).
// 4: the H100's swapped 96x256 tiles at 70-90 rows on more than 64 large experts (a cache tuned before may hold the
// old default pair as its pick there). 5: those bands reshaped (kimi-k2's 384 experts at 70-191 rows, GEMM1 on
// 64x256 for deepseek-v3 at 70-80 rows). 6: deepseek-v3's band of swapped 96x256 for both GEMMs on the H100 up to
// 128 rows (was 90). 7: gpt-oss-sized experts' GEMM1 on swapped 96x256 at 97-117 rows on the H100.
constexpr std::string_view kCudaBf16Version = "7";

// Why a CUDA runner cannot serve `device` in this build, or "" when the device is usable.
std::string cuda_unavailable_reason(Device device) {
  if (!built_with_cuda()) return "moekit was built without CUDA";
  if (!device.is_cuda()) return fmt::format("runs on CUDA devices only (device {})", device_name(device));
  const int count = cuda_device_count();
  if (device.index < 0 || device.index >= count)
    return fmt::format("device {} is not visible ({} CUDA device(s))", device_name(device), count);
  if (!device_is_sm90(device.index)) {
    const DeviceInfo info = device_info(device.index);
    return fmt::format("device {} is {} (sm_{}{}), not sm_90", device_name(device), info.name, info.cc_major,
                       info.cc_minor);
  }
  return {};
}

Support check_cuda_bf16(const LayerSpec& spec, Device device) {
  if (std::string why = cuda_unavailable_reason(device); !why.empty()) return Support::no(why);
  if (spec.quant.weight_format != WeightFormat::bf16)
    return Support::no(
        fmt::format("weight_format ({}) is not supported (bf16 only)", weight_format_name(spec.quant.weight_format)));
  if (spec.quant.activation_format != ActivationFormat::bf16)
    return Support::no(fmt::format("activation_format ({}) is not supported (bf16 only)",
                                   activation_format_name(spec.quant.activation_format)));
  return Support::yes();
}

#if MOEKIT_HAS_CUDA

void cuda_check(cudaError_t err, std::string_view call) {
  if (err != cudaSuccess) detail::check_cuda(err, "layer", fmt::format("runner 'cuda_bf16': {}", call));
}

// Makes the runner's device current for a scope and restores the caller's.
struct DeviceScope : detail::CurrentDeviceScope {
  explicit DeviceScope(int index) : CurrentDeviceScope(index, "layer") {}
};

// Plan block B by layer shape: with few experts every expert gets many rows and 128-row padding costs little;
// with many experts rows are spread thin and 64 keeps the padding (and wasted GEMM rows) down. Matches the block of
// every preset (moekit/presets.h).
struct BlockRule {
  int max_experts;
  int block;
};
constexpr std::array<BlockRule, 2> kBlockRules{{{8, 128}, {INT_MAX, 64}}};

int plan_block(const ExpertConfig& e) {
  for (const BlockRule& r : kBlockRules)
    if (e.num_experts <= r.max_experts) return r.block;
  return kBlockRules.back().block;
}

// The runner's tactics: one per row of cuda_expert_gemm_tactics(), same order, for both GEMMs.
const std::vector<Tactic>& expert_tactics() {
  static const std::vector<Tactic> tactics = [] {
    std::vector<Tactic> out;
    for (const GemmTacticInfo& t : cuda_expert_gemm_tactics()) {
      std::string what =
          t.kind == GemmKernelKind::grouped
              ? fmt::format("CUTLASS sm90 grouped GEMM, {}x{}x{} CTA tile (rows x columns x K){}", t.tile_m, t.tile_n,
                            t.tile_k, t.swap_ab ? ", operands swapped: out^T = W x^T" : "")
              : fmt::format(
                    "memory-bound decode GEMV, up to {} rows per pass, {} weight rows per CTA ({} for rows of <= "
                    "512)",
                    t.tile_m, t.tile_n, 2 * t.tile_n);
      out.push_back({std::string(t.name), std::move(what)});
    }
    return out;
  }();
  return tactics;
}

// Timing: each sample is a graph replay of `inner` layer calls bracketed by events, sized to span about
// kSampleSeconds so event resolution (~0.5 us) and replay launch stay small against it.
constexpr double kSampleSeconds = 200e-6;
constexpr int kMaxInnerCalls = 32;
constexpr int kSamples = 9;      // median of 9 for runs under kLongRunSeconds
constexpr int kLongSamples = 3;  // ... and of 3 above (a bad tactic at large T can take 100+ ms)
constexpr double kLongRunSeconds = 5e-3;
// A configuration whose first timed call is this many times slower than the best one already timed at the same
// token count cannot win; it is reported with that single measurement instead of a median.
constexpr double kHopelessFactor = 3.0;

class CudaBf16Runner final : public Runner {
 public:
  ~CudaBf16Runner() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (start_ != nullptr) cudaEventDestroy(start_);
    if (stop_ != nullptr) cudaEventDestroy(stop_);
  }

  std::string_view name() const override { return "cuda_bf16"; }
  std::string_view version() const override { return kCudaBf16Version; }
  std::span<const Tactic> gemm1_tactics() const override { return expert_tactics(); }
  std::span<const Tactic> gemm2_tactics() const override { return expert_tactics(); }

 protected:
  Support do_check_support(const LayerSpec& spec, Device device) override {
    release_build();  // a new check undoes the build: its workspace and weights belonged to the previous spec
    synthetic_.clear();
    Support s = check_cuda_bf16(spec, device);
    if (s.ok) tactic_gpu_ = tactic_gpu_of(device_info(device.index));
    return s;
  }

  void do_build(const LayerWeights& weights, int64_t max_tokens) override {
    DeviceScope scope(device().index);
    release_build();  // free the old workspace before allocating the new one
    const ExpertConfig& e = spec().experts;
    block_ = plan_block(e);
    plan_.emplace(PlanShape{max_tokens, e.num_experts, e.top_k, e.num_shared_experts, block_}, device());
    experts_.emplace(CudaExpertsArgs{e, weights.experts, max_tokens, block_, device()});
    routing_bias_ = weights.routing_bias;
  }

  LayerWeights make_synthetic_weights(uint64_t seed) override {
    DeviceScope scope(device().index);
    release_build();  // the old experts may still point at the old synthetic weights
    synthetic_.clear();
    const ExpertConfig& e = spec().experts;
    const int64_t ew = e.weight_experts(), h = e.hidden, i = e.intermediate;
    // Same streams, scales and layout as the reference runner's synthetic weights (runtime/synthetic.h).
    auto make = [&](DType dt, std::initializer_list<int64_t> shape, uint64_t stream_seed, float scale) {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      synthetic_.emplace_back(static_cast<size_t>(n) * dtype_size(dt), device().index);
      fill_uniform_device(synthetic_.back().data(), n, dt == DType::bf16, stream_seed, scale, nullptr);
      return TensorView::contiguous(synthetic_.back().data(), dt, shape, device());
    };
    LayerWeights w;
    w.experts.w13 = make(DType::bf16, {ew, 2 * i, h}, seed, 1.0f / std::sqrt(static_cast<float>(h)));
    w.experts.w2 = make(DType::bf16, {ew, h, i}, seed + 1, 1.0f / std::sqrt(static_cast<float>(i)));
    if (spec().expert_biases) {
      w.experts.b13 = make(DType::f32, {ew, 2 * i}, seed + 2, 0.1f);
      w.experts.b2 = make(DType::f32, {ew, h}, seed + 3, 0.1f);
    }
    if (spec().routing_bias) {
      const SyntheticStream bias = synthetic_routing_bias(seed);
      w.routing_bias = make(DType::f32, {e.num_experts}, bias.seed, bias.scale);
    }
    cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize after the synthetic fills");
    return w;
  }

  void do_execute(const LayerInputs& in, const TacticPair& tactics, Stream stream) override {
    // The experts read and write whole rows with 16-byte accesses (TMA, vector loads). CudaExperts::run checks
    // this too, but only after route() has written the plan and the caller's replay rows: a call the experts
    // would refuse fails here, before anything is written.
    for (const auto& [view, name] : {std::pair{&in.hidden, "hidden"}, std::pair{&in.out, "out"}})
      if (!view->starts_aligned(16))
        throw InvalidArgument("layer", fmt::format("{}.data ({:#x}) must be 16-byte aligned (runner 'cuda_bf16')",
                                                   name, reinterpret_cast<uintptr_t>(view->data)));
    DeviceScope scope(device().index);
    route(spec().routing, in.logits, routing_bias_, *plan_, stream, in.replay);
    experts_->run(*plan_, in.hidden, in.out, stream, ExpertTactic{tactics.gemm1, tactics.gemm2});
  }

  // One pair is a schedule of one entry: the same warm-up, hopeless check, samples and median.
  double do_time_tactics(const TacticPair& tactics, int64_t tokens) override {
    return do_time_schedule(std::span<const TacticPair>(&tactics, 1), tokens, {})[0];
  }

  // Every distinct pair is captured, warmed up and timed once first (a pair whose first timing is over
  // kHopelessFactor times the fastest seen is reported with that timing); then every entry's samples are enqueued
  // back to back, an event between any two, and read after one synchronization: the GPU runs the whole schedule
  // without the idle gaps that capturing each pair between timings would leave, so its clocks change alike for
  // neighbouring entries.
  std::vector<double> do_time_schedule(std::span<const TacticPair> order, int64_t tokens,
                                       const std::function<void()>& on_timed) override {
    DeviceScope scope(device().index);
    ensure_timing_inputs();
    struct Prepared {
      TacticPair pair;
      std::unique_ptr<GraphExec> one, many;
      double first = 0;
      int inner = 1, samples = 0;  // samples 0: hopeless, reported with `first`
    };
    std::vector<Prepared> prepared;
    std::vector<size_t> entry_of(order.size());
    for (size_t i = 0; i < order.size(); ++i) {
      auto it = std::find_if(prepared.begin(), prepared.end(), [&](const Prepared& p) { return p.pair == order[i]; });
      if (it == prepared.end()) {
        Prepared p{order[i], std::make_unique<GraphExec>(capture(order[i], tokens, 1)), nullptr};
        p.one->launch(stream_);
        cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
        p.first = timed_replays(*p.one, 1);
        prepared.push_back(std::move(p));
        it = prepared.end() - 1;
      }
      entry_of[i] = static_cast<size_t>(it - prepared.begin());
    }
    double& best = best_seen_[tokens];
    for (const Prepared& p : prepared)
      if (best == 0 || p.first < best) best = p.first;
    for (Prepared& p : prepared) {
      if (p.first > kHopelessFactor * best) continue;
      p.inner = static_cast<int>(std::clamp(std::ceil(kSampleSeconds / p.first), 1.0, double(kMaxInnerCalls)));
      if (p.inner > 1) {
        p.many = std::make_unique<GraphExec>(capture(p.pair, tokens, p.inner));
        cuda_check(cudaGraphUpload(p.many->exec, stream_), "cudaGraphUpload");
      }
      p.samples = p.first > kLongRunSeconds ? kLongSamples : kSamples;
    }
    size_t replays = 0;
    for (size_t e : entry_of) replays += prepared[e].samples;
    EventList events(replays + 1);
    size_t k = 0;
    cuda_check(cudaEventRecord(events[k++], stream_), "cudaEventRecord");
    for (size_t e : entry_of) {
      const Prepared& p = prepared[e];
      for (int s = 0; s < p.samples; ++s) {
        (p.many ? *p.many : *p.one).launch(stream_);
        cuda_check(cudaEventRecord(events[k++], stream_), "cudaEventRecord");
      }
    }
    cuda_check(cudaEventSynchronize(events[k - 1]), "cudaEventSynchronize");
    std::vector<double> seconds;
    k = 0;
    for (size_t e : entry_of) {
      const Prepared& p = prepared[e];
      if (p.samples == 0) {
        seconds.push_back(p.first);
      } else {
        std::vector<double> samples;
        for (int s = 0; s < p.samples; ++s, ++k) {
          float ms = 0;
          cuda_check(cudaEventElapsedTime(&ms, events[k], events[k + 1]), "cudaEventElapsedTime");
          samples.push_back(ms * 1e-3 / p.inner);
        }
        std::sort(samples.begin(), samples.end());
        seconds.push_back(samples[samples.size() / 2]);
        best = std::min(best, seconds.back());
      }
      if (on_timed) on_timed();
    }
    return seconds;
  }

  // The caller's rows (or the synthetic logits again) in timing_[1], keeping their dtype.
  void do_set_timing_logits(const TensorView& logits) override {
    DeviceScope scope(device().index);
    ensure_timing_inputs();
    best_seen_.clear();  // medians on other routing bound nothing on the new one
    const int64_t cap = max_tokens(), e = spec().routing.num_experts;
    // The copies run on stream_, which does not wait for the caller's streams: let the caller's writes land first.
    cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize before copying the timing logits");
    if (logits.present()) {
      const size_t elem = dtype_size(logits.dtype);
      cycle_rows_device(timing_[1].data(), cap, logits.data, std::min(logits.shape[0], cap), e * elem,
                        logits.stride(0) * elem, stream_);
      timing_logits_dtype_ = logits.dtype;
    } else {
      fill_synthetic_timing_logits();
    }
    cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize after copying the timing logits");
  }

  TacticPair do_default_tactics(int64_t tokens) const override {
    const ExpertTactic t = cuda_expert_default_tactic(spec().experts, tokens, tactic_gpu_);
    return {t.gemm1, t.gemm2};
  }

 private:
  // Owns an instantiated graph.
  struct GraphExec {
    cudaGraphExec_t exec = nullptr;
    explicit GraphExec(cudaGraphExec_t e) : exec(e) {}
    ~GraphExec() {
      if (exec != nullptr) cudaGraphExecDestroy(exec);
    }
    GraphExec(const GraphExec&) = delete;
    GraphExec& operator=(const GraphExec&) = delete;
    void launch(cudaStream_t s) const { cuda_check(cudaGraphLaunch(exec, s), "cudaGraphLaunch"); }
  };

  // Owns `n` timing events.
  struct EventList {
    std::vector<cudaEvent_t> events;
    explicit EventList(size_t n) : events(n, nullptr) {
      try {
        for (cudaEvent_t& e : events) cuda_check(cudaEventCreate(&e), "cudaEventCreate");
      } catch (...) {
        release();
        throw;
      }
    }
    ~EventList() { release(); }
    void release() {
      for (cudaEvent_t e : events)
        if (e != nullptr) cudaEventDestroy(e);
      events.clear();
    }
    EventList(const EventList&) = delete;
    EventList& operator=(const EventList&) = delete;
    cudaEvent_t operator[](size_t i) const { return events[i]; }
  };

  void release_build() {
    experts_.reset();
    plan_.reset();
    routing_bias_ = {};
    timing_.clear();
    timing_logits_dtype_ = DType::f32;
    best_seen_.clear();
  }

  // Hidden states, logits and outputs for max_tokens tokens (kTimingHidden and kTimingLogits, as in the reference
  // runner; the logits buffer also holds a caller's bf16 rows, see do_set_timing_logits), plus the stream and events
  // timing uses. Allocated on the first timing after a build.
  void ensure_timing_inputs() {
    if (stream_ == nullptr) {
      cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
      cuda_check(cudaEventCreate(&start_), "cudaEventCreate");
      cuda_check(cudaEventCreate(&stop_), "cudaEventCreate");
    }
    if (!timing_.empty()) return;
    const int64_t cap = max_tokens(), h = spec().experts.hidden, e = spec().routing.num_experts;
    timing_.emplace_back(static_cast<size_t>(cap * h * 2), device().index);  // hidden
    timing_.emplace_back(static_cast<size_t>(cap * e * 4), device().index);  // logits
    timing_.emplace_back(static_cast<size_t>(cap * h * 2), device().index);  // out
    fill_uniform_device(timing_[0].data(), cap * h, true, kTimingHidden.seed, kTimingHidden.scale, stream_);
    fill_synthetic_timing_logits();
    cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

  // timing_[1] = the synthetic logits (fp32), enqueued on stream_.
  void fill_synthetic_timing_logits() {
    fill_uniform_device(timing_[1].data(), max_tokens() * spec().routing.num_experts, false, kTimingLogits.seed,
                        kTimingLogits.scale, stream_);
    timing_logits_dtype_ = DType::f32;
  }

  // Captures `calls` layer calls on `tokens` tokens. Call j reads the token window starting at row
  // j * tokens mod (max_tokens - tokens + 1), so small-T timings route different tokens to different experts
  // instead of re-reading one L2-resident set of weights.
  cudaGraphExec_t capture(const TacticPair& tactics, int64_t tokens, int calls) {
    const int64_t h = spec().experts.hidden, e = spec().routing.num_experts;
    const int64_t windows = max_tokens() - tokens + 1;
    cuda_check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    try {
      for (int j = 0; j < calls; ++j) {
        const int64_t row = (j * tokens) % windows;
        LayerInputs in;
        in.hidden = TensorView::contiguous(static_cast<char*>(timing_[0].data()) + row * h * 2, DType::bf16,
                                           {tokens, h}, device());
        in.logits = TensorView::contiguous(
            static_cast<char*>(timing_[1].data()) + row * e * static_cast<int64_t>(dtype_size(timing_logits_dtype_)),
            timing_logits_dtype_, {tokens, e}, device());
        in.out = TensorView::contiguous(static_cast<char*>(timing_[2].data()) + row * h * 2, DType::bf16, {tokens, h},
                                        device());
        do_execute(in, tactics, stream_);
      }
    } catch (...) {
      cudaGraph_t broken = nullptr;
      cudaStreamEndCapture(stream_, &broken);
      if (broken != nullptr) cudaGraphDestroy(broken);
      throw;
    }
    cudaGraph_t graph = nullptr;
    cuda_check(cudaStreamEndCapture(stream_, &graph), "cudaStreamEndCapture");
    cudaGraphExec_t exec = nullptr;
    const cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    cuda_check(err, "cudaGraphInstantiate");
    return exec;
  }

  // Seconds of `replays` back-to-back launches of g, between two events.
  double timed_replays(const GraphExec& g, int replays) {
    cuda_check(cudaEventRecord(start_, stream_), "cudaEventRecord");
    for (int r = 0; r < replays; ++r) g.launch(stream_);
    cuda_check(cudaEventRecord(stop_, stream_), "cudaEventRecord");
    cuda_check(cudaEventSynchronize(stop_), "cudaEventSynchronize");
    float ms = 0;
    cuda_check(cudaEventElapsedTime(&ms, start_, stop_), "cudaEventElapsedTime");
    return ms * 1e-3 / replays;
  }

  int block_ = 64;
  TacticGpu tactic_gpu_ = TacticGpu::h200;  // the default heuristic's rules for the checked device
  std::optional<RoutePlan> plan_;
  std::optional<CudaExperts> experts_;
  TensorView routing_bias_{};
  std::vector<DeviceBuffer> synthetic_;     // build_synthetic() weights
  std::vector<DeviceBuffer> timing_;        // hidden [max_tokens, H] bf16, logits [max_tokens, E], out
  DType timing_logits_dtype_ = DType::f32;  // timing_[1]'s: fp32 synthetic, or a caller's fp32 / bf16 rows
  std::map<int64_t, double> best_seen_;     // fastest median per token count since the last build
  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

#else  // !MOEKIT_HAS_CUDA

const std::array<Tactic, 1> kNoTactics{{{"none", "moekit was built without CUDA"}}};

// Without CUDA the runner declines every layer, so every path past check_support() is unreachable.
class CudaBf16Runner final : public Runner {
 public:
  std::string_view name() const override { return "cuda_bf16"; }
  std::string_view version() const override { return kCudaBf16Version; }
  std::span<const Tactic> gemm1_tactics() const override { return kNoTactics; }
  std::span<const Tactic> gemm2_tactics() const override { return kNoTactics; }

 protected:
  Support do_check_support(const LayerSpec& spec, Device device) override { return check_cuda_bf16(spec, device); }
  void do_build(const LayerWeights&, int64_t) override { unreachable("build()"); }
  LayerWeights make_synthetic_weights(uint64_t) override { unreachable("build_synthetic()"); }
  void do_execute(const LayerInputs&, const TacticPair&, Stream) override { unreachable("execute()"); }
  double do_time_tactics(const TacticPair&, int64_t) override { unreachable("time_tactics()"); }
  void do_set_timing_logits(const TensorView&) override { unreachable("set_timing_logits()"); }

 private:
  [[noreturn]] static void unreachable(std::string_view step) {
    throw Internal("layer", fmt::format("runner 'cuda_bf16': {} reached in a build without CUDA", step));
  }
};

#endif  // MOEKIT_HAS_CUDA

}  // namespace

std::unique_ptr<Runner> make_cuda_bf16_runner() {
  return std::make_unique<CudaBf16Runner>();
}

}  // namespace moekit::detail

namespace moekit {

void register_cuda_runners() {
  register_runner({"cuda_bf16", detail::kCudaPreference, detail::make_cuda_bf16_runner});
}

}  // namespace moekit

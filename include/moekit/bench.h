// Benchmark harness (DESIGN §11), reused by every `moekit bench` command: verify first, then time.
//   - kernel time: the GPU's own start/end of every kernel one call launches (CUPTI activity records), summed per
//     call (overlapping kernels counted once), with the L2 flushed (a buffer of 2x the L2 is written) before each
//     sample and inputs rotated; kernel_breakdown() gives each kernel of the call by position, its median and its
//     start after its predecessor;
//   - graph time: back-to-back CUDA-graph replays of the call, timed with events (warm, launch gaps included);
//   - ceilings measured in the same run: device copy bandwidth and the empty-kernel costs.
// Statistics are medians with p10/p90 over >= 100 samples. Host-only header; in a build without CUDA every entry
// that needs a GPU throws NotSupported.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/dtype.h"
#include "moekit/routing.h"
#include "moekit/tensor.h"

namespace moekit::bench {

struct TimingOptions {
  int samples = 100;       // timed samples (>= 1); medians want >= 100
  int warmup = 5;          // untimed calls first
  int graph_calls = 20;    // calls captured in one graph
  int graph_replays = 50;  // timed replays of that graph
  bool flush_l2 = true;    // write 2x L2 before each kernel-time sample
};

struct Stats {
  double median_us = 0, p10_us = 0, p90_us = 0, min_us = 0;
  int samples = 0;
};

/// Median / p10 / p90 / min of `us` (nearest-rank). Empty input gives zeros.
Stats summarize(std::vector<double> us);

/// One kernel of one timed call, GPU timestamps in ns.
struct KernelSpan {
  std::string name;  // as the profiler reports it (mangled)
  uint64_t start_ns = 0, end_ns = 0;
};

/// The k-th kernel of a call across samples: its duration and how long after the previous kernel's end it
/// started (negative when a programmatically dependent launch overlapped its predecessor; 0 for the first).
struct KernelStat {
  std::string name;  // short: namespaces, template arguments and parameters removed
  Stats duration;
  double start_gap_us = 0;  // median
};

/// One GPU activity record of a timed run (CUPTI): a kernel, or a memset with its size and byte value.
struct ActivityRecord {
  uint64_t start_ns = 0, end_ns = 0;
  bool kernel = false;
  std::string name;    // kernels: as the profiler reports it
  uint64_t bytes = 0;  // memsets
  uint32_t value = 0;
};

/// Splits `records` (sorted by start) into the samples of Harness::kernel_time: sample i opens with a memset of
/// `marker_bytes` bytes to the value i & 0xff (the L2 flush or the marker), and everything after it up to the next
/// such memset is the call's, kernels by name and the call's own memsets as "memset (N bytes)". Records before the
/// first marker are left out.
std::vector<std::vector<KernelSpan>> split_samples(const std::vector<ActivityRecord>& records, uint64_t marker_bytes);

/// Microseconds during which at least one of `spans` (sorted by start) runs: the sum of their lengths when they
/// run one after another, without double counting where a programmatically dependent launch overlaps.
double busy_us(const std::vector<KernelSpan>& spans);

/// Per-position statistics of the kernels of `samples` (each a call's kernels, sorted by start). Only samples with
/// the most kernels seen take part, so positions line up. Empty input gives an empty result.
std::vector<KernelStat> kernel_breakdown(const std::vector<std::vector<KernelSpan>>& samples);

/// "ns::kernel<T, 3>(Params)" -> "kernel"; a mangled name is demangled first (where the demangler fails, its leading
/// nested name gives the function: "_ZN7cutlass13device_kernelI..." -> "device_kernel"); unparsable names come
/// back as given.
std::string short_kernel_name(const std::string& name);

/// Machine ceilings, measured on the current device.
struct Ceilings {
  std::string device;  // e.g. "NVIDIA H200"
  int sm_count = 0;
  int64_t l2_bytes = 0;
  double copy_bytes_per_s = 0;       // large device-to-device copy, bytes read + written per second
  double empty_kernel_us = 0;        // CUPTI duration of an empty kernel (median)
  double empty_graph_launch_us = 0;  // per empty kernel, replayed in a CUDA graph of many
};

/// One call of the code under test: launches its kernels on `stream` with input variant `variant`.
using LaunchFn = std::function<void(int variant, Stream stream)>;

/// Owns a stream, the L2-flush buffer and the CUPTI subscription. Construct once per process (CUPTI activity
/// tracing is process-wide); not thread-safe. Allocates at construction only.
class Harness {
 public:
  /// Throws NotSupported without CUDA or without a device, CudaError when setup fails.
  Harness();
  ~Harness();
  Harness(const Harness&) = delete;
  Harness& operator=(const Harness&) = delete;

  /// The harness's own stream, on which every measurement runs.
  Stream stream() const;

  /// Measures the ceilings (about a second of device time).
  Ceilings measure_ceilings();

  /// Cold-L2 kernel time of `fn`: per sample, sum of the durations of the kernels it launched, cycling through
  /// `variants` inputs. Also records how many kernels one call launched (kernels_per_call()).
  Stats kernel_time(const LaunchFn& fn, int variants, const TimingOptions& opt);

  /// Per-call time of `fn` captured graph_calls times (rotating variants) into one graph, over graph_replays
  /// event-timed replays.
  Stats graph_time(const LaunchFn& fn, int variants, const TimingOptions& opt);

  /// Kernels launched by one call in the last kernel_time() (the most seen in a sample).
  int kernels_per_call() const;

  /// Per-kernel breakdown of the last kernel_time() (empty when it fell back to events).
  const std::vector<KernelStat>& kernel_breakdown() const;

  /// "cupti", or "events (...why...)" when CUPTI delivered no usable kernel records and events were used.
  std::string kernel_time_source() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ---- The router benchmark -------------------------------------------------------------------------------------

/// One router benchmark case.
struct RouteCase {
  std::string fixture;  // "seed6", "dsv3" or "custom"
  RoutingConfig cfg;
  int64_t tokens = 1;
  int block = 16;            // the plan's block size B
  DType dtype = DType::f32;  // the logits' dtype
  bool bias = false;         // whether a selection bias [E] is passed
};

/// The router fixtures of DESIGN §11: "seed6" (E=512 softmax_topk) or "dsv3" (DeepSeek-V3 sigmoid_grouped).
/// Throws InvalidArgument naming the valid fixtures.
std::vector<RouteCase> route_fixtures(std::string_view name);

struct RouteBenchOptions {
  TimingOptions timing;
  bool verify_only = false;  // check against the CPU reference, time nothing
  uint64_t seed = 1;
  int variants = 4;       // input sets rotated through
  std::vector<int> ctas;  // grid sizes to time (0 = the router's own choice); empty = {0}
  int pairs = 0;          // two tokens per warp: 0 = the router's choice, -1 = never, 1 = wherever it can
  bool phases = false;    // also time the kernel's phases (cold L2, in-kernel timestamps; RouteResult::phases)
  /// Every call through the router's general kernel instance (no decode or token-mask instance): an A/B against
  /// those instances in one process.
  bool general_instance = false;
};

/// Where one router call spends its time, from timestamps the kernel takes (%globaltimer) when asked to; medians
/// over cold-L2 samples. `cta0_us[i]` is CTA 0's time from phase boundary i to i + 1: setup (bias, histogram
/// zeroing), routing its tokens, counting, totals and earlier-CTA bases (the grid barrier when there is one),
/// offsets, scatter, padding. `last_us[i]` is the same for the CTA that ends last in each sample (the one the
/// kernel's end waits for; CTA 0 reads no earlier CTA's counts, the last CTAs of a grid read the most), and
/// `last_cta` the median of its index (rounded down). `span_us` runs from the first CTA's start to the last CTA's
/// end; `skew_us` is the spread of the CTAs' starts.
struct RoutePhases {
  std::vector<double> cta0_us;
  std::vector<double> last_us;
  int last_cta = 0;
  double span_us = 0, skew_us = 0;
  double sm_clock_ghz = 0;  // SM clock during the samples: CTA 0's clock64 cycles per %globaltimer ns
  int samples = 0;
};

/// Phase times from the router's timestamps: `trace` holds `samples` slices of `words_per_sample` uint64, each laid
/// out [cta][point][%globaltimer ns, clock64] for `ctas` CTAs and `points` phase boundaries. The phases of CTA 0 and
/// of the CTA that ends last (latest %globaltimer at the last point; the lowest index among equals) come from
/// clock64, converted with the clock measured over the samples (median of CTA 0's cycles per ns from its first to
/// its last point); span and skew from %globaltimer; medians over the samples. Throws InvalidArgument when
/// the sizes do not fit together.
RoutePhases route_phases_from_trace(const std::vector<uint64_t>& trace, int samples, int64_t words_per_sample,
                                    int ctas, int points);

struct RouteResult {
  RouteCase c;
  int ctas_requested = 0, ctas = 0;  // asked (0 = heuristic) and used
  bool tiny_plan = false;            // the plan was built in one step (one CTA, T * Kt <= 32)
  bool pairs = false;                // a warp routed two tokens at once
  bool token_masks = false;          // the token-mask instance ran (one token per warp, not a decode call)
  bool verified = false;
  std::string mismatch;  // first difference from the reference, empty when verified
  Stats kernel, graph;
  int kernels_per_call = 0;
  std::string timing_source;  // "cupti", or "events (...)" when CUPTI gave no records
  double logits_bytes = 0;
  double floor_us = 0;  // logits bytes / copy bandwidth
  double goal_us = 0;   // 4 for T <= 1024, 20 above (DESIGN §11)
  RoutePhases phases;   // when RouteBenchOptions::phases
};

/// Verifies every case on every requested grid size against the CPU reference (ids, whole plan and replay exactly;
/// weights within 1e-6 relative, 4e-6 for softmax_topk without renormalization, whose reference sums E terms in
/// fp32 sequentially), then times it unless verify_only. `ceilings` must come from the same harness. Throws
/// NotSupported without CUDA.
std::vector<RouteResult> bench_route(Harness& harness, const std::vector<RouteCase>& cases,
                                     const RouteBenchOptions& opt, const Ceilings& ceilings);

/// Markdown table of the results (a ceilings line first).
std::string route_markdown(const std::vector<RouteResult>& results, const Ceilings& ceilings);

/// JSON document of the results and ceilings.
std::string route_json(const std::vector<RouteResult>& results, const Ceilings& ceilings);

}  // namespace moekit::bench

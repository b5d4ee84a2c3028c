// Timing harness: CUPTI activity records give each kernel's GPU start/end; every sample is delimited on the GPU by
// the memset that opens it (the L2 flush of 2x its size, or a small marker), so kernels are summed per sample
// whatever their number (the union of their intervals: overlapping dependent launches count once). Graph time replays
// a captured graph of several calls and divides. Ceilings: a 1 GiB device copy (bytes read + written), an empty
// kernel. The same records, taken by position within the call, give each kernel's median and start gap.
#include <cxxabi.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <mutex>

#include "moekit/bench.h"
#include "moekit/error.h"

#if MOEKIT_HAS_CUDA
#include <cuda_runtime.h>
#include <cupti.h>

#include "bench_kernels.h"
#endif

namespace moekit::bench {

Stats summarize(std::vector<double> us) {
  Stats s;
  if (us.empty()) return s;
  std::sort(us.begin(), us.end());
  auto rank = [&](double q) { return us[std::min(us.size() - 1, static_cast<size_t>(q * (us.size() - 1) + 0.5))]; };
  s.median_us = rank(0.5);
  s.p10_us = rank(0.1);
  s.p90_us = rank(0.9);
  s.min_us = us.front();
  s.samples = static_cast<int>(us.size());
  return s;
}

namespace {

// The function's own name from a mangled name's leading <length><identifier> run ("_ZN7cutlass13device_kernelI..."
// -> "device_kernel"), for names the demangler rejects (some CUTLASS kernels' are); empty when there is none.
std::string mangled_function_name(const std::string& name) {
  size_t i = name.rfind("_ZN", 0) == 0 ? 3 : 2;
  std::string last;
  while (i < name.size() && name[i] >= '0' && name[i] <= '9') {
    size_t len = 0;
    while (i < name.size() && name[i] >= '0' && name[i] <= '9') len = len * 10 + static_cast<size_t>(name[i++] - '0');
    if (len == 0 || i + len > name.size()) return {};
    last = name.substr(i, len);
    i += len;
  }
  return last;
}

}  // namespace

std::string short_kernel_name(const std::string& name) {
  std::string full = name;
  if (name.rfind("_Z", 0) == 0) {
    int status = 0;
    char* d = abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status);
    const bool ok = status == 0 && d != nullptr;
    if (ok) full = d;
    std::free(d);
    if (!ok) {
      const std::string f = mangled_function_name(name);
      return f.empty() ? name : f;
    }
  }
  // Drop everything inside <...> and (...) (template arguments, parameters, "(anonymous namespace)"), then keep
  // the last identifier: what follows the last "::" or space.
  std::string flat;
  int depth = 0;
  for (const char c : full) {
    if (c == '<' || c == '(') {
      ++depth;
    } else if (c == '>' || c == ')') {
      if (depth == 0) return name;  // unbalanced: not a name this function understands
      --depth;
    } else if (depth == 0) {
      flat += c;
    }
  }
  if (depth != 0) return name;
  while (!flat.empty() && flat.back() == ' ') flat.pop_back();
  const size_t colon = flat.rfind("::"), space = flat.rfind(' ');
  size_t from = 0;
  if (colon != std::string::npos) from = colon + 2;
  if (space != std::string::npos) from = std::max(from, space + 1);
  std::string shortened = flat.substr(from);
  return shortened.empty() ? name : shortened;
}

std::vector<std::vector<KernelSpan>> split_samples(const std::vector<ActivityRecord>& records,
                                                   uint64_t marker_bytes) {
  std::vector<std::vector<KernelSpan>> samples;
  for (const ActivityRecord& r : records) {
    if (!r.kernel && r.bytes == marker_bytes && r.value == (samples.size() & 0xff))
      samples.emplace_back();
    else if (!samples.empty())
      samples.back().push_back(
          {r.kernel ? r.name : "memset (" + std::to_string(r.bytes) + " bytes)", r.start_ns, r.end_ns});
  }
  return samples;
}

double busy_us(const std::vector<KernelSpan>& spans) {
  double us = 0;
  uint64_t covered_to = 0;
  for (const KernelSpan& k : spans) {
    const uint64_t from = std::max(k.start_ns, covered_to);
    if (k.end_ns > from) us += static_cast<double>(k.end_ns - from) / 1000.0;
    covered_to = std::max(covered_to, k.end_ns);
  }
  return us;
}

std::vector<KernelStat> kernel_breakdown(const std::vector<std::vector<KernelSpan>>& samples) {
  size_t most = 0;
  for (const auto& s : samples) most = std::max(most, s.size());
  std::vector<KernelStat> out(most);
  std::vector<std::vector<double>> durations(most), gaps(most);
  for (const auto& s : samples) {
    if (s.size() != most) continue;
    for (size_t k = 0; k < most; ++k) {
      durations[k].push_back(static_cast<double>(s[k].end_ns - s[k].start_ns) / 1000.0);
      if (k > 0)
        gaps[k].push_back((static_cast<double>(s[k].start_ns) - static_cast<double>(s[k - 1].end_ns)) / 1000.0);
    }
  }
  const auto named = std::find_if(samples.begin(), samples.end(), [&](const auto& s) { return s.size() == most; });
  for (size_t k = 0; k < most; ++k) {
    out[k].name = short_kernel_name((*named)[k].name);
    out[k].duration = summarize(durations[k]);
    out[k].start_gap_us = k > 0 ? summarize(gaps[k]).median_us : 0.0;
  }
  return out;
}

#if MOEKIT_HAS_CUDA
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw CudaError("bench", std::string(what) + " failed: " + cudaGetErrorString(e));
}
void check_cupti(CUptiResult r, const char* what) {
  if (r != CUPTI_SUCCESS) {
    const char* msg = nullptr;
    cuptiGetResultString(r, &msg);
    throw CudaError("bench", std::string(what) + " failed: " + (msg ? msg : "CUPTI error"));
  }
}

// CUPTI delivers records through C callbacks: collect kernel and memset intervals (GPU timestamps) here.
struct Records {
  std::mutex mu;
  std::vector<ActivityRecord> items;
};
Records& records() {
  static Records r;
  return r;
}

constexpr size_t kCuptiBuffer = 8 << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(aligned_alloc(8, kCuptiBuffer));
  *size = kCuptiBuffer;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  Records& r = records();
  std::lock_guard<std::mutex> lock(r.mu);
  CUpti_Activity* rec = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || rec->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
      r.items.push_back({k->start, k->end, true, k->name != nullptr ? k->name : "?", 0, 0});
    } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(rec);
      r.items.push_back({m->start, m->end, false, {}, m->bytes, m->value});
    }
  }
  free(buffer);
}

}  // namespace

// Bytes of the memset that opens a sample when the L2 is not flushed.
constexpr size_t kMarkerBytes = 256;

struct Harness::Impl {
  cudaStream_t stream = nullptr;
  void* flush = nullptr;
  size_t flush_bytes = 0;
  int kernels_per_call = 0;
  std::vector<KernelStat> breakdown;  // of the last kernel_time()
  void* marker = nullptr;             // kMarkerBytes: a memset marks each sample's start when the L2 is not flushed
  std::string source = "cupti";
  bool cupti = false;  // kernel tracing on; off when another CUPTI client (a profiler) holds the callbacks
};

Harness::Harness() : impl_(std::make_unique<Impl>()) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    throw NotSupported("bench", "a CUDA device (none found) is needed to time kernels");
  }
  check(cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking), "cudaStreamCreate");
  int l2 = 0, dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev), "cudaDeviceGetAttribute(L2)");
  impl_->flush_bytes = std::max<size_t>(2 * static_cast<size_t>(l2), 64 << 20);
  check(cudaMalloc(&impl_->flush, impl_->flush_bytes), "cudaMalloc(L2 flush buffer)");
  check(cudaMalloc(&impl_->marker, kMarkerBytes), "cudaMalloc(sample marker)");
  // Under a profiler (Nsight Compute or Systems) CUPTI has a subscriber already: time with events then.
  const CUptiResult reg = cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
  if (reg == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED) {
    impl_->source = "events (CUPTI is held by another tool)";
    return;
  }
  check_cupti(reg, "cuptiActivityRegisterCallbacks");
  check_cupti(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable(kernel)");
  check_cupti(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET), "cuptiActivityEnable(memset)");
  impl_->cupti = true;
}

Harness::~Harness() {
  if (impl_->cupti) {
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    cuptiActivityDisable(CUPTI_ACTIVITY_KIND_MEMSET);
  }
  cudaFree(impl_->flush);
  cudaFree(impl_->marker);
  cudaStreamDestroy(impl_->stream);
}

Stream Harness::stream() const {
  return impl_->stream;
}
int Harness::kernels_per_call() const {
  return impl_->kernels_per_call;
}
const std::vector<KernelStat>& Harness::kernel_breakdown() const {
  return impl_->breakdown;
}
std::string Harness::kernel_time_source() const {
  return impl_->source;
}

// Samples are told apart by the memset that opens each one (the L2 flush, or a 256-byte marker; sample i sets the
// bytes to i & 0xff): on one stream the GPU runs everything in order, so the work between two such memsets belongs
// to one call. A memset of the call itself (e.g. a library zeroing its workspace) counts as part of the call. Should
// CUPTI deliver no kernel records, per-sample events are used instead and kernel_time_source() says "events".
Stats Harness::kernel_time(const LaunchFn& fn, int variants, const TimingOptions& opt) {
  cudaStream_t s = impl_->stream;
  variants = std::max(variants, 1);
  for (int i = 0; i < opt.warmup; ++i) fn(i % variants, s);
  check(cudaStreamSynchronize(s), "warm-up");
  if (impl_->cupti) check_cupti(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
  {
    std::lock_guard<std::mutex> lock(records().mu);
    records().items.clear();
  }
  std::vector<cudaEvent_t> ev(2 * static_cast<size_t>(opt.samples));
  for (cudaEvent_t& e : ev) check(cudaEventCreate(&e), "cudaEventCreate");
  // The memset that opens each sample: the L2 flush, or the marker. split_samples() finds the samples by its size.
  void* const opener = opt.flush_l2 ? impl_->flush : impl_->marker;
  const size_t opener_bytes = opt.flush_l2 ? impl_->flush_bytes : kMarkerBytes;
  for (int i = 0; i < opt.samples; ++i) {
    check(cudaMemsetAsync(opener, i & 0xff, opener_bytes, s), opt.flush_l2 ? "L2 flush" : "sample marker");
    check(cudaEventRecord(ev[2 * i], s), "cudaEventRecord");
    fn(i % variants, s);
    check(cudaEventRecord(ev[2 * i + 1], s), "cudaEventRecord");
  }
  check(cudaStreamSynchronize(s), "timed samples");
  if (impl_->cupti) check_cupti(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");

  std::vector<ActivityRecord> items;
  {
    std::lock_guard<std::mutex> lock(records().mu);
    items.swap(records().items);
  }
  std::sort(items.begin(), items.end(),
            [](const ActivityRecord& a, const ActivityRecord& b) { return a.start_ns < b.start_ns; });
  const std::vector<std::vector<KernelSpan>> spans = split_samples(items, opener_bytes);  // per sample: its kernels
  std::vector<double> us;
  for (const auto& call : spans) us.push_back(busy_us(call));
  const int with_kernels =
      static_cast<int>(std::count_if(spans.begin(), spans.end(), [](const auto& k) { return !k.empty(); }));
  impl_->breakdown = bench::kernel_breakdown(spans);
  impl_->kernels_per_call = static_cast<int>(impl_->breakdown.size());  // the most kernels seen in a sample
  if (impl_->cupti) impl_->source = "cupti";
  if (static_cast<int>(us.size()) != opt.samples || with_kernels != opt.samples) {
    // No usable CUPTI records: fall back to events around each call.
    us.clear();
    for (int i = 0; i < opt.samples; ++i) {
      float ms = 0;
      check(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]), "cudaEventElapsedTime");
      us.push_back(ms * 1000.0);
    }
    if (impl_->cupti)
      impl_->source = "events (CUPTI gave " + std::to_string(items.size()) + " records for " +
                      std::to_string(opt.samples) + " samples)";
    impl_->kernels_per_call = 0;
    impl_->breakdown.clear();
  }
  for (cudaEvent_t e : ev) cudaEventDestroy(e);
  return summarize(std::move(us));
}

Stats Harness::graph_time(const LaunchFn& fn, int variants, const TimingOptions& opt) {
  cudaStream_t s = impl_->stream;
  variants = std::max(variants, 1);
  // Kernel tracing adds per-launch work (an empty kernel replayed in a graph measured 2.3 us with it on): off here.
  if (impl_->cupti)
    check_cupti(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityDisable(kernel)");
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  check(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture");
  for (int i = 0; i < opt.graph_calls; ++i) fn(i % variants, s);
  check(cudaStreamEndCapture(s, &graph), "cudaStreamEndCapture");
  check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "cudaEventCreate");
  check(cudaEventCreate(&b), "cudaEventCreate");
  check(cudaGraphLaunch(exec, s), "cudaGraphLaunch (warm-up)");
  std::vector<double> us;
  for (int r = 0; r < opt.graph_replays; ++r) {
    check(cudaEventRecord(a, s), "cudaEventRecord");
    check(cudaGraphLaunch(exec, s), "cudaGraphLaunch");
    check(cudaEventRecord(b, s), "cudaEventRecord");
    check(cudaEventSynchronize(b), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
    us.push_back(ms * 1000.0 / opt.graph_calls);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  if (impl_->cupti)
    check_cupti(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable(kernel)");
  return summarize(std::move(us));
}

Ceilings Harness::measure_ceilings() {
  Ceilings c;
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, dev), "cudaGetDeviceProperties");
  c.device = p.name;
  c.sm_count = p.multiProcessorCount;
  c.l2_bytes = p.l2CacheSize;
  cudaStream_t s = impl_->stream;

  // Copy bandwidth: 1 GiB device to device, bytes read + written, median of 10.
  const size_t bytes = size_t{1} << 30;
  void *src = nullptr, *dst = nullptr;
  check(cudaMalloc(&src, bytes), "cudaMalloc(copy source)");
  check(cudaMalloc(&dst, bytes), "cudaMalloc(copy destination)");
  check(cudaMemsetAsync(src, 1, bytes, s), "cudaMemset");
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "cudaEventCreate");
  check(cudaEventCreate(&b), "cudaEventCreate");
  std::vector<double> bw;
  for (int i = 0; i < 11; ++i) {
    check(cudaEventRecord(a, s), "cudaEventRecord");
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync");
    check(cudaEventRecord(b, s), "cudaEventRecord");
    check(cudaEventSynchronize(b), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
    if (i > 0) bw.push_back(2.0 * bytes / (ms * 1e-3));
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaFree(src);
  cudaFree(dst);
  std::sort(bw.begin(), bw.end());
  c.copy_bytes_per_s = bw[bw.size() / 2];

  const LaunchFn empty = [](int, Stream st) { launch_empty_kernel(st); };
  TimingOptions t;
  t.samples = 200;
  t.flush_l2 = false;
  c.empty_kernel_us = kernel_time(empty, 1, t).median_us;
  t.graph_calls = 100;
  t.graph_replays = 50;
  c.empty_graph_launch_us = graph_time(empty, 1, t).median_us;
  return c;
}

#else  // no CUDA: every entry that needs a GPU says so.

struct Harness::Impl {};
Harness::Harness() {
  throw NotSupported("bench", "this build of moekit has no CUDA support (needed to time kernels)");
}
Harness::~Harness() = default;
Stream Harness::stream() const {
  return nullptr;
}
int Harness::kernels_per_call() const {
  return 0;
}
const std::vector<KernelStat>& Harness::kernel_breakdown() const {
  static const std::vector<KernelStat> none;
  return none;
}
std::string Harness::kernel_time_source() const {
  return "none";
}
Ceilings Harness::measure_ceilings() {
  return {};
}
Stats Harness::kernel_time(const LaunchFn&, int, const TimingOptions&) {
  return {};
}
Stats Harness::graph_time(const LaunchFn&, int, const TimingOptions&) {
  return {};
}

#endif

}  // namespace moekit::bench

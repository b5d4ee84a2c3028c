// `moekit bench route`: the fused router against the CPU reference, then timed. Per case and requested grid size:
// `variants` random logits sets on the device, each routed on the GPU and on the CPU and every plan field compared;
// then cold-L2 CUPTI kernel time and graph-replay time, with the logits-read floor (logits bytes / measured copy
// bandwidth) and the DESIGN §11 goal beside them.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>

#include "moekit/bench.h"
#include "moekit/device.h"
#include "moekit/error.h"
#include "moekit/plan.h"

#if MOEKIT_HAS_CUDA
#include <cuda_runtime.h>

#include "routing/cuda/route_cuda.h"
#endif

namespace moekit::bench {

std::vector<RouteCase> route_fixtures(std::string_view name) {
  std::vector<RouteCase> v;
  if (name == "seed6") {
    const int tkb[6][3] = {{32, 8, 16}, {128, 8, 16}, {8, 10, 8}, {128, 10, 8}, {512, 10, 8}, {16384, 10, 8}};
    for (const auto& x : tkb)
      v.push_back({"seed6", make_routing_config(RoutingMethod::softmax_topk, 512, x[1]), x[0], x[2]});
  } else if (name == "dsv3") {
    for (int64_t t : {1, 64, 1024, 16384})
      v.push_back({"dsv3", make_routing_config(RoutingMethod::sigmoid_grouped, 256, 8, 0, true, 8, 4, 2.5f), t, 64,
                   DType::f32, true});
  } else {
    throw InvalidArgument("bench", fmt::format("fixtures ('{}') must be one of: seed6, dsv3", name));
  }
  return v;
}

namespace {
constexpr const char* kPhaseNames[] = {"setup", "route", "count", "totals", "offsets", "scatter", "padding"};
}  // namespace

std::string route_markdown(const std::vector<RouteResult>& results, const Ceilings& c) {
  std::string s = fmt::format(
      "{}: copy {:.2f} TB/s (read+write), empty kernel {:.2f} us (CUPTI), empty launch in a graph {:.2f} us\n\n",
      c.device, c.copy_bytes_per_s / 1e12, c.empty_kernel_us, c.empty_graph_launch_us);
  s += "| fixture | method | E | K | T | B | dtype | CTAs | kernels | kernel us (p10-p90) | graph us | floor us | "
       "goal us "
       "| verified |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const RouteResult& r : results) {
    const bool timed = r.kernel.samples > 0;
    s += fmt::format(
        "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.2f} | {:.0f} | {} |\n", r.c.fixture,
        routing_method_name(r.c.cfg.method), r.c.cfg.num_experts, r.c.cfg.top_k, r.c.tokens, r.c.block,
        dtype_name(r.c.dtype),
        fmt::format("{}{}{}{}", r.ctas, r.ctas_requested ? " (forced)" : "", r.pairs ? ", 2 tokens/warp" : "",
                    r.token_masks ? ", token masks" : ""),
        r.kernels_per_call,
        timed ? fmt::format("**{:.2f}** ({:.2f}-{:.2f})", r.kernel.median_us, r.kernel.p10_us, r.kernel.p90_us)
              : std::string("-"),
        timed ? fmt::format("{:.2f}", r.graph.median_us) : std::string("-"), r.floor_us, r.goal_us,
        r.verified ? "yes" : "NO: " + r.mismatch);
  }
  bool any_phases = false;
  for (const RouteResult& r : results) any_phases |= r.phases.samples > 0;
  if (any_phases) {
    s +=
        "\nPhases (median us, cold L2; CTA 0 and, below it on grids, the CTA that ends last, from in-kernel clock64; "
        "grid span and start skew from %globaltimer):"
        "\n\n| fixture | T | CTAs | ";
    for (const char* name : kPhaseNames) s += fmt::format("{} | ", name);
    s += "grid span | start skew | SM GHz |\n|---|---|---|";
    for (size_t i = 0; i < std::size(kPhaseNames) + 3; ++i) s += "---|";
    s += "\n";
    for (const RouteResult& r : results) {
      if (r.phases.samples == 0) continue;
      s += fmt::format("| {} | {} | {} | ", r.c.fixture, r.c.tokens, r.ctas);
      for (double v : r.phases.cta0_us) s += fmt::format("{:.2f} | ", v);
      s += fmt::format("{:.2f} | {:.2f} | {:.2f} |\n", r.phases.span_us, r.phases.skew_us, r.phases.sm_clock_ghz);
      if (r.ctas > 1 && r.phases.last_us.size() == r.phases.cta0_us.size()) {
        s += fmt::format("| | | last: CTA {} | ", r.phases.last_cta);
        for (double v : r.phases.last_us) s += fmt::format("{:.2f} | ", v);
        s += "| | |\n";
      }
    }
    bool any_tiny = false;
    for (const RouteResult& r : results) any_tiny |= r.phases.samples > 0 && r.tiny_plan;
    if (any_tiny)
      s += "\nCalls with T * Kt <= 32 on one CTA build their plan in one step: there *count* is ranking and "
           "scattering the slots, *totals* and *offsets* are empty, *scatter* is writing counts and offsets and "
           "*padding* blocks and padding. With one token *count* is empty too and *padding* is the slots' rows and "
           "blocks. Up to 8 tokens *route* ends when the routing warps' selections reach the warps without tokens, "
           "whose first thread stamps the rest; the routing warps' weights run beside the plan, unstamped.\n";
  }
  for (const RouteResult& r : results)
    if (r.kernel.samples > 0 && r.timing_source != "cupti") {
      s += "\nKernel time from " + r.timing_source + ".\n";
      break;
    }
  return s;
}

std::string route_json(const std::vector<RouteResult>& results, const Ceilings& c) {
  nlohmann::json j;
  j["ceilings"] = {{"device", c.device},
                   {"sm_count", c.sm_count},
                   {"l2_bytes", c.l2_bytes},
                   {"copy_bytes_per_s", c.copy_bytes_per_s},
                   {"empty_kernel_us", c.empty_kernel_us},
                   {"empty_graph_launch_us", c.empty_graph_launch_us}};
  auto stats = [](const Stats& s) {
    return nlohmann::json{{"median_us", s.median_us},
                          {"p10_us", s.p10_us},
                          {"p90_us", s.p90_us},
                          {"min_us", s.min_us},
                          {"samples", s.samples}};
  };
  j["results"] = nlohmann::json::array();
  for (const RouteResult& r : results)
    j["results"].push_back({{"fixture", r.c.fixture},
                            {"method", routing_method_name(r.c.cfg.method)},
                            {"experts", r.c.cfg.num_experts},
                            {"top_k", r.c.cfg.top_k},
                            {"shared", r.c.cfg.num_shared_experts},
                            {"tokens", r.c.tokens},
                            {"block", r.c.block},
                            {"dtype", dtype_name(r.c.dtype)},
                            {"bias", r.c.bias},
                            {"ctas_requested", r.ctas_requested},
                            {"ctas", r.ctas},
                            {"pairs", r.pairs},
                            {"token_masks", r.token_masks},
                            {"tiny_plan", r.tiny_plan},
                            {"verified", r.verified},
                            {"mismatch", r.mismatch},
                            {"kernels_per_call", r.kernels_per_call},
                            {"timing_source", r.timing_source},
                            {"kernel", stats(r.kernel)},
                            {"graph", stats(r.graph)},
                            {"logits_bytes", r.logits_bytes},
                            {"floor_us", r.floor_us},
                            {"goal_us", r.goal_us},
                            {"phases",
                             {{"names", kPhaseNames},
                              {"cta0_us", r.phases.cta0_us},
                              {"last_cta_us", r.phases.last_us},
                              {"last_cta", r.phases.last_cta},
                              {"span_us", r.phases.span_us},
                              {"skew_us", r.phases.skew_us},
                              {"sm_clock_ghz", r.phases.sm_clock_ghz},
                              {"samples", r.phases.samples}}}});
  return j.dump(2);
}

RoutePhases route_phases_from_trace(const std::vector<uint64_t>& trace, int samples, int64_t words_per_sample,
                                    int ctas, int points) {
  if (samples < 1 || ctas < 1 || points < 2 || words_per_sample < int64_t{2} * ctas * points ||
      static_cast<int64_t>(trace.size()) < samples * words_per_sample)
    throw InvalidArgument("bench", fmt::format("trace of {} words does not hold {} samples of {} CTAs x {} points",
                                               trace.size(), samples, ctas, points));
  // CTA 0's phases from clock64 (cycles; %globaltimer ticks are too coarse for sub-microsecond phases), converted
  // with the SM clock measured over the same samples; span and skew across CTAs from %globaltimer.
  const int P = points;
  std::vector<std::vector<double>> per_phase(static_cast<size_t>(P - 1)), last_phase(static_cast<size_t>(P - 1));
  std::vector<double> span, skew, cycles_per_ns;
  std::vector<int> last_of(static_cast<size_t>(samples), 0);
  for (int i = 0; i < samples; ++i) {
    const uint64_t* x = trace.data() + i * words_per_sample;  // [cta][point][ns, clock]
    auto ns = [&](int cta, int point) { return static_cast<double>(x[(cta * P + point) * 2]); };
    auto clk = [&](int point) { return static_cast<double>(x[point * 2 + 1]); };
    if (ns(0, P - 1) > ns(0, 0)) cycles_per_ns.push_back((clk(P - 1) - clk(0)) / (ns(0, P - 1) - ns(0, 0)));
    double first = ns(0, 0), last = ns(0, P - 1), last_start = first;
    for (int c = 1; c < ctas; ++c) {
      first = std::min(first, ns(c, 0));
      last_start = std::max(last_start, ns(c, 0));
      if (ns(c, P - 1) > last) {
        last = ns(c, P - 1);
        last_of[static_cast<size_t>(i)] = c;
      }
    }
    span.push_back((last - first) * 1e-3);
    skew.push_back((last_start - first) * 1e-3);
  }
  const double rate = cycles_per_ns.empty() ? 1.0 : summarize(cycles_per_ns).median_us;  // cycles per ns
  for (int i = 0; i < samples; ++i) {
    const uint64_t* x = trace.data() + i * words_per_sample;
    auto us = [&](int cta, int k) {  // CTA `cta`'s phase k from its own clock64
      const uint64_t* c = x + static_cast<int64_t>(cta) * P * 2;
      return (static_cast<double>(c[(k + 1) * 2 + 1]) - static_cast<double>(c[k * 2 + 1])) / rate * 1e-3;
    };
    for (int k = 0; k + 1 < P; ++k) {
      per_phase[static_cast<size_t>(k)].push_back(us(0, k));
      last_phase[static_cast<size_t>(k)].push_back(us(last_of[static_cast<size_t>(i)], k));
    }
  }
  RoutePhases ph;
  for (auto& v : per_phase) ph.cta0_us.push_back(summarize(v).median_us);
  for (auto& v : last_phase) ph.last_us.push_back(summarize(v).median_us);
  ph.last_cta = static_cast<int>(summarize(std::vector<double>(last_of.begin(), last_of.end())).median_us);
  ph.span_us = summarize(span).median_us;
  ph.skew_us = summarize(skew).median_us;
  ph.sm_clock_ghz = rate;
  ph.samples = samples;
  return ph;
}

#if MOEKIT_HAS_CUDA
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw CudaError("bench", std::string(what) + " failed: " + cudaGetErrorString(e));
}

template <class T>
std::vector<T> download(const T* src, int64_t n) {
  std::vector<T> v(static_cast<size_t>(n));
  if (n > 0) check(cudaMemcpy(v.data(), src, n * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy(plan)");
  return v;
}

template <class T>
std::string first_difference(const char* field, const std::vector<T>& got, const T* want) {
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i]) return fmt::format("{}[{}] = {}, reference {}", field, i, got[i], want[i]);
  return {};
}

// Compares the GPU plan (and replay) with the reference; returns the first difference or "".
std::string compare(const RouteCase& c, const RoutePlanView& gpu, const RoutePlanView& ref,
                    const std::vector<int16_t>& replay_gpu, const std::vector<int16_t>& replay_ref) {
  const PlanShape& s = gpu.shape;
  const int64_t T = c.tokens, n = T * s.slots();
  const int64_t cap = plan_capacity(T, s.num_experts, s.top_k, s.num_shared_experts, s.block);
  std::string d;
  if (!(d = first_difference("topk_ids", download(gpu.topk_ids, n), ref.topk_ids)).empty()) return d;
  const double tol = c.cfg.method == RoutingMethod::softmax_topk && !c.cfg.renormalize ? 4e-6 : 1e-6;
  const std::vector<float> w = download(gpu.topk_weights, n);
  for (int64_t i = 0; i < n; ++i)
    if (!(std::fabs(static_cast<double>(w[i]) - ref.topk_weights[i]) <= tol * std::fabs(ref.topk_weights[i])))
      return fmt::format("topk_weights[{}] = {}, reference {}", i, w[i], ref.topk_weights[i]);
  if (!(d = first_difference("expert_counts", download(gpu.expert_counts, s.groups()), ref.expert_counts)).empty())
    return d;
  if (!(d = first_difference("expert_offsets", download(gpu.expert_offsets, s.groups() + 1), ref.expert_offsets))
           .empty())
    return d;
  if (!(d = first_difference("sorted_slots", download(gpu.sorted_slots, cap), ref.sorted_slots)).empty()) return d;
  if (!(d = first_difference("slot_rows", download(gpu.slot_rows, n), ref.slot_rows)).empty()) return d;
  if (!(d = first_difference("block_experts", download(gpu.block_experts, cap / s.block), ref.block_experts)).empty())
    return d;
  if (!(d = first_difference("extent", download(gpu.extent, 2), ref.extent)).empty()) return d;
  return first_difference("replay", replay_gpu, replay_ref.data());
}

// Median phase times of one case from `samples` cold-L2 calls, each writing its own trace slice.
RoutePhases trace_phases(Harness& harness, const LaunchFn& call, int variants, const TimingOptions& timing,
                         detail::RouteCudaTuning tuning) {
  const int samples = std::max(1, timing.samples);
  const int64_t words = detail::route_cuda_trace_words();
  DeviceBuffer buf(static_cast<size_t>(samples * words) * 8);
  fill_device_bytes(buf.data(), 0, static_cast<size_t>(samples * words) * 8);
  int64_t n = 0;
  const LaunchFn traced = [&](int v, Stream s) {
    tuning.trace = static_cast<uint64_t*>(buf.data()) + (n++ % samples) * words;
    detail::set_route_cuda_tuning(tuning);
    call(v, s);
  };
  TimingOptions t = timing;
  t.samples = samples;
  harness.kernel_time(traced, variants, t);
  detail::set_route_cuda_tuning({});
  const std::vector<uint64_t> host = download(static_cast<const uint64_t*>(buf.data()), samples * words);
  return route_phases_from_trace(host, samples, words, detail::route_cuda_last_ctas(), detail::kRouteTracePoints);
}

}  // namespace

std::vector<RouteResult> bench_route(Harness& harness, const std::vector<RouteCase>& cases,
                                     const RouteBenchOptions& opt, const Ceilings& ceilings) {
  std::vector<RouteResult> out;
  const std::vector<int> grids = opt.ctas.empty() ? std::vector<int>{0} : opt.ctas;
  const detail::RoutePairs pairs = opt.pairs < 0   ? detail::RoutePairs::never
                                   : opt.pairs > 0 ? detail::RoutePairs::always
                                                   : detail::RoutePairs::heuristic;
  const Stream stream = harness.stream();
  uint64_t seed = opt.seed;
  for (const RouteCase& c : cases) {
    const int E = c.cfg.num_experts, K = c.cfg.top_k;
    const int64_t T = c.tokens, elems = T * E;
    const size_t esz = static_cast<size_t>(dtype_size(c.dtype));
    const int variants = std::max(1, opt.variants);
    const PlanShape shape{T, E, K, c.cfg.num_shared_experts, c.block};
    RoutePlan plan(shape, Device::cuda());

    std::mt19937_64 rng(seed++);
    std::normal_distribution<float> normal(0.0f, 2.0f), small(0.0f, 0.05f);
    std::vector<float> bias(static_cast<size_t>(E));
    for (float& b : bias) b = small(rng);
    DeviceBuffer d_bias(bias.size() * 4);
    copy_to_device(d_bias.data(), bias.data(), bias.size() * 4);
    const TensorView bias_dev =
        c.bias ? TensorView::contiguous(d_bias.data(), DType::f32, {E}, Device::cuda()) : TensorView{};
    const TensorView bias_host = c.bias ? TensorView::contiguous(bias.data(), DType::f32, {E}) : TensorView{};
    DeviceBuffer d_replay(static_cast<size_t>(T * K) * 2);
    const TensorView replay_dev = TensorView::contiguous(d_replay.data(), DType::i16, {T, K}, Device::cuda());

    // Each variant's logits on the device, and its CPU plan and replay record.
    std::vector<std::unique_ptr<DeviceBuffer>> logits;
    std::vector<RoutePlan> refs;
    std::vector<std::vector<int16_t>> replay_refs;
    for (int v = 0; v < variants; ++v) {
      std::vector<float> x(static_cast<size_t>(elems));
      for (float& f : x) f = normal(rng);
      std::vector<uint16_t> x16;
      if (c.dtype == DType::bf16) {
        x16.resize(x.size());
        for (size_t i = 0; i < x.size(); ++i) x16[i] = float_to_bf16(x[i]);
      }
      const void* host = c.dtype == DType::bf16 ? static_cast<const void*>(x16.data()) : x.data();
      logits.push_back(std::make_unique<DeviceBuffer>(static_cast<size_t>(elems) * esz));
      copy_to_device(logits.back()->data(), host, static_cast<size_t>(elems) * esz);
      refs.emplace_back(shape, Device::cpu());
      replay_refs.emplace_back(static_cast<size_t>(T * K));
      route(c.cfg, TensorView::contiguous(const_cast<void*>(host), c.dtype, {T, E}), bias_host, refs.back(), nullptr,
            TensorView::contiguous(replay_refs.back().data(), DType::i16, {T, K}));
    }
    // The first difference from the reference over the variants, routed with the current launch tuning.
    auto verify = [&]() -> std::string {
      for (int v = 0; v < variants; ++v) {
        // On the call's stream: a plain cudaMemset would not be ordered before the route on a non-blocking stream.
        check(
            cudaMemsetAsync(plan.view().sorted_slots, 0xa5, shape.capacity() * 4, static_cast<cudaStream_t>(stream)),
            "poison");
        route(c.cfg, TensorView::contiguous(logits[static_cast<size_t>(v)]->data(), c.dtype, {T, E}, Device::cuda()),
              bias_dev, plan, stream, replay_dev);
        check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "route");
        const std::string d = compare(c, plan.view(), refs[static_cast<size_t>(v)].view(),
                                      download(static_cast<const int16_t*>(d_replay.data()), T * K),
                                      replay_refs[static_cast<size_t>(v)]);
        if (!d.empty()) return d;
      }
      return {};
    };

    for (int grid : grids) {
      RouteResult r;
      r.c = c;
      r.ctas_requested = grid;
      r.logits_bytes = static_cast<double>(elems * esz);
      r.floor_us = ceilings.copy_bytes_per_s > 0 ? r.logits_bytes / ceilings.copy_bytes_per_s * 1e6 : 0;
      r.goal_us = T <= 1024 ? 4.0 : 20.0;
      const detail::RouteCudaTuning tuning{.ctas = grid, .general_only = opt.general_instance, .pairs = pairs};
      detail::set_route_cuda_tuning(tuning);
      r.mismatch = verify();
      r.verified = r.mismatch.empty();
      r.ctas = detail::route_cuda_last_ctas();
      r.tiny_plan = detail::route_cuda_last_tiny_plan();
      r.pairs = detail::route_cuda_last_pairs();
      r.token_masks = detail::route_cuda_last_token_masks();
      const LaunchFn call = [&](int v, Stream s) {
        route(c.cfg, TensorView::contiguous(logits[static_cast<size_t>(v)]->data(), c.dtype, {T, E}, Device::cuda()),
              bias_dev, plan, s, replay_dev);
      };
      if (!opt.verify_only && r.verified) {
        r.kernel = harness.kernel_time(call, variants, opt.timing);
        r.kernels_per_call = harness.kernels_per_call();
        r.timing_source = harness.kernel_time_source();
        r.graph = harness.graph_time(call, variants, opt.timing);
        if (opt.phases) r.phases = trace_phases(harness, call, variants, opt.timing, tuning);
      }
      detail::set_route_cuda_tuning({});
      out.push_back(std::move(r));
    }
  }
  return out;
}

#else

std::vector<RouteResult> bench_route(Harness&, const std::vector<RouteCase>&, const RouteBenchOptions&,
                                     const Ceilings&) {
  throw NotSupported("bench", "this build of moekit has no CUDA support (needed for bench route)");
}

#endif

}  // namespace moekit::bench

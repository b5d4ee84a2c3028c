// `moekit bench ep`: the expert-parallel layer of a preset on W GPUs against the whole layer on one GPU. Weights,
// hidden states and logits are hash-generated on the device by global index, so rank r's slice of a tensor equals
// the same rows of the single-GPU tensor. Per T (tokens per rank): the single-GPU layer (route + CudaExperts) runs
// W*T tokens once for verification and T tokens for timing; each mode's EP layer runs on W threads (run_on_gpus),
// is verified against the single-GPU rows of its rank, then timed: eager forward calls, CUDA events, medians.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <vector>

#include "moekit/cuda_experts.h"
#include "moekit/device.h"
#include "moekit/error.h"
#include "moekit/expert_parallel.h"
#include "moekit/plan.h"
#include "moekit/presets.h"

#if MOEKIT_HAS_CUDA
#include <cuda_runtime_api.h>

#include "core/device_scope.h"
#include "parallel/ep_bookkeeping.h"
#include "parallel/ep_kernels.h"
#endif

namespace moekit {

#if MOEKIT_HAS_CUDA
namespace {

constexpr double kTolerance = 1e-2;

void ck(cudaError_t err, std::string_view call) {
  detail::check_cuda(err, "bench", call);
}

// Seeds of the logical tensors. The selection bias (kBias; deepseek-v3, kimi-k2) is uniform in
// [-kSyntheticBiasScale, kSyntheticBiasScale): small beside the sigmoid keys, so that rows reach every expert as
// under a trained load-balancing bias (at 0.1, 129 of deepseek-v3's 256 experts got rows at T = 4096 with these
// logits; at 0.01, all 256).
enum Tensor : uint64_t { kW13 = 1, kW2 = 2, kHidden = 3, kLogits = 4, kBias = 5 };

void fill(void* p, int64_t n, int64_t first, float scale, uint64_t seed, bool bf16, Stream s) {
  ep_detail::launch_hash_fill({p, n, first, scale, seed, bf16}, s);
}

// One rank's weights (or, with W = 1, the whole layer's): local routed experts, then the shared ones.
struct Weights {
  DeviceBuffer w13, w2;
  ExpertWeights view;
};

Weights make_weights(const ExpertConfig& global, int W, int r, uint64_t seed, int device, Stream s) {
  const ExpertPartition part = expert_partition(global.num_experts, W, r);
  const int64_t H = global.hidden, I = global.intermediate, S = global.num_shared_experts, L = part.count;
  const int64_t n13 = 2 * I * H, n2 = H * I;
  Weights w{DeviceBuffer(static_cast<size_t>((L + S) * n13 * 2), device),
            DeviceBuffer(static_cast<size_t>((L + S) * n2 * 2), device),
            {}};
  auto* p13 = static_cast<uint16_t*>(w.w13.data());
  auto* p2 = static_cast<uint16_t*>(w.w2.data());
  const float s13 = 1.0f / std::sqrt(static_cast<float>(H)), s2 = 1.0f / std::sqrt(static_cast<float>(I));
  fill(p13, L * n13, part.offset * n13, s13, seed * 16 + kW13, true, s);
  fill(p13 + L * n13, S * n13, global.num_experts * n13, s13, seed * 16 + kW13, true, s);
  fill(p2, L * n2, part.offset * n2, s2, seed * 16 + kW2, true, s);
  fill(p2 + L * n2, S * n2, global.num_experts * n2, s2, seed * 16 + kW2, true, s);
  const Device dev = Device::cuda(device);
  w.view.w13 = TensorView::contiguous(p13, DType::bf16, {L + S, 2 * I, H}, dev);
  w.view.w2 = TensorView::contiguous(p2, DType::bf16, {L + S, H, I}, dev);
  return w;
}

// Rows [first, first + n) of the logical hidden [W*T, H] bf16 and logits [W*T, E] fp32 of one T.
void fill_tokens(void* hidden, void* logits, int64_t first, int64_t n, int64_t H, int E, uint64_t seed, Stream s) {
  fill(hidden, n * H, first * H, 1.0f, seed * 16 + kHidden, true, s);
  fill(logits, n * E, first * E, 4.0f, seed * 16 + kLogits, false, s);
}

double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Median milliseconds of `iterations` eager calls of fn on stream s, after `warmup` calls.
template <class Fn>
double time_ms(Fn&& fn, cudaStream_t s, int warmup, int iterations) {
  for (int i = 0; i < warmup; ++i) fn();
  cudaEvent_t a, b;
  ck(cudaEventCreate(&a), "cudaEventCreate");
  ck(cudaEventCreate(&b), "cudaEventCreate");
  std::vector<float> ms;
  for (int i = 0; i < iterations; ++i) {
    ck(cudaEventRecord(a, s), "cudaEventRecord");
    fn();
    ck(cudaEventRecord(b, s), "cudaEventRecord");
    ck(cudaEventSynchronize(b), "cudaEventSynchronize");
    float x = 0;
    ck(cudaEventElapsedTime(&x, a, b), "cudaEventElapsedTime");
    ms.push_back(x);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return median(std::move(ms));
}

// E used: the requested one, or the preset's halved (keeping n_group | E and K <= kept experts) until the
// single-GPU layer's weights fit in 80% of device 0 next to rank 0's share.
int choose_experts(const Preset& p, const EpBenchOptions& o, bool& reduced) {
  const ExpertConfig& c = p.experts;
  const double per_expert = 3.0 * c.hidden * double(c.intermediate) * 2;
  const double budget = 0.8 * static_cast<double>(device_info(0).global_mem_bytes);
  int e = o.num_experts > 0 ? o.num_experts : c.num_experts;
  reduced = false;
  auto fits = [&](int n) {
    return per_expert * ((n + c.num_shared_experts) + (n / o.gpus + 1 + c.num_shared_experts)) <= budget;
  };
  auto valid = [&](int n) {
    return n >= o.gpus && n % p.routing.n_group == 0 &&
           p.routing.top_k <= p.routing.topk_group * (n / p.routing.n_group);
  };
  while (o.num_experts <= 0 && !fits(e) && e % 2 == 0 && valid(e / 2)) {
    e /= 2;
    reduced = true;
  }
  return e;
}

}  // namespace

EpBenchReport bench_ep(const EpBenchOptions& o) {
  const Preset& preset = find_preset(o.preset);
  if (o.tokens.empty()) throw InvalidArgument("bench", "tokens (empty) must list at least one T");
  for (int64_t t : o.tokens)
    if (t < 1) throw InvalidArgument("bench", fmt::format("tokens ({}) must be >= 1", t));
  if (o.iterations < 1) throw InvalidArgument("bench", fmt::format("iterations ({}) must be >= 1", o.iterations));
  if (o.gpus < 1 || o.gpus > kMaxWorldSize)
    throw InvalidArgument("bench", fmt::format("gpus ({}) must be in 1..{}", o.gpus, kMaxWorldSize));
  if (cuda_device_count() < o.gpus)
    throw NotSupported("bench",
                       fmt::format("gpus ({}) must be <= visible CUDA devices ({})", o.gpus, cuda_device_count()));
  for (int d = 0; d < o.gpus; ++d)
    if (!device_is_sm90(d)) throw NotSupported("bench", fmt::format("device ({}) must be an sm_90 GPU", d));

  EpBenchReport rep;
  rep.preset = preset.name;
  rep.device = device_info(0).name;
  rep.gpus = o.gpus;
  ExpertConfig global = preset.experts;
  RoutingConfig routing = preset.routing;
  global.num_experts = routing.num_experts = choose_experts(preset, o, rep.reduced);
  rep.num_experts = global.num_experts;
  global.validate();
  routing.validate();
  const int W = o.gpus, E = global.num_experts;
  const int64_t H = global.hidden, tmax = *std::max_element(o.tokens.begin(), o.tokens.end());
  const Device dev0 = Device::cuda(0);

  // The single-GPU layer on device 0: W*T tokens for verification, T for timing.
  std::vector<std::vector<uint16_t>> expected(o.tokens.size());
  std::vector<double> single_us(o.tokens.size());
  {
    ck(cudaSetDevice(0), "cudaSetDevice");
    cudaStream_t s;
    ck(cudaStreamCreate(&s), "cudaStreamCreate");
    Weights w = make_weights(global, 1, 0, o.seed, 0, s);
    DeviceBuffer bias(static_cast<size_t>(E) * 4, 0), hidden(static_cast<size_t>(W * tmax * H * 2), 0),
        logits(static_cast<size_t>(W * tmax * E * 4), 0), out(static_cast<size_t>(W * tmax * H * 2), 0);
    fill(bias.data(), E, 0, kSyntheticBiasScale, o.seed * 16 + kBias, false, s);
    const TensorView bias_view =
        preset.has_bias ? TensorView::contiguous(bias.data(), DType::f32, {E}, dev0) : TensorView{};
    CudaExperts experts(CudaExpertsArgs{global, w.view, W * tmax, preset.block, dev0});
    RoutePlan plan(PlanShape{W * tmax, E, global.top_k, global.num_shared_experts, preset.block}, dev0);
    for (size_t i = 0; i < o.tokens.size(); ++i) {
      const int64_t T = o.tokens[i];
      fill_tokens(hidden.data(), logits.data(), 0, W * T, H, E, o.seed + static_cast<uint64_t>(T), s);
      auto run = [&](int64_t n) {
        route(routing, TensorView::contiguous(logits.data(), DType::f32, {n, E}, dev0), bias_view, plan, s);
        experts.run(plan, TensorView::contiguous(hidden.data(), DType::bf16, {n, H}, dev0),
                    TensorView::contiguous(out.data(), DType::bf16, {n, H}, dev0), s);
      };
      run(W * T);
      expected[i].resize(static_cast<size_t>(W * T * H));
      ck(cudaStreamSynchronize(s), "cudaStreamSynchronize");
      out.download(expected[i].data(), expected[i].size() * 2);
      single_us[i] = 1e3 * time_ms([&] { run(T); }, s, o.warmup, o.iterations);
    }
    ck(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    cudaStreamDestroy(s);
  }

  std::mutex mu;
  for (EpMode mode : o.modes) {
    std::vector<EpBenchRow> rows(o.tokens.size());
    run_on_gpus(W, [&](int r, Communicator& comm) {
      cudaStream_t s;
      ck(cudaStreamCreate(&s), "cudaStreamCreate");
      const Device dev = Device::cuda(r);
      Weights w = make_weights(global, W, r, o.seed, r, s);
      DeviceBuffer bias(static_cast<size_t>(E) * 4, r), hidden(static_cast<size_t>(tmax * H * 2), r),
          logits(static_cast<size_t>(tmax * E * 4), r), out(static_cast<size_t>(tmax * H * 2), r);
      fill(bias.data(), E, 0, kSyntheticBiasScale, o.seed * 16 + kBias, false, s);
      EpLayerArgs a;
      a.experts = global;
      a.routing = routing;
      a.weights = w.view;
      a.routing_bias = preset.has_bias ? TensorView::contiguous(bias.data(), DType::f32, {E}, dev) : TensorView{};
      a.mode = mode;
      a.max_tokens = tmax;
      a.block = preset.block;
      ck(cudaStreamSynchronize(s), "cudaStreamSynchronize");
      EpLayer layer(a, comm);
      for (size_t i = 0; i < o.tokens.size(); ++i) {
        const int64_t T = o.tokens[i];
        fill_tokens(hidden.data(), logits.data(), r * T, T, H, E, o.seed + static_cast<uint64_t>(T), s);
        const TensorView hv = TensorView::contiguous(hidden.data(), DType::bf16, {T, H}, dev);
        const TensorView lv = TensorView::contiguous(logits.data(), DType::f32, {T, E}, dev);
        const TensorView ov = TensorView::contiguous(out.data(), DType::bf16, {T, H}, dev);
        layer.forward(hv, lv, ov, s);
        ck(cudaStreamSynchronize(s), "cudaStreamSynchronize");
        std::vector<uint16_t> got(static_cast<size_t>(T * H));
        out.download(got.data(), got.size() * 2);
        const double err = relative_frobenius_bf16(got.data(), expected[i].data() + r * T * H, T * H);
        if (!(err <= kTolerance))
          throw Internal("bench", fmt::format("ep {} rank {} T {}: relative error ({:.3e}) must be <= {:.0e}",
                                              ep_mode_name(mode), r, T, err, kTolerance));
        const double us = 1e3 * time_ms([&] { layer.forward(hv, lv, ov, s); }, s, o.warmup, o.iterations);
        std::lock_guard<std::mutex> lock(mu);
        EpBenchRow& row = rows[i];
        row.mode = mode;
        row.tokens = T;
        row.single_us = single_us[i];
        row.ep_us = std::max(row.ep_us, us);
        row.verify_error = std::max(row.verify_error, err);
      }
      cudaStreamDestroy(s);
    });
    for (EpBenchRow& row : rows) {
      row.single_tokens_per_s = row.tokens / (row.single_us * 1e-6);
      row.ep_tokens_per_s_per_rank = row.tokens / (row.ep_us * 1e-6);
      rep.rows.push_back(row);
    }
  }
  return rep;
}

#else

EpBenchReport bench_ep(const EpBenchOptions&) {
  throw NotSupported("bench", "moekit was built without CUDA");
}

#endif

}  // namespace moekit

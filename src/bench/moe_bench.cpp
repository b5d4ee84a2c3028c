// `moekit bench moe`: the bf16 experts of one preset on the GPU, timed with the shared harness (moekit/bench.h).
// Weights, hidden states and logits are hash-filled on the device; the GPU router builds the plan. Every tactic pair
// that will be timed is first verified against experts_reference at min(T, verify_tokens) tokens, and the call that
// is timed on a sample of its own tokens (kSampledTokens, first to last). Then, per T:
// experts-only and route + experts, as cold-L2 kernel time (CUPTI, summed over the call's kernels) and as CUDA-graph
// replay. Ceilings: the harness's copy bandwidth and graph launch, plus a cuBLAS bf16 GEMM rate measured here; the
// floor is max(bytes / copy BW, flops / GEMM rate) with bytes = active experts' weights + hidden in + out. Optionally
// a reference: cuBLAS batched GEMMs on the same weights with the rows split evenly
// (MoeBenchOptions::cublas_baseline).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <utility>
#include <vector>

#include "moekit/bench.h"
#include "moekit/cuda_experts.h"
#include "moekit/device.h"
#include "moekit/error.h"
#include "moekit/plan.h"
#include "moekit/presets.h"

#if MOEKIT_HAS_CUDA
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "bench/moe_bench_kernels.h"
#endif

namespace moekit {
#if MOEKIT_HAS_CUDA
namespace {

constexpr int64_t kSampledTokens = 4;  // tokens of the timed call itself compared with the reference

void ck(cudaError_t err, std::string_view what) {
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw CudaError("bench", fmt::format("{} failed: {}", what, cudaGetErrorString(err)));
  }
}

double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// A cuBLAS handle for the benchmark's reference GEMMs (the GEMM ceiling and the batched baseline).
class Cublas {
 public:
  Cublas() {
    if (cublasCreate(&h_) != CUBLAS_STATUS_SUCCESS) throw CudaError("bench", "cublasCreate failed");
  }
  ~Cublas() { cublasDestroy(h_); }
  Cublas(const Cublas&) = delete;
  Cublas& operator=(const Cublas&) = delete;

  // For b < batch, row-major D_b [n, m] = X_b [n, k] * W_b^T with W_b [m, k] row-major: bf16, fp32 accumulation.
  // ldx / ldd are the row strides of X and D; *_stride the element strides from one b to the next.
  void gemm_rows(Stream st, int64_t batch, int64_t m, int64_t n, int64_t k, const void* w, int64_t w_stride,
                 const void* x, int64_t ldx, int64_t x_stride, void* d, int64_t ldd, int64_t d_stride) {
    const float alpha = 1.0f, beta = 0.0f;
    cublasSetStream(h_, static_cast<cudaStream_t>(st));
    // Column-major, D_b^T [m, n] = W_b [m, k] (W_b^T stored k-major: op T) * X_b^T [k, n]. One GEMM goes through
    // cublasGemmEx, the call the GEMM ceiling has always been measured with, so its kernel choice stays the same.
    if (batch == 1) {
      if (cublasGemmEx(h_, CUBLAS_OP_T, CUBLAS_OP_N, int(m), int(n), int(k), &alpha, w, CUDA_R_16BF, int(k), x,
                       CUDA_R_16BF, int(ldx), &beta, d, CUDA_R_16BF, int(ldd), CUBLAS_COMPUTE_32F,
                       CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
        throw CudaError("bench", "cublasGemmEx failed");
      return;
    }
    if (cublasGemmStridedBatchedEx(h_, CUBLAS_OP_T, CUBLAS_OP_N, int(m), int(n), int(k), &alpha, w, CUDA_R_16BF,
                                   int(k), w_stride, x, CUDA_R_16BF, int(ldx), x_stride, &beta, d, CUDA_R_16BF,
                                   int(ldd), d_stride, int(batch), CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
      throw CudaError("bench", "cublasGemmStridedBatchedEx failed");
  }

 private:
  cublasHandle_t h_ = nullptr;
};

// cuBLAS bf16 GEMM 8192^3 on random data with fp32 accumulation, as CUDA-graph replays: TFLOP/s, the best of three
// medians (a ceiling is the best rate the GPU reaches). The rate still moves from one process to the next with the
// GPU's state (716-808 TFLOP/s seen on the H200, docs/benchmarks.md), and compute-bound floor fractions with it.
// sustain_s > 0: the same graph is first replayed back to back for that many seconds, untimed, so that the rate is
// the power-limited one that long graph replays run at (670-677 TFLOP/s in eight processes on the H200).
double measure_gemm_rate(bench::Harness& harness, Cublas& cublas, double sustain_s = 0) {
  const int64_t n = 8192;
  cudaStream_t s = static_cast<cudaStream_t>(harness.stream());
  DeviceBuffer a(n * n * 2), b(n * n * 2), d(n * n * 2);
  bench_detail::fill_uniform(a.data(), n * n, true, 1.0f, 11, s);
  bench_detail::fill_uniform(b.data(), n * n, true, 1.0f, 12, s);
  const bench::LaunchFn gemm = [&](int, Stream st) {
    cublas.gemm_rows(st, 1, n, n, n, a.data(), 0, b.data(), n, 0, d.data(), n, 0);
  };
  gemm(0, s);  // lets cuBLAS choose and load its kernel before the capture
  ck(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  bench::TimingOptions t;
  t.graph_calls = 4;
  t.graph_replays = 10;
  if (sustain_s > 0) {  // the same graph back to back first (untimed; one replay is ~5.6 ms on the H200)
    bench::TimingOptions warm = t;
    const auto t0 = std::chrono::steady_clock::now();
    while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < sustain_s)
      harness.graph_time(gemm, 1, warm);
  }
  double best_us = 0.0;
  for (int round = 0; round < 3; ++round) {
    const double us = harness.graph_time(gemm, 1, t).median_us;
    if (round == 0 || us < best_us) best_us = us;
  }
  return 2.0 * n * double(n) * n / (best_us * 1e-6) / 1e12;
}

// MoeBenchOptions::cublas_baseline: GEMM1 and GEMM2 of `batch` experts with `rows` rows each as two cuBLAS
// strided-batched GEMMs on the layer's weights (experts 0 .. batch - 1), from random rows; GEMM2 reads the first
// I columns of GEMM1's output in place of the activation. Buffers grow to the largest call.
class BatchedBaseline {
 public:
  BatchedBaseline(Cublas& cublas, const DeviceBuffer& w13, const DeviceBuffer& w2, int64_t h, int64_t in)
      : cublas_(cublas), w13_(w13), w2_(w2), h_(h), in_(in) {}

  bench::LaunchFn prepare(int64_t batch, int64_t rows, cudaStream_t s) {
    const int64_t n = batch * rows;
    if (n > capacity_) {
      x_ = DeviceBuffer(static_cast<size_t>(n * h_ * 2));
      c1_ = DeviceBuffer(static_cast<size_t>(n * 2 * in_ * 2));
      c2_ = DeviceBuffer(static_cast<size_t>(n * h_ * 2));
      bench_detail::fill_uniform(x_.data(), n * h_, true, 1.0f, 99, s);
      capacity_ = n;
    }
    return [this, batch, rows](int, Stream st) {
      const int64_t i2 = 2 * in_;
      cublas_.gemm_rows(st, batch, i2, rows, h_, w13_.data(), i2 * h_, x_.data(), h_, rows * h_, c1_.data(), i2,
                        rows * i2);
      cublas_.gemm_rows(st, batch, h_, rows, in_, w2_.data(), h_ * in_, c1_.data(), i2, rows * i2, c2_.data(), h_,
                        rows * h_);
    };
  }

 private:
  Cublas& cublas_;
  const DeviceBuffer &w13_, &w2_;
  int64_t h_, in_, capacity_ = 0;
  DeviceBuffer x_, c1_, c2_;
};

std::vector<uint16_t> to_host_bf16(const void* p, int64_t n) {
  std::vector<uint16_t> h(static_cast<size_t>(n));
  ck(cudaMemcpy(h.data(), p, static_cast<size_t>(n * 2), cudaMemcpyDeviceToHost), "cudaMemcpy");
  return h;
}

}  // namespace

MoeBenchReport bench_moe(bench::Harness& harness, const MoeBenchOptions& o) {
  check_moe_bench_options(o);
  const Preset& preset = find_preset(o.preset);
  int device = 0;
  ck(cudaGetDevice(&device), "cudaGetDevice");
  if (!device_is_sm90(device))
    throw NotSupported("bench", fmt::format("device (cuda:{}) must be an sm_90 GPU", device));
  const Device dev = Device::cuda(device);
  cudaStream_t s = static_cast<cudaStream_t>(harness.stream());

  ExpertConfig cfg = preset.experts;
  if (o.gate_up) cfg.gate_up = *o.gate_up;
  const RoutingConfig& rcfg = preset.routing;
  const int64_t max_t = *std::max_element(o.tokens.begin(), o.tokens.end());
  const int64_t ew = cfg.weight_experts(), h = cfg.hidden, in = cfg.intermediate, e = cfg.num_experts;

  DeviceBuffer w13(ew * 2 * in * h * 2), w2(ew * h * in * 2), hidden(max_t * h * 2), out(max_t * h * 2),
      logits(max_t * e * 4), bias(e * 4), skew(e * 4), b13(ew * 2 * in * 4), b2(ew * h * 4);
  bench_detail::fill_uniform(w13.data(), ew * 2 * in * h, true, 1.0f / std::sqrt(float(h)), o.seed * 8 + 1, s);
  bench_detail::fill_uniform(w2.data(), ew * h * in, true, 1.0f / std::sqrt(float(in)), o.seed * 8 + 2, s);
  bench_detail::fill_uniform(hidden.data(), max_t * h, true, 1.0f, o.seed * 8 + 3, s);
  bench_detail::fill_uniform(logits.data(), max_t * e, false, 2.0f, o.seed * 8 + 4, s);
  if (o.logit_skew > 0.0f) {  // a per-expert offset shared by every token's logits
    bench_detail::fill_uniform(skew.data(), e, false, o.logit_skew, o.seed * 8, s);
    bench_detail::add_to_rows(static_cast<float*>(logits.data()), max_t, e, static_cast<const float*>(skew.data()),
                              s);
  }
  bench_detail::fill_uniform(bias.data(), e, false, o.bias_scale, o.seed * 8 + 5, s);
  bench_detail::fill_uniform(b13.data(), ew * 2 * in, false, 0.5f, o.seed * 8 + 6, s);
  bench_detail::fill_uniform(b2.data(), ew * h, false, 0.5f, o.seed * 8 + 7, s);
  ck(cudaStreamSynchronize(s), "cudaStreamSynchronize");

  ExpertWeights w;
  w.w13 = TensorView::contiguous(w13.data(), DType::bf16, {ew, 2 * in, h}, dev);
  w.w2 = TensorView::contiguous(w2.data(), DType::bf16, {ew, h, in}, dev);
  if (preset.has_expert_biases) {
    w.b13 = TensorView::contiguous(b13.data(), DType::f32, {ew, 2 * in}, dev);
    w.b2 = TensorView::contiguous(b2.data(), DType::f32, {ew, h}, dev);
  }
  const TensorView bias_view =
      preset.has_bias ? TensorView::contiguous(bias.data(), DType::f32, {e}, dev) : TensorView{};
  RoutePlan plan(PlanShape{max_t, rcfg.num_experts, rcfg.top_k, rcfg.num_shared_experts, preset.block}, dev);
  CudaExperts layer({cfg, w, max_t, preset.block, dev});
  auto rows_of = [&](const DeviceBuffer& m, int64_t t, int64_t cols, DType dt) {
    return TensorView::contiguous(m.data(), dt, {t, cols}, dev);
  };

  MoeBenchReport report;
  report.preset = preset.name;
  if (preset.has_bias) report.bias_scale = o.bias_scale;
  report.logit_skew = o.logit_skew;
  report.gate_up = cfg.gate_up;
  const bench::Ceilings hc = harness.measure_ceilings();
  report.device = hc.device;
  report.ceilings.copy_tb_per_s = hc.copy_bytes_per_s / 1e12;
  report.ceilings.graph_launch_us = hc.empty_graph_launch_us;
  Cublas cublas;
  report.ceilings.gemm_tflop_per_s = measure_gemm_rate(harness, cublas);
  if (o.sustained_ceiling_s > 0) {
    report.ceilings.gemm_sustained_tflop_per_s = measure_gemm_rate(harness, cublas, o.sustained_ceiling_s);
    report.ceilings.sustained_s = o.sustained_ceiling_s;
  }
  BatchedBaseline baseline(cublas, w13, w2, h, in);

  // Verification against the CPU reference on host copies of the weights (copied on first use).
  std::vector<uint16_t> hw13, hw2;
  std::vector<float> hb13, hb2;
  auto host_weights = [&] {
    if (hw13.empty()) {
      hw13 = to_host_bf16(w13.data(), ew * 2 * in * h);
      hw2 = to_host_bf16(w2.data(), ew * h * in);
      if (preset.has_expert_biases) {
        hb13.resize(ew * 2 * in);
        hb2.resize(ew * h);
        ck(cudaMemcpy(hb13.data(), b13.data(), hb13.size() * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
        ck(cudaMemcpy(hb2.data(), b2.data(), hb2.size() * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
      }
    }
    ExpertWeights hwv;
    hwv.w13 = TensorView::contiguous(hw13.data(), DType::bf16, {ew, 2 * in, h});
    hwv.w2 = TensorView::contiguous(hw2.data(), DType::bf16, {ew, h, in});
    if (preset.has_expert_biases) {
      hwv.b13 = TensorView::contiguous(hb13.data(), DType::f32, {ew, 2 * in});
      hwv.b2 = TensorView::contiguous(hb2.data(), DType::f32, {ew, h});
    }
    return hwv;
  };
  // The reference of n tokens (host rows of hidden and their plan rows) against got; throws above 1e-2.
  auto check_against_reference = [&](std::vector<uint16_t> hx, const RoutePlan& hplan, int64_t n,
                                     const std::vector<uint16_t>& got, std::string_view what) {
    std::vector<uint16_t> want(n * h);
    experts_reference(cfg, host_weights(), TensorView::contiguous(hx.data(), DType::bf16, {n, h}), hplan.view(),
                      TensorView::contiguous(want.data(), DType::bf16, {n, h}));
    const double err = relative_frobenius_bf16(got.data(), want.data(), static_cast<int64_t>(want.size()));
    if (!(err <= 1e-2))
      throw Internal("bench", fmt::format("verification {} failed: relative Frobenius error ({:.3g}) must be <= 1e-2",
                                          what, err));
    return err;
  };
  // Once per (tactic pair, token count): the whole call at t tokens.
  std::map<std::pair<int, int>, double> verified;
  auto verify = [&](ExpertTactic tactic, int64_t t) {
    const auto key = std::make_pair(tactic.gemm1 * 100 + tactic.gemm2, static_cast<int>(t));
    if (auto it = verified.find(key); it != verified.end()) return it->second;
    route(rcfg, rows_of(logits, t, e, DType::f32), bias_view, plan, s);
    layer.run(plan, rows_of(hidden, t, h, DType::bf16), rows_of(out, t, h, DType::bf16), s, tactic);
    ck(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    RoutePlan hplan(PlanShape{t, rcfg.num_experts, rcfg.top_k, rcfg.num_shared_experts, preset.block}, Device::cpu());
    copy_plan(plan, hplan);
    const double err =
        check_against_reference(to_host_bf16(hidden.data(), t * h), hplan, t, to_host_bf16(out.data(), t * h),
                                fmt::format("of tactic {}/{} at T={}", tactic.gemm1, tactic.gemm2, t));
    verified[key] = err;
    return err;
  };
  // The call that is timed, on `plan` as routed for its t tokens: kSampledTokens of its tokens, first to last, each
  // with its plan row, against the reference of those tokens alone.
  auto verify_sampled = [&](ExpertTactic tactic, int64_t t) {
    layer.run(plan, rows_of(hidden, t, h, DType::bf16), rows_of(out, t, h, DType::bf16), s, tactic);
    const int64_t n = std::min(t, kSampledTokens);
    const int64_t kt = rcfg.top_k + rcfg.num_shared_experts;
    RoutePlan hplan(PlanShape{n, rcfg.num_experts, rcfg.top_k, rcfg.num_shared_experts, preset.block}, Device::cpu());
    RoutePlanView& v = hplan.mutable_view();
    std::vector<uint16_t> hx(n * h), got(n * h);
    auto fetch = [&](void* to, const void* from, int64_t offset, int64_t bytes) {
      ck(cudaMemcpyAsync(to, static_cast<const char*>(from) + offset, static_cast<size_t>(bytes),
                         cudaMemcpyDeviceToHost, s),
         "cudaMemcpyAsync");
    };
    for (int64_t i = 0; i < n; ++i) {
      const int64_t token = n == 1 ? 0 : i * (t - 1) / (n - 1);
      fetch(v.topk_ids + i * kt, plan.view().topk_ids, token * kt * 4, kt * 4);
      fetch(v.topk_weights + i * kt, plan.view().topk_weights, token * kt * 4, kt * 4);
      fetch(hx.data() + i * h, hidden.data(), token * h * 2, h * 2);
      fetch(got.data() + i * h, out.data(), token * h * 2, h * 2);
    }
    ck(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    build_plan_reference(n, v);
    return check_against_reference(
        std::move(hx), hplan, n, got,
        fmt::format("of tactic {}/{} at T={} ({} sampled tokens)", tactic.gemm1, tactic.gemm2, t, n));
  };

  const auto tactics = cuda_expert_gemm_tactics();
  bench::TimingOptions timing;
  timing.samples = o.samples;
  timing.graph_replays = o.samples;
  for (int64_t t : o.tokens) {
    MoeBenchRow row;
    row.tokens = t;
    ExpertTactic tactic = layer.default_tactic(t);
    if (o.tactic.gemm1 >= 0) tactic.gemm1 = o.tactic.gemm1;
    if (o.tactic.gemm2 >= 0) tactic.gemm2 = o.tactic.gemm2;
    row.verify_error = verify(tactic, std::min(t, o.verify_tokens));  // run() rejects unknown tactics first
    row.gemm1 = tactics[tactic.gemm1].name;
    row.gemm2 = tactics[tactic.gemm2].name;

    const TensorView lv = rows_of(logits, t, e, DType::f32), hv = rows_of(hidden, t, h, DType::bf16),
                     ov = rows_of(out, t, h, DType::bf16);
    route(rcfg, lv, bias_view, plan, s);
    std::vector<int32_t> counts(rcfg.num_experts + rcfg.num_shared_experts);
    ck(cudaMemcpyAsync(counts.data(), plan.view().expert_counts, counts.size() * 4, cudaMemcpyDeviceToHost, s),
       "cudaMemcpy counts");
    ck(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    // Where T <= verify_tokens, verify() already ran this very call whole.
    row.sampled_verify_error = t <= o.verify_tokens ? row.verify_error : verify_sampled(tactic, t);
    int64_t rows = 0, routed_rows = 0;
    int routed = 0;
    for (int g = 0; g < static_cast<int>(counts.size()); ++g) {
      const bool local =
          g >= e || (g >= cfg.local_expert_offset && g < cfg.local_expert_offset + cfg.local_experts());
      if (!local || counts[g] == 0) continue;
      ++row.active_experts;
      rows += counts[g];
      if (g < e) {
        ++routed;
        routed_rows += counts[g];
        row.max_expert_rows = std::max<int64_t>(row.max_expert_rows, counts[g]);
      }
    }
    row.mean_expert_rows = routed > 0 ? double(routed_rows) / routed : 0.0;
    row.bytes = double(row.active_experts) * 3.0 * h * in * 2 + 2.0 * t * h * 2;
    row.flops = 6.0 * double(rows) * h * in;
    auto floor_at = [&](double tflop_per_s) {  // us
      return std::max(row.bytes / (report.ceilings.copy_tb_per_s * 1e12), row.flops / (tflop_per_s * 1e12)) * 1e6;
    };
    row.floor_us = floor_at(report.ceilings.gemm_tflop_per_s);
    if (report.ceilings.gemm_sustained_tflop_per_s > 0)
      row.floor_sustained_us = floor_at(report.ceilings.gemm_sustained_tflop_per_s);

    const bench::LaunchFn experts = [&](int, Stream st) { layer.run(plan, hv, ov, st, tactic); };
    const bench::LaunchFn both = [&](int, Stream st) {
      route(rcfg, lv, bias_view, plan, st);
      layer.run(plan, hv, ov, st, tactic);
    };
    row.experts_cold_us = harness.kernel_time(experts, 1, timing).median_us;
    row.kernels = harness.kernels_per_call();
    row.experts_kernels = harness.kernel_breakdown();
    report.timing_source = harness.kernel_time_source();
    row.experts_graph_us = harness.graph_time(experts, 1, timing).median_us;
    row.route_experts_cold_us = harness.kernel_time(both, 1, timing).median_us;
    row.route_experts_kernels = harness.kernel_breakdown();
    row.route_experts_graph_us = harness.graph_time(both, 1, timing).median_us;
    if (o.cublas_baseline && row.active_experts > 0) {  // a rank's experts may all be idle
      const int64_t batch = row.active_experts;
      row.cublas_rows_per_expert = (rows + batch - 1) / batch;
      const bench::LaunchFn ref = baseline.prepare(batch, row.cublas_rows_per_expert, s);
      // kernel_time's warm-up calls let cuBLAS choose and load its kernels before the timed samples
      row.cublas_cold_us = harness.kernel_time(ref, 1, timing).median_us;
      row.cublas_kernels = harness.kernel_breakdown();
    }
    report.rows.push_back(row);
  }
  return report;
}

#else
MoeBenchReport bench_moe(bench::Harness&, const MoeBenchOptions& o) {
  check_moe_bench_options(o);
  throw NotSupported("bench", "moe benchmark (cuda) is not available: moekit was built without CUDA");
}
#endif

void check_moe_bench_options(const MoeBenchOptions& o) {
  find_preset(o.preset);
  if (o.tokens.empty()) throw InvalidArgument("bench", "tokens (empty) must list at least one token count");
  for (int64_t t : o.tokens)
    if (t < 1) throw InvalidArgument("bench", fmt::format("tokens ({}) must be >= 1", t));
  if (o.verify_tokens < 1)
    throw InvalidArgument("bench", fmt::format("verify_tokens ({}) must be >= 1", o.verify_tokens));
  if (o.samples < 1) throw InvalidArgument("bench", fmt::format("samples ({}) must be >= 1", o.samples));
  if (!std::isfinite(o.bias_scale) || o.bias_scale < 0.0f)
    throw InvalidArgument("bench", fmt::format("bias_scale ({}) must be finite and >= 0", o.bias_scale));
  if (!std::isfinite(o.logit_skew) || o.logit_skew < 0.0f)
    throw InvalidArgument("bench", fmt::format("logit_skew ({}) must be finite and >= 0", o.logit_skew));
  if (!std::isfinite(o.sustained_ceiling_s) || o.sustained_ceiling_s < 0 || o.sustained_ceiling_s > 60)
    throw InvalidArgument(
        "bench", fmt::format("sustained_ceiling_s ({}) must be finite and in [0, 60]", o.sustained_ceiling_s));
}

}  // namespace moekit

// `moekit bench moe --preset NAME --tokens LIST [--samples N] [--gemm1 I --gemm2 J] [--kernels] [--cublas]
// [--json PATH]`: verifies the bf16 GPU experts of a preset against the CPU reference, then times experts-only and
// route + experts (cold-L2 kernel time and CUDA-graph replay, through the shared harness) with the ceilings measured
// in the same run, and prints a markdown table with the fraction of the roofline floor (with --cublas, then the
// batched cuBLAS reference of each T; with --kernels, then each T's kernels).
// `--tuned` instead compares, per T (default 1, 64, 4096), the autotuner's pair with the default heuristic's pair on
// the "cuda_bf16" layer runner: staged tuning of T's bucket, verification of both pairs against the reference
// runner, then route + experts of each pair as CUDA-graph replay medians in the same run, the tuned pair's timings
// bracketed by the default's (bracketed_ratio()). The tuner times on the comparison's logits (TuneOptions::logits),
// skewed with --logit-skew.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_util.h"
#include "commands.h"
#include "moekit/bench.h"
#include "moekit/cuda_experts.h"
#include "moekit/device.h"
#include "moekit/error.h"
#include "moekit/layer.h"
#include "moekit/presets.h"
#include "moekit/tuner.h"

namespace moekit::cli {
namespace {

struct BenchMoeCli {
  std::string preset;
  std::vector<int64_t> tokens{1, 16, 64, 256, 1024, 4096, 16384};
  int samples = 100;
  int64_t verify_tokens = 64;
  uint64_t seed = 1;
  int gemm1 = -1, gemm2 = -1;
  std::string json;
  float bias_scale = kSyntheticBiasScale;
  float logit_skew = 0.0f;
  std::string gate_up;
  bool tuned = false;
  bool kernels = false;
  bool cublas = false;
  double sustained_ceiling_s = 0;
  bool tokens_given = false;
};

nlohmann::json kernels_json(const std::vector<bench::KernelStat>& kernels) {
  nlohmann::json ks = nlohmann::json::array();
  for (const bench::KernelStat& k : kernels)
    ks.push_back({{"name", k.name},
                  {"median_us", k.duration.median_us},
                  {"p10_us", k.duration.p10_us},
                  {"p90_us", k.duration.p90_us},
                  {"start_gap_us", k.start_gap_us}});
  return ks;
}

nlohmann::json to_json(const MoeBenchReport& r) {
  nlohmann::json j;
  j["preset"] = r.preset;
  j["device"] = r.device;
  j["timing_source"] = r.timing_source;
  j["bias_scale"] = r.bias_scale ? nlohmann::json(*r.bias_scale) : nlohmann::json(nullptr);
  j["logit_skew"] = r.logit_skew;
  j["gate_up"] = std::string(gate_up_layout_name(r.gate_up));
  j["ceilings"] = {{"copy_tb_per_s", r.ceilings.copy_tb_per_s},
                   {"gemm_tflop_per_s", r.ceilings.gemm_tflop_per_s},
                   {"graph_launch_us", r.ceilings.graph_launch_us},
                   {"gemm_sustained_tflop_per_s", r.ceilings.gemm_sustained_tflop_per_s},
                   {"sustained_s", r.ceilings.sustained_s}};
  for (const MoeBenchRow& x : r.rows) {
    j["rows"].push_back({{"tokens", x.tokens},
                         {"gemm1", x.gemm1},
                         {"gemm2", x.gemm2},
                         {"active_experts", x.active_experts},
                         {"mean_expert_rows", x.mean_expert_rows},
                         {"max_expert_rows", x.max_expert_rows},
                         {"kernels", x.kernels},
                         {"bytes", x.bytes},
                         {"flops", x.flops},
                         {"floor_us", x.floor_us},
                         {"experts_cold_us", x.experts_cold_us},
                         {"experts_graph_us", x.experts_graph_us},
                         {"route_experts_cold_us", x.route_experts_cold_us},
                         {"route_experts_graph_us", x.route_experts_graph_us},
                         {"floor_fraction_graph", x.floor_us / x.experts_graph_us},
                         {"floor_fraction_cold", x.floor_us / x.experts_cold_us},
                         {"verify_error", x.verify_error},
                         {"sampled_verify_error", x.sampled_verify_error}});
    if (x.floor_sustained_us > 0) {
      j["rows"].back()["floor_sustained_us"] = x.floor_sustained_us;
      j["rows"].back()["floor_fraction_graph_sustained"] = x.floor_sustained_us / x.experts_graph_us;
    }
    j["rows"].back()["experts_kernels"] = kernels_json(x.experts_kernels);
    j["rows"].back()["route_experts_kernels"] = kernels_json(x.route_experts_kernels);
    if (x.cublas_rows_per_expert > 0)
      j["rows"].back()["cublas_baseline"] = {{"rows_per_expert", x.cublas_rows_per_expert},
                                             {"cold_us", x.cublas_cold_us},
                                             {"floor_fraction_cold", x.floor_us / x.cublas_cold_us},
                                             {"kernels", kernels_json(x.cublas_kernels)}};
  }
  return j;
}

void print_table(const MoeBenchReport& r) {
  std::printf("%s", fmt::format("moe bench: {} (w13 {}) on {}; ceilings: copy {:.2f} TB/s, bf16 GEMM {:.0f} TFLOP/s, "
                                "graph launch {:.1f} us; cold = kernel time from {}\n",
                                r.preset, gate_up_layout_name(r.gate_up), r.device, r.ceilings.copy_tb_per_s,
                                r.ceilings.gemm_tflop_per_s, r.ceilings.graph_launch_us, r.timing_source)
                        .c_str());
  const bool sustained = r.ceilings.gemm_sustained_tflop_per_s > 0;
  if (sustained)
    std::printf("%s", fmt::format("sustained bf16 GEMM ceiling: {:.0f} TFLOP/s after {:.3g} s of it back to back "
                                  "(floor fraction (sustained): against it)\n",
                                  r.ceilings.gemm_sustained_tflop_per_s, r.ceilings.sustained_s)
                          .c_str());
  if (r.bias_scale)
    std::printf(
        "%s",
        fmt::format("selection bias uniform in [-S, S) with S = {:.3g}, logits in [-2, 2)\n", *r.bias_scale).c_str());
  if (r.logit_skew > 0.0f)
    std::printf("%s",
                fmt::format("routing skew: each expert's logits offset by a fixed value uniform in [-S, S) with "
                            "S = {:.3g}, logits in [-2, 2)\n",
                            r.logit_skew)
                    .c_str());
  std::printf(
      "| T | gemm1 / gemm2 | experts | rows per routed expert (mean / max) | floor us | experts cold us "
      "| experts graph us | route+experts cold us | route+experts graph us | TB/s | TFLOP/s "
      "| floor fraction (graph) | (cold) | verify err | sampled err |%s\n",
      sustained ? " floor fraction (sustained) |" : "");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|%s\n", sustained ? "---|" : "");
  for (const MoeBenchRow& x : r.rows) {
    std::printf(
        "%s",
        fmt::format(
            "| {} | {} / {} | {} | {:.1f} / {} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.2f} | {:.0f} | "
            "{:.2f} | {:.2f} | {:.1e} | {:.1e} |{}\n",
            x.tokens, x.gemm1, x.gemm2, x.active_experts, x.mean_expert_rows, x.max_expert_rows, x.floor_us,
            x.experts_cold_us, x.experts_graph_us, x.route_experts_cold_us, x.route_experts_graph_us,
            x.bytes / (x.experts_graph_us * 1e-6) / 1e12, x.flops / (x.experts_graph_us * 1e-6) / 1e12,
            x.floor_us / x.experts_graph_us, x.floor_us / x.experts_cold_us, x.verify_error, x.sampled_verify_error,
            sustained ? fmt::format(" {:.2f} |", x.floor_sustained_us / x.experts_graph_us) : std::string())
            .c_str());
  }
}

// --cublas: the batched cuBLAS reference beside the experts call, both cold.
void print_baseline(const MoeBenchReport& r) {
  std::printf(
      "\ncuBLAS strided-batched GEMM1 + GEMM2 on the same weights, the call's rows split evenly over its active "
      "experts (no routing skew, gather, activation or combine); cold L2, median us\n| T | experts | rows per expert "
      "| cuBLAS us | kernels | experts cold us | experts / cuBLAS | floor fraction of cuBLAS |\n"
      "|---|---|---|---|---|---|---|---|\n");
  for (const MoeBenchRow& x : r.rows) {
    if (x.cublas_rows_per_expert == 0) {  // no active expert: nothing was timed
      std::printf("%s",
                  fmt::format("| {} | 0 | - | - | - | {:.1f} | - | - |\n", x.tokens, x.experts_cold_us).c_str());
      continue;
    }
    std::printf("%s",
                fmt::format("| {} | {} | {} | {:.1f} | {} | {:.1f} | {:.3f} | {:.2f} |\n", x.tokens, x.active_experts,
                            x.cublas_rows_per_expert, x.cublas_cold_us, x.cublas_kernels.size(), x.experts_cold_us,
                            x.experts_cold_us / x.cublas_cold_us, x.floor_us / x.cublas_cold_us)
                    .c_str());
  }
}

void print_kernel_table(std::string_view what, int64_t tokens, const std::vector<bench::KernelStat>& kernels) {
  std::printf("%s", fmt::format("\nkernels of one {}, T = {} (cold L2, median us; gap: start after the previous "
                                "kernel's end)\n| # | kernel | us | gap us |\n|---|---|---|---|\n",
                                what, tokens)
                        .c_str());
  for (size_t i = 0; i < kernels.size(); ++i) {
    const bench::KernelStat& k = kernels[i];
    std::printf(
        "%s",
        fmt::format("| {} | {} | {:.1f} | {:.2f} |\n", i, k.name, k.duration.median_us, k.start_gap_us).c_str());
  }
}

// Per T, the experts-only call's kernels in launch order (cold L2, medians), the router + experts call's, then the
// cuBLAS reference's (--cublas).
void print_kernels(const MoeBenchReport& r) {
  for (const MoeBenchRow& x : r.rows) {
    print_kernel_table("experts call", x.tokens, x.experts_kernels);
    print_kernel_table("router + experts call", x.tokens, x.route_experts_kernels);
    if (!x.cublas_kernels.empty()) print_kernel_table("cuBLAS reference", x.tokens, x.cublas_kernels);
  }
}

// ---- --tuned: the autotuner's pair against the default pair on the layer runner ---------------------------------

struct TunedRow {
  int64_t tokens = 0, bucket = 0;
  std::string default_pair, tuned_pair;
  double default_us = 0, tuned_us = 0;  // route + experts per call, graph replay median (median of the rounds)
  double default_over_tuned = 0;        // 1 / bracketed_ratio() of the tuned pair's replays to the default's
  double default_spread = 0;            // bracketing_spread() of the default's replays: what that ratio cannot cancel
  TuneResult tuning;                    // the tuner's own timings (final stage)
  double tune_s = 0;                    // wall time of the staged tuning of this bucket
  int timings = 0;                      // configurations the tuner timed
  double default_err = 0, tuned_err = 0;  // verification (relative Frobenius error); -1 when skipped
};

std::string pair_name(const Runner& r, TacticPair p) {
  return fmt::format("{} / {}", r.gemm1_tactics()[p.gemm1].name, r.gemm2_tactics()[p.gemm2].name);
}

// Hidden states and logits for `variants` windows of up to `rows` tokens each, on the host and on the GPU.
struct TunedInputs {
  int64_t rows, h, e;
  std::vector<uint16_t> hidden;
  std::vector<float> logits;
  DeviceBuffer d_hidden, d_logits, d_out;

  // logit_skew > 0: each expert's logits get a fixed offset uniform in [-logit_skew, logit_skew), as in bench_moe()
  // (drawn from the host generator, so the offsets differ from the plain benchmark's for the same seed).
  TunedInputs(const LayerSpec& s, int64_t rows, int variants, uint64_t seed, float logit_skew)
      : rows(rows),
        h(s.experts.hidden),
        e(s.routing.num_experts),
        hidden(static_cast<size_t>(rows * variants * h)),
        logits(static_cast<size_t>(rows * variants * e)),
        d_hidden(hidden.size() * 2),
        d_logits(logits.size() * 4),
        d_out(static_cast<size_t>(rows * h * 2)) {
    cli::fill_uniform_bf16(hidden.data(), static_cast<int64_t>(hidden.size()), seed * 8 + 3, -1.0f, 1.0f);
    cli::fill_uniform(logits.data(), static_cast<int64_t>(logits.size()), seed * 8 + 4, -2.0f, 2.0f);
    if (logit_skew > 0.0f) {
      std::vector<float> skew(static_cast<size_t>(e));
      cli::fill_uniform(skew.data(), e, seed * 8, -logit_skew, logit_skew);
      for (size_t i = 0; i < logits.size(); ++i) logits[i] += skew[i % skew.size()];
    }
    d_hidden.upload(hidden.data(), hidden.size() * 2);
    d_logits.upload(logits.data(), logits.size() * 4);
  }
  // Every window's logits, [rows * variants, E] fp32 on the GPU, for the tuner to time on.
  TensorView all_logits() const {
    return TensorView::contiguous(d_logits.data(), DType::f32, {static_cast<int64_t>(logits.size()) / e, e},
                                  Device::cuda(d_out.device()));
  }
  LayerInputs gpu(int64_t t, int variant) const {
    const Device d = Device::cuda(d_out.device());
    char* x = static_cast<char*>(d_hidden.data()) + variant * rows * h * 2;  // [t, H] bf16 window
    char* l = static_cast<char*>(d_logits.data()) + variant * rows * e * 4;  // [t, E] fp32 window
    return {TensorView::contiguous(x, DType::bf16, {t, h}, d),
            TensorView::contiguous(l, DType::f32, {t, e}, d),
            TensorView::contiguous(d_out.data(), DType::bf16, {t, h}, d),
            {}};
  }
};

// Relative error of `pair` on the first t tokens against the reference runner (same synthetic weights).
double verify_pair(Runner& gpu, Runner& ref, TunedInputs& in, TacticPair pair, int64_t t) {
  std::vector<uint16_t> want(static_cast<size_t>(t * in.h)), got(want.size(), 0xFFFF);
  in.d_out.upload(got.data(), got.size() * 2);  // NaN poison: an unwritten element fails the check
  ref.execute({TensorView::contiguous(in.hidden.data(), DType::bf16, {t, in.h}),
               TensorView::contiguous(in.logits.data(), DType::f32, {t, in.e}),
               TensorView::contiguous(want.data(), DType::bf16, {t, in.h}),
               {}},
              {0, 0});
  gpu.execute(in.gpu(t, 0), pair);
  in.d_out.download(got.data(), got.size() * 2);
  const double err = relative_frobenius_bf16(got.data(), want.data(), static_cast<int64_t>(want.size()));
  if (!(err <= 1e-2))
    throw Internal("bench", fmt::format("verification of {} at T={} failed: relative Frobenius error ({:.3g}) must "
                                        "be <= 1e-2",
                                        pair_name(gpu, pair), t, err));
  return err;
}

// The smallest ratio of the tuner's final stage ("-" without one); when its pair is not the pick, the bound a pair
// had to stay below (TuneResult::threshold).
std::string best_final_ratio(const TuneResult& r) {
  if (r.final_stage.empty()) return "-";
  const auto it =
      std::min_element(r.final_stage.begin(), r.final_stage.end(),
                       [](const FinalStageTiming& a, const FinalStageTiming& b) { return a.ratio < b.ratio; });
  return it->tactics == r.best ? fmt::format("{:.3f}", it->ratio)
                               : fmt::format("{:.3f} (not taken, bound {:.3f})", it->ratio, r.threshold);
}

nlohmann::json final_stage_json(const Runner& r, const TuneResult& t) {
  nlohmann::json j = nlohmann::json::array();
  for (const FinalStageTiming& f : t.final_stage)
    j.push_back({{"pair", pair_name(r, f.tactics)}, {"seconds", f.seconds}, {"ratio", f.ratio}});
  return j;
}

void run_tuned(const BenchMoeCli& o) {
  const Preset& preset = find_preset(o.preset);
  if (o.gemm1 >= 0 || o.gemm2 >= 0) throw InvalidArgument("bench", "--tuned picks the tactics: drop --gemm1/--gemm2");
  const std::vector<int64_t> tokens = o.tokens_given ? o.tokens : std::vector<int64_t>{1, 64, 4096};
  // The plain benchmark's rules for the options both take (token counts, samples, skew).
  check_moe_bench_options({.preset = o.preset, .tokens = tokens, .samples = o.samples, .logit_skew = o.logit_skew});
  const LayerSpec spec = preset_layer_spec(preset);
  register_cuda_runners();
  std::unique_ptr<Runner> gpu = make_runner("cuda_bf16");
  if (const Support s = gpu->check_support(spec, Device::cuda(0)); !s.ok)
    throw NotSupported("bench", fmt::format("runner cuda_bf16 cannot run preset {} here: {}", preset.name, s.reason));
  bench::Harness harness;  // before any timing: it owns the stream and the CUPTI subscription
  const int64_t max_t = *std::max_element(tokens.begin(), tokens.end());
  auto t0 = std::chrono::steady_clock::now();
  gpu->build_synthetic(max_t, o.seed);
  // The reference runner's synthetic weights for the same seed are the same numbers (runtime/synthetic.h and its
  // device twin), so the two runners compute the same layer.
  std::unique_ptr<Runner> ref = make_runner("reference");
  const bool verify = o.verify_tokens > 0;
  if (verify) {
    ref->check_support(spec, Device::cpu());
    ref->build_synthetic(std::min(max_t, o.verify_tokens), o.seed);
  }
  const double setup_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  constexpr int kVariants = 4;  // token windows rotated through the replays, so weights are not all L2-resident
  constexpr int kRounds = 3;    // timings of the tuned pair, each between two of the default
  TunedInputs in(spec, max_t, kVariants, o.seed, o.logit_skew);
  const TuneOptions tune_options{.logits = in.all_logits()};

  Autotuner tuner(CacheMetadata::current());
  bench::TimingOptions timing;
  timing.graph_calls = 8;
  timing.graph_replays = o.samples;
  std::vector<TunedRow> rows;
  for (int64_t t : tokens) {
    TunedRow row;
    row.tokens = t;
    row.bucket = token_bucket(t);
    const auto start = std::chrono::steady_clock::now();
    const int64_t request[] = {t};
    const TuneResult r = tuner.tune(*gpu, spec, request, tune_options).front();
    row.tune_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    row.timings = r.timed_configs;
    row.tuning = r;
    // What MoELayer::forward() runs for t without and with the entry (a winner equal to the default where the bucket
    // was timed leaves the default for t in force).
    const TacticPair def = gpu->default_tactics(t), best = tuner.choose(*gpu, spec, t).tactics;
    row.default_pair = pair_name(*gpu, def);
    row.tuned_pair = pair_name(*gpu, best);
    const int64_t vt = std::min(t, o.verify_tokens);
    row.default_err = verify ? verify_pair(*gpu, *ref, in, def, vt) : -1;
    row.tuned_err = verify ? verify_pair(*gpu, *ref, in, best, vt) : -1;
    auto replay_us = [&](TacticPair p) {
      const bench::LaunchFn fn = [&](int v, Stream st) { gpu->execute(in.gpu(t, v), p, st); };
      return harness.graph_time(fn, kVariants, timing).median_us;
    };
    // Rounds of the tuned pair, each between two of the default, compared by bracketed_ratio(), so that a drift
    // linear in time cancels. (With the best of two rounds, a pair that was both the default and the tuned choice
    // came out up to 4% apart from itself, qwen3-30b-a3b, T = 16384; with the medians of three alternating rounds,
    // the default first in each, 3.2% apart, qwen3-30b-a3b, T = 4096; H200.)
    std::vector<double> d{replay_us(def)}, b;
    for (int round = 0; round < kRounds; ++round) {
      b.push_back(replay_us(best));
      d.push_back(replay_us(def));
    }
    row.default_us = bench::summarize(d).median_us;
    row.tuned_us = bench::summarize(b).median_us;
    row.default_over_tuned = 1.0 / bracketed_ratio(d, b, 0.5);
    row.default_spread = bracketing_spread(d);
    rows.push_back(row);
  }

  std::printf(
      "%s", fmt::format(
                "moe bench --tuned: {} on {}, runner {}@{}; route + experts per call, CUDA-graph "
                "replay medians ({} replays of {} calls over {} token windows), {} timings of the tuned pair, each "
                "between two of the default (default / tuned: the drift-corrected ratio; default spread: how far "
                "the default's timings strayed from a straight line, which that ratio cannot cancel); tuner ratio: "
                "the best final-stage pair's time over the default's, as the tuner measured it (a pair replaces the "
                "default below the bound: {:.2f}, or lower where the default's timings strayed); synthetic weights "
                "built in {:.1f} s{}\n",
                preset.name, device_info(0).name, gpu->name(), gpu->version(), o.samples, timing.graph_calls,
                kVariants, kRounds, 1.0 - kMinTunedGain, setup_s,
                o.logit_skew > 0.0f ? fmt::format("; tuned and timed with each expert's logits offset by a fixed "
                                                  "value uniform in [-S, S) with S = {}",
                                                  o.logit_skew)
                                    : "")
                .c_str());
  std::printf(
      "| T | bucket | default gemm1 / gemm2 | tuned gemm1 / gemm2 | default us | tuned us | default / tuned "
      "| default spread | tuner ratio | tuning s | timings | verify err (default, tuned) "
      "|\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  double total_tune = 0;
  for (const TunedRow& x : rows) {
    total_tune += x.tune_s;
    std::printf("%s",
                fmt::format("| {} | {} | {} | {} | {:.1f} | {:.1f} | {:.3f} | {:.1f}% | {} | {:.2f} | {} | {} |\n",
                            x.tokens, x.bucket, x.default_pair, x.tuned_pair, x.default_us, x.tuned_us,
                            x.default_over_tuned, 100.0 * x.default_spread, best_final_ratio(x.tuning), x.tune_s,
                            x.timings, verify ? fmt::format("{:.1e}, {:.1e}", x.default_err, x.tuned_err) : "skipped")
                    .c_str());
  }
  std::printf("%s", fmt::format("staged tuning: {:.2f} s for {} bucket(s)\n", total_tune, rows.size()).c_str());
  if (!o.json.empty()) {
    nlohmann::json j;
    j["preset"] = preset.name;
    j["device"] = device_info(0).name;
    j["runner"] = fmt::format("{}@{}", gpu->name(), gpu->version());
    j["logit_skew"] = o.logit_skew;
    for (const TunedRow& x : rows)
      j["rows"].push_back({{"tokens", x.tokens},
                           {"bucket", x.bucket},
                           {"default_pair", x.default_pair},
                           {"tuned_pair", x.tuned_pair},
                           {"default_us", x.default_us},
                           {"tuned_us", x.tuned_us},
                           {"default_over_tuned", x.default_over_tuned},
                           {"default_spread", x.default_spread},
                           {"tuner_default_timings_s", x.tuning.default_timings},
                           {"tuner_default_spread", x.tuning.default_spread},
                           {"tuner_threshold", x.tuning.threshold},
                           {"tuner_final_stage", final_stage_json(*gpu, x.tuning)},
                           {"tune_s", x.tune_s},
                           {"timings", x.timings},
                           {"default_err", x.default_err},
                           {"tuned_err", x.tuned_err}});
    write_json_file("bench", o.json, j.dump(2));
  }
}

}  // namespace

void add_bench_moe_command(CLI::App& bench) {
  auto opts = std::make_shared<BenchMoeCli>();
  CLI::App* cmd = bench.add_subcommand("moe", "Verify, then time the bf16 GPU experts of a preset");
  cmd->add_option("--preset", opts->preset, "Layer preset (see moekit/presets.h)")->required();
  CLI::Option* tokens = cmd->add_option("--tokens", opts->tokens, "Token counts to time (--tuned: 1,64,4096)");
  tokens->delimiter(',');
  cmd->add_option("--samples", opts->samples, "Timed samples per measurement (median)");
  cmd->add_option("--verify-tokens", opts->verify_tokens,
                  "Tokens of the verification run of each tactic pair (>= 1; with --tuned, 0 skips it)");
  cmd->add_option("--seed", opts->seed, "Seed of the hash-generated weights, hidden states and logits");
  cmd->add_option("--gemm1", opts->gemm1, "GEMM1 tactic index (default: the heuristic)");
  cmd->add_option("--gemm2", opts->gemm2, "GEMM2 tactic index (default: the heuristic)");
  cmd->add_option("--json", opts->json, "Write the report as JSON to this path");
  CLI::Option* tuned =
      cmd->add_flag("--tuned", opts->tuned,
                    "Tune each T's bucket on the cuda_bf16 runner and time the tuned pair against the default pair");
  cmd->add_flag("--kernels", opts->kernels,
                "Also print each T's experts kernels and router + experts kernels (cold L2 median and start gap)")
      ->excludes(tuned);
  cmd->add_option("--bias-scale", opts->bias_scale,
                  "Presets with a selection bias: bias uniform in [-S, S) against logits in [-2, 2); the default "
                  "0.01 sends rows to every expert, 0.5 concentrates them (deepseek-v3: 45-89 of 256 experts)")
      ->excludes(tuned);
  cmd->add_option(
      "--logit-skew", opts->logit_skew,
      "Routing skew: each expert's logits offset by a fixed value uniform in [-S, S) (logits in [-2, 2)), "
      "so some experts draw more rows than others; 0 (the default): every expert equally likely (--tuned: the "
      "tuner times on these logits too)");
  cmd->add_flag("--cublas", opts->cublas,
                "Also time cuBLAS strided-batched GEMM1 and GEMM2 on the same weights with the call's rows split "
                "evenly over its active experts (a same-run reference without routing skew, gather, activation or "
                "combine)")
      ->excludes(tuned);
  cmd->add_option("--sustained-ceiling", opts->sustained_ceiling_s,
                  "Also measure the GEMM ceiling after this many seconds of it back to back (the power-limited "
                  "state of long graph replays) and print the floor fraction against it; 0 (the default): not "
                  "measured, at most 60")
      ->excludes(tuned);
  CLI::Option* gate_up =
      cmd->add_option("--gate-up", opts->gate_up,
                      "w13's gate/up arrangement instead of the preset's: gate_first, up_first or interleaved (as an "
                      "engine that rearranges the checkpoint at load time runs it)")
          ->excludes(tuned);
  cmd->callback([opts, tokens, gate_up] {
    if (opts->tuned) {
      opts->tokens_given = tokens->count() > 0;
      run_tuned(*opts);
      return;
    }
    MoeBenchOptions o;
    o.preset = opts->preset;
    o.tokens = opts->tokens;
    o.samples = opts->samples;
    o.verify_tokens = opts->verify_tokens;
    o.seed = opts->seed;
    o.tactic = {opts->gemm1, opts->gemm2};
    o.bias_scale = opts->bias_scale;
    o.logit_skew = opts->logit_skew;
    o.cublas_baseline = opts->cublas;
    o.sustained_ceiling_s = opts->sustained_ceiling_s;
    if (gate_up->count() > 0) o.gate_up = parse_gate_up_layout(opts->gate_up);
    check_moe_bench_options(o);  // bad arguments are reported before any device setup
    bench::Harness harness;
    const MoeBenchReport report = bench_moe(harness, o);
    print_table(report);
    if (opts->cublas) print_baseline(report);
    if (opts->kernels) print_kernels(report);
    if (!opts->json.empty()) write_json_file("bench", opts->json, to_json(report).dump(2));
  });
}

}  // namespace moekit::cli

// `moekit tune`: tunes a preset's layer for a list of token counts on the first backend that supports it (with
// the runner's own synthetic weights, and its synthetic logits unless --logits names a file of an engine's routing
// logits) and merges the winners into a persisted cache; `moekit tune --show PATH` prints a cache. Tuning is the
// staged search of moekit/tuner.h; progress goes to stderr (a bar on a terminal).
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <sstream>

#include "cli_util.h"
#include "commands.h"
#include "moekit/device.h"
#include "moekit/error.h"
#include "moekit/layer.h"
#include "moekit/presets.h"
#include "moekit/tuner.h"

namespace moekit::cli {
namespace {

struct TuneCliOptions {
  std::string preset;
  std::string tokens;
  std::string cache;
  std::string backends = "auto";
  std::string device = "auto";
  std::string mode = "skip";
  std::string progress = "auto";
  std::string show;
  std::string logits;  // text file of N x E floats to time on (TuneOptions::logits)
  uint64_t seed = 1;
};

[[noreturn]] void fail(const std::string& message) {
  throw InvalidArgument("tune", message);
}

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) items.push_back(item);
  return items;
}

// "auto" = the first CUDA device when this build and machine have one, else the CPU; "cpu"; "cuda"; "cuda:N".
Device parse_device(const std::string& text) {
  if (text == "auto") return built_with_cuda() && cuda_device_count() > 0 ? Device::cuda(0) : Device::cpu();
  if (text == "cpu") return Device::cpu();
  if (text == "cuda") return Device::cuda(0);
  if (text.rfind("cuda:", 0) == 0) {
    const std::string index = text.substr(5);
    if (!index.empty() && index.find_first_not_of("0123456789") == std::string::npos && index.size() < 6)
      return Device::cuda(std::stoi(index));
  }
  fail(fmt::format("--device ('{}') must be auto, cpu, cuda or cuda:N", text));
}

TuneMode parse_mode(const std::string& text) {
  if (text == "skip") return TuneMode::skip_cached;
  if (text == "shortlist") return TuneMode::retime_shortlist;
  if (text == "full") return TuneMode::full;
  fail(fmt::format("--mode ('{}') must be skip, shortlist or full", text));
}

ProgressStyle parse_progress(const std::string& text) {
  if (text == "auto") return ProgressStyle::detect;
  if (text == "bar") return ProgressStyle::bar;
  if (text == "lines") return ProgressStyle::lines;
  if (text == "none") return ProgressStyle::none;
  fail(fmt::format("--progress ('{}') must be auto, bar, lines or none", text));
}

std::string seconds_text(double s) {
  if (s < 1e-3) return fmt::format("{:.1f} us", s * 1e6);
  if (s < 1.0) return fmt::format("{:.3f} ms", s * 1e3);
  return fmt::format("{:.3f} s", s);
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

void show_cache(const std::string& path) {
  const CacheFile file = Autotuner::read_file(path);
  const CacheMetadata& m = file.metadata;
  fmt::print("cache {}\n  moekit {}, device '{}', {} SMs, CUDA {}\n  {} entries\n", path, m.library_version,
             m.device_name, m.sm_count, m.cuda_version, file.entries.size());
  const std::string mismatch = CacheMetadata::current().mismatch(m);
  if (!mismatch.empty()) fmt::print("  not valid on this machine: {} (this machine vs the file)\n", mismatch);
  for (const auto& [key, e] : file.entries) {
    fmt::print("\n{}\n", key);
    fmt::print("  gemm1={} gemm2={}  {} (default {}, {:.2f}x), timed at T={} on {} routing logits\n", e.gemm1,
               e.gemm2, seconds_text(e.seconds), seconds_text(e.default_seconds),
               e.seconds > 0 ? e.default_seconds / e.seconds : 0.0, e.tokens, e.routing);
    fmt::print("  shortlist: gemm1 [{}] x gemm2 [{}]\n", join(e.gemm1_shortlist), join(e.gemm2_shortlist));
  }
}

void run_tune(const TuneCliOptions& o) {
  if (!o.show.empty()) {
    if (!o.preset.empty() || !o.tokens.empty() || !o.cache.empty())
      fail("--show PATH prints a cache and takes no --preset, --tokens or --cache");
    show_cache(o.show);
    return;
  }
  if (o.preset.empty()) fail("--preset is required (or --show PATH)");
  if (o.tokens.empty()) fail("--tokens is required, e.g. --tokens 1,16,64,256,1024,4096,16384");
  if (o.cache.empty()) fail("--cache is required: the JSON file the winners are merged into");
  const Preset& preset = find_preset(o.preset);
  const std::vector<int64_t> tokens = parse_int_list("tune", o.tokens);
  const Device device = parse_device(o.device);
  TuneOptions options{parse_mode(o.mode), parse_progress(o.progress), stderr};

  const LayerSpec spec = preset_layer_spec(preset);
  // Routing logits to time on: read before anything else is set up, put on the tuning device.
  int64_t logit_rows = 0;
  const std::vector<float> logits = o.logits.empty()
                                        ? std::vector<float>{}
                                        : read_logits_file("tune", o.logits, spec.routing.num_experts, logit_rows);
  DeviceBuffer device_logits;
  if (!logits.empty()) {
    void* data = const_cast<float*>(logits.data());
    if (device.is_cuda()) {
      device_logits = DeviceBuffer(logits.size() * sizeof(float), device.index);
      device_logits.upload(logits.data(), logits.size() * sizeof(float));
      data = device_logits.data();
    }
    options.logits = TensorView::contiguous(data, DType::f32, {logit_rows, spec.routing.num_experts}, device);
  }
  register_cuda_runners();
  const std::vector<std::string> backends = split_commas(o.backends);
  RunnerSelection selection = select_runner(spec, device, backends);
  Runner& runner = *selection.runner;
  for (const BackendVerdict& v : selection.verdicts)
    if (!v.support.ok) fmt::print("backend {}: skipped ({})\n", v.name, v.support.reason);
  int64_t max_tokens = 0;
  for (int64_t t : tokens) max_tokens = std::max(max_tokens, token_bucket(t));
  fmt::print("tuning {} on {} with runner {}@{} ({} GEMM1 x {} GEMM2 tactics), buckets up to {}, {}\n", preset.name,
             device_name(device), runner.name(), runner.version(), runner.gemm1_tactics().size(),
             runner.gemm2_tactics().size(), max_tokens,
             logits.empty() ? std::string("routing the runner's synthetic logits")
                            : fmt::format("routing {} rows of logits from {}", logit_rows, o.logits));
  std::fflush(stdout);

  // The cache first: a corrupted file fails before minutes of weight generation, and a request it answers
  // entirely needs no weights at all.
  Autotuner tuner;
  const Autotuner::LoadReport loaded = tuner.load(o.cache);
  if (!loaded.mismatch.empty())
    fmt::print("ignoring {} entries of {}: metadata differs: {} (this machine vs the file)\n", loaded.ignored,
               o.cache, loaded.mismatch);
  bool needs_timing = options.mode != TuneMode::skip_cached;
  for (int64_t t : tokens) needs_timing = needs_timing || !tuner.choose(runner, spec, t).tuned;
  if (needs_timing) runner.build_synthetic(max_tokens, o.seed);
  const auto start = std::chrono::steady_clock::now();
  const std::vector<TuneResult> results = tuner.tune(runner, spec, tokens, options);
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const Autotuner::SaveReport saved = tuner.save(o.cache);

  fmt::print("\n{:>7} {:>7}  {:<24} {:<24} {:>12} {:>12} {:>8}  {}\n", "T", "bucket", "gemm1", "gemm2", "tuned",
             "default", "speedup", "timings");
  for (const TuneResult& r : results) {
    const TuningEntry& e = r.entry;
    fmt::print("{:>7} {:>7}  {:<24} {:<24} {:>12} {:>12} {:>7.2f}x  {}\n", r.tokens, r.bucket, e.gemm1, e.gemm2,
               seconds_text(e.seconds), seconds_text(e.default_seconds),
               e.seconds > 0 ? e.default_seconds / e.seconds : 0.0,
               r.from_cache ? std::string("cached") : std::to_string(r.timed_configs));
  }
  fmt::print("\ntuned in {}; saved {} entries to {} ({} kept from the file{})\n", seconds_text(elapsed),
             saved.written, o.cache, saved.kept_from_disk,
             saved.dropped ? fmt::format(", {} dropped: metadata mismatch", saved.dropped) : std::string());
}

}  // namespace

void add_tune_command(CLI::App& app) {
  auto opts = std::make_shared<TuneCliOptions>();
  CLI::App* cmd = app.add_subcommand(
      "tune", "Tune a preset's tactics per token bucket into a JSON cache, or print a cache (--show)");
  cmd->add_option("--preset", opts->preset, "Model preset, e.g. qwen3-30b-a3b");
  cmd->add_option("--tokens", opts->tokens, "Comma-separated token counts, e.g. 1,64,4096");
  cmd->add_option("--cache", opts->cache, "Cache file to merge the winners into (created if missing)");
  cmd->add_option("--backend", opts->backends, "Comma-separated backends to try in order, or auto")
      ->capture_default_str();
  cmd->add_option("--device", opts->device, "auto | cpu | cuda | cuda:N")->capture_default_str();
  cmd->add_option("--mode", opts->mode,
                  "skip: keep cached buckets | shortlist: re-time the cached top-2 pairs | full: search again")
      ->capture_default_str();
  cmd->add_option("--progress", opts->progress, "auto (a bar on a terminal) | bar | lines | none")
      ->capture_default_str();
  cmd->add_option("--seed", opts->seed, "Seed of the synthetic weights")->capture_default_str();
  cmd->add_option("--logits", opts->logits,
                  "Text file of N x E routing logits (e.g. captured from the engine's router) to time on instead of "
                  "synthetic ones; fewer rows than a bucket's tokens repeat");
  cmd->add_option("--show", opts->show, "Print the cache at PATH and exit");
  cmd->callback([opts] { run_tune(*opts); });
}

}  // namespace moekit::cli

// `moekit demo`: routes a preset's random logits and runs its MoE layer (route + experts), on the GPU when one is
// present and on the CPU reference otherwise, through MoELayer, then prints the backend, the shapes, a checksum and
// the time. A preset whose weights would not fit in a share of this machine's memory runs a clearly announced reduced
// version (fewer experts, same per-expert shapes and routing rules).
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

#include "cli_util.h"
#include "commands.h"
#include "moekit/device.h"
#include "moekit/error.h"
#include "moekit/experts.h"
#include "moekit/layer.h"
#include "moekit/presets.h"

namespace moekit::cli {
namespace {

struct DemoOptions {
  std::string preset = "qwen3-30b-a3b";
  int64_t tokens = 16;
  std::string backend = "auto";
  uint64_t seed = 2024;
  double memory_fraction = 0.4;  // share of physical memory the demo's weights may take
};

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

int64_t weight_bytes(const ExpertConfig& e) {
  return static_cast<int64_t>(e.weight_experts()) * 3 * e.hidden * e.intermediate * 2;
}

double gib(int64_t bytes) {
  return static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0);
}

// Halves the routed experts until the weights fit `budget`, keeping every routing rule valid (n_group divides E,
// K fits the kept groups). Returns false when even the smallest valid version does not fit.
bool reduce_to_fit(RoutingConfig& r, ExpertConfig& e, int64_t budget) {
  while (weight_bytes(e) > budget) {
    RoutingConfig next = r;
    next.num_experts = r.num_experts / 2;
    if (next.num_experts % next.n_group != 0 || next.num_experts < 1) return false;
    try {
      next.validate();
    } catch (const InvalidArgument&) {
      return false;
    }
    r = next;
    e.num_experts = next.num_experts;
  }
  return true;
}

// Host tensors of one demo layer; uploaded to the GPU for the cuda backend.
struct DemoData {
  std::vector<uint16_t> w13, w2, hidden, out;
  std::vector<float> b13, b2, logits, bias;
};

void run_demo(const DemoOptions& o) {
  const Preset& preset = find_preset(o.preset);
  if (o.tokens < 1) throw InvalidArgument("demo", fmt::format("tokens ({}) must be >= 1", o.tokens));
  if (o.backend != "auto" && o.backend != "cpu" && o.backend != "cuda")
    throw InvalidArgument("demo", fmt::format("backend '{}' must be auto, cpu or cuda", o.backend));
  const bool have_gpu = cuda_device_count() > 0;
  const bool on_gpu = o.backend == "cuda" || (o.backend == "auto" && have_gpu);
  if (on_gpu && !have_gpu) throw NotSupported("demo", "backend cuda needs a CUDA device, and none was found");
  register_cuda_runners();

  RoutingConfig rcfg = preset.routing;
  ExpertConfig ecfg = preset.experts;
  const int64_t phys = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
  const int64_t budget = static_cast<int64_t>(static_cast<double>(phys) * o.memory_fraction);
  const int64_t full = weight_bytes(ecfg);
  if (!reduce_to_fit(rcfg, ecfg, budget))
    throw NotSupported("demo", fmt::format("preset {} needs {:.1f} GiB of weights, more than this machine's budget "
                                           "({:.1f} GiB), and no smaller valid version fits",
                                           preset.name, gib(full), gib(budget)));
  fmt::print("moekit demo: preset {} ({})\n", preset.name, preset.description);
  if (ecfg.num_experts != preset.experts.num_experts)
    fmt::print(
        "note: REDUCED VERSION: the full preset needs {:.1f} GiB of weights, over this machine's budget of "
        "{:.1f} GiB; running {} of its {} routed experts (same shapes and routing rules)\n",
        gib(full), gib(budget), ecfg.num_experts, preset.experts.num_experts);

  const int64_t T = o.tokens;
  const int E = ecfg.num_experts, H = ecfg.hidden, I = ecfg.intermediate, We = ecfg.weight_experts();
  auto t0 = Clock::now();
  DemoData d;
  d.w13.resize(static_cast<size_t>(We) * 2 * I * H);
  d.w2.resize(static_cast<size_t>(We) * H * I);
  const float a1 = 1.7320508f / std::sqrt(static_cast<float>(H)), a2 = 1.7320508f / std::sqrt(static_cast<float>(I));
  fill_uniform_bf16(d.w13.data(), static_cast<int64_t>(d.w13.size()), o.seed + 1, -a1, a1);
  fill_uniform_bf16(d.w2.data(), static_cast<int64_t>(d.w2.size()), o.seed + 2, -a2, a2);
  if (preset.has_expert_biases) {
    d.b13.resize(static_cast<size_t>(We) * 2 * I);
    d.b2.resize(static_cast<size_t>(We) * H);
    fill_uniform(d.b13.data(), static_cast<int64_t>(d.b13.size()), o.seed + 3, -0.1f, 0.1f);
    fill_uniform(d.b2.data(), static_cast<int64_t>(d.b2.size()), o.seed + 4, -0.1f, 0.1f);
  }
  d.logits.resize(static_cast<size_t>(T) * E);
  fill_uniform(d.logits.data(), static_cast<int64_t>(d.logits.size()), o.seed + 5, -3.0f, 3.0f);
  if (preset.has_bias) {
    d.bias.resize(E);
    fill_uniform(d.bias.data(), E, o.seed + 6, -0.05f, 0.05f);
  }
  d.hidden.resize(static_cast<size_t>(T) * H);
  d.out.resize(static_cast<size_t>(T) * H);
  fill_uniform_bf16(d.hidden.data(), static_cast<int64_t>(d.hidden.size()), o.seed + 7, -1.0f, 1.0f);
  const double gen_ms = ms_since(t0);

  // Tensors on the layer's device: host memory as is, or device copies.
  const Device dev = on_gpu ? Device::cuda(0) : Device::cpu();
  std::vector<DeviceBuffer> keep;
  auto place = [&](void* host, size_t bytes) -> void* {
    if (!on_gpu || bytes == 0) return host;
    keep.emplace_back(bytes);
    keep.back().upload(host, bytes);
    return keep.back().data();
  };
  auto bytes_of = [](const auto& v) { return v.size() * sizeof(v[0]); };
  LayerWeights weights;
  weights.experts.w13 =
      TensorView::contiguous(place(d.w13.data(), bytes_of(d.w13)), DType::bf16, {We, 2 * I, H}, dev);
  weights.experts.w2 = TensorView::contiguous(place(d.w2.data(), bytes_of(d.w2)), DType::bf16, {We, H, I}, dev);
  if (preset.has_expert_biases) {
    weights.experts.b13 = TensorView::contiguous(place(d.b13.data(), bytes_of(d.b13)), DType::f32, {We, 2 * I}, dev);
    weights.experts.b2 = TensorView::contiguous(place(d.b2.data(), bytes_of(d.b2)), DType::f32, {We, H}, dev);
  }
  if (preset.has_bias)
    weights.routing_bias = TensorView::contiguous(place(d.bias.data(), bytes_of(d.bias)), DType::f32, {E}, dev);
  const TensorView hidden =
      TensorView::contiguous(place(d.hidden.data(), bytes_of(d.hidden)), DType::bf16, {T, H}, dev);
  const TensorView logits =
      TensorView::contiguous(place(d.logits.data(), bytes_of(d.logits)), DType::f32, {T, E}, dev);
  const TensorView out = TensorView::contiguous(place(d.out.data(), bytes_of(d.out)), DType::bf16, {T, H}, dev);

  LayerOptions options;
  options.backends = {o.backend == "cpu" ? "reference" : "auto"};
  options.max_tokens = T;
  MoELayer layer(ecfg, rcfg, QuantConfig{}, weights, options);
  fmt::print("backend: {} (runner {}{})\n", on_gpu ? "cuda" : "cpu", layer.backend(),
             on_gpu ? " on " + device_info(0).name : std::string());
  fmt::print("shapes: tokens {}, experts {} (+{} shared), top_k {}, hidden {}, intermediate {}, {}{}\n", T, E,
             ecfg.num_shared_experts, ecfg.top_k, H, I, routing_method_name(rcfg.method),
             ecfg.routing_weight_on_input ? " (routing weight on the expert's input)" : "");
  fmt::print("weights: {:.2f} GiB bf16, generated in {:.0f} ms\n", gib(weight_bytes(ecfg)), gen_ms);

  // The GPU runs a warm-up and reports the median of several synchronized runs; the CPU runs once.
  const int runs = on_gpu ? 20 : 1;
  std::vector<double> times;
  if (on_gpu) {
    layer.forward(hidden, logits, out);
    device_synchronize();
  }
  for (int r = 0; r < runs; ++r) {
    t0 = Clock::now();
    layer.forward(hidden, logits, out);
    if (on_gpu) device_synchronize();
    times.push_back(ms_since(t0));
  }
  std::sort(times.begin(), times.end());
  if (on_gpu) copy_to_host(d.out.data(), out.data, bytes_of(d.out));

  const Checksum c = checksum_bf16(d.out.data(), static_cast<int64_t>(d.out.size()));
  fmt::print("output: [{}, {}] bf16, checksum sum={:.6f} abs_sum={:.6f}\n", T, H, c.sum, c.abs_sum);
  fmt::print("time: {:.3f} ms per forward (route + experts{})\n", times[times.size() / 2],
             on_gpu ? fmt::format(", median of {} after a warm-up, host-timed", runs) : std::string());
}

}  // namespace

void add_demo_command(CLI::App& app) {
  auto opts = std::make_shared<DemoOptions>();
  CLI::App* cmd =
      app.add_subcommand("demo", "Route a preset's logits and run its MoE layer; print a checksum and time");
  std::string names;
  for (const Preset& p : presets()) names += (names.empty() ? "" : ", ") + std::string(p.name);
  cmd->add_option("--preset", opts->preset, "Model preset: " + names)->capture_default_str();
  cmd->add_option("--tokens", opts->tokens, "Tokens T")->capture_default_str();
  cmd->add_option("--backend", opts->backend, "auto | cpu | cuda (auto: cuda when a GPU is present)")
      ->capture_default_str();
  cmd->add_option("--seed", opts->seed, "Random seed")->capture_default_str();
  cmd->callback([opts] { run_demo(*opts); });
}

}  // namespace moekit::cli

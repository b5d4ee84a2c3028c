// `moekit demo`: routes a preset's random logits and runs its MoE layer (route + experts), on the GPU when one is
// present and on the CPU reference otherwise, then prints the backend, the shapes, a checksum and the time.
// A preset whose weights would not fit in a share of this machine's memory runs a clearly announced reduced
// version (fewer experts, same per-expert shapes and routing rules).
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <thread>

#include "cli_util.h"
#include "commands.h"
#include "moekit/device.h"
#include "moekit/error.h"
#include "moekit/experts.h"
#include "moekit/plan.h"
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

double gib(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0); }

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

void run_demo(const DemoOptions& o) {
  const Preset& preset = find_preset(o.preset);
  if (o.tokens < 1) throw InvalidArgument("demo", fmt::format("tokens ({}) must be >= 1", o.tokens));
  if (o.backend != "auto" && o.backend != "cpu" && o.backend != "cuda")
    throw InvalidArgument("demo", fmt::format("backend '{}' must be auto, cpu or cuda", o.backend));
  const bool have_gpu = cuda_device_count() > 0;
  const std::string backend = o.backend == "auto" ? (have_gpu ? "cuda" : "cpu") : o.backend;
  if (backend == "cuda")
    throw NotSupported("demo", have_gpu ? "the cuda backend of the demo needs the GPU expert runner, which this "
                                          "build does not have yet; use --backend cpu"
                                        : "backend cuda needs a CUDA device, and none was found");

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
    fmt::print("note: REDUCED VERSION: the full preset needs {:.1f} GiB of weights, over this machine's budget of "
               "{:.1f} GiB; running {} of its {} routed experts (same shapes and routing rules)\n",
               gib(full), gib(budget), ecfg.num_experts, preset.experts.num_experts);

  const int64_t T = o.tokens;
  const int E = ecfg.num_experts, H = ecfg.hidden, I = ecfg.intermediate, We = ecfg.weight_experts();
  fmt::print("backend: cpu (reference, {} threads)\n", std::thread::hardware_concurrency());
  fmt::print("shapes: tokens {}, experts {} (+{} shared), top_k {}, hidden {}, intermediate {}, block {}, {}\n", T, E,
             ecfg.num_shared_experts, ecfg.top_k, H, I, preset.block, routing_method_name(rcfg.method));

  auto t0 = Clock::now();
  std::vector<uint16_t> w13(static_cast<size_t>(We) * 2 * I * H), w2(static_cast<size_t>(We) * H * I);
  const float a1 = 1.7320508f / std::sqrt(static_cast<float>(H)), a2 = 1.7320508f / std::sqrt(static_cast<float>(I));
  fill_uniform_bf16(w13.data(), static_cast<int64_t>(w13.size()), o.seed + 1, -a1, a1);
  fill_uniform_bf16(w2.data(), static_cast<int64_t>(w2.size()), o.seed + 2, -a2, a2);
  std::vector<float> b13, b2;
  ExpertWeights weights{TensorView::contiguous(w13.data(), DType::bf16, {We, 2 * I, H}),
                        TensorView::contiguous(w2.data(), DType::bf16, {We, H, I}), {}, {}};
  if (preset.has_expert_biases) {
    b13.resize(static_cast<size_t>(We) * 2 * I);
    b2.resize(static_cast<size_t>(We) * H);
    fill_uniform(b13.data(), static_cast<int64_t>(b13.size()), o.seed + 3, -0.1f, 0.1f);
    fill_uniform(b2.data(), static_cast<int64_t>(b2.size()), o.seed + 4, -0.1f, 0.1f);
    weights.b13 = TensorView::contiguous(b13.data(), DType::f32, {We, 2 * I});
    weights.b2 = TensorView::contiguous(b2.data(), DType::f32, {We, H});
  }
  std::vector<float> logits(static_cast<size_t>(T) * E), bias;
  fill_uniform(logits.data(), static_cast<int64_t>(logits.size()), o.seed + 5, -3.0f, 3.0f);
  if (preset.has_bias) {
    bias.resize(E);
    fill_uniform(bias.data(), E, o.seed + 6, -0.05f, 0.05f);
  }
  std::vector<uint16_t> hidden(static_cast<size_t>(T) * H), out(static_cast<size_t>(T) * H);
  fill_uniform_bf16(hidden.data(), static_cast<int64_t>(hidden.size()), o.seed + 7, -1.0f, 1.0f);
  fmt::print("weights: {:.2f} GiB bf16, generated in {:.0f} ms\n", gib(weight_bytes(ecfg)), ms_since(t0));

  RoutePlan plan(PlanShape{T, E, ecfg.top_k, ecfg.num_shared_experts, preset.block}, Device::cpu());
  const TensorView lv = TensorView::contiguous(logits.data(), DType::f32, {T, E});
  const TensorView bv = preset.has_bias ? TensorView::contiguous(bias.data(), DType::f32, {E}) : TensorView{};
  t0 = Clock::now();
  route(rcfg, lv, bv, plan);
  const double route_ms = ms_since(t0);
  t0 = Clock::now();
  experts_reference(ecfg, weights, TensorView::contiguous(hidden.data(), DType::bf16, {T, H}), plan.view(),
                    TensorView::contiguous(out.data(), DType::bf16, {T, H}));
  const double experts_ms = ms_since(t0);

  const Checksum c = checksum_bf16(out.data(), static_cast<int64_t>(out.size()));
  fmt::print("plan: {} padded rows in {} blocks of {}\n", plan.view().extent[0], plan.view().extent[1], preset.block);
  fmt::print("output: [{}, {}] bf16, checksum sum={:.6f} abs_sum={:.6f}\n", T, H, c.sum, c.abs_sum);
  fmt::print("time: route {:.3f} ms, experts {:.1f} ms, total {:.1f} ms\n", route_ms, experts_ms,
             route_ms + experts_ms);
}

}  // namespace

void add_demo_command(CLI::App& app) {
  auto opts = std::make_shared<DemoOptions>();
  CLI::App* cmd = app.add_subcommand("demo", "Route a preset's logits and run its MoE layer; print a checksum and time");
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

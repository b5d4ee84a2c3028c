// `moekit tactics`: the GEMM tactic table of the CUDA bf16 experts and the pair the default heuristic picks for a
// preset at each token count. Host code only (the table and the heuristic need no device), so it answers on machines
// without a GPU and in builds without CUDA too.
#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli_util.h"
#include "commands.h"
#include "moekit/cuda_experts.h"
#include "moekit/device.h"
#include "moekit/error.h"
#include "moekit/experts.h"
#include "moekit/presets.h"

namespace moekit::cli {
namespace {

struct TacticsCli {
  std::string preset;
  std::string tokens = "1,16,64,256,1024,4096,16384";
  std::string gate_up;
  std::string gpu = "auto";
};

// --gpu: h200 | h100, or auto: device 0's rules where there is a GPU, else h200's.
TacticGpu parse_tactic_gpu(const std::string& s) {
  if (s == "h200") return TacticGpu::h200;
  if (s == "h100") return TacticGpu::h100;
  if (s == "auto") return cuda_device_count() > 0 ? tactic_gpu_of(device_info(0)) : TacticGpu::h200;
  throw InvalidArgument("tactics", fmt::format("--gpu ('{}') must be auto, h200 or h100", s));
}

void print_tactics(const TacticsCli& o, bool gate_up_given) {
  ExpertConfig cfg = find_preset(o.preset).experts;
  if (gate_up_given) cfg.gate_up = parse_gate_up_layout(o.gate_up);
  const std::vector<int64_t> tokens = parse_int_list("tactics", o.tokens);  // positive integers
  const TacticGpu gpu = parse_tactic_gpu(o.gpu);

  const auto table = cuda_expert_gemm_tactics();
  std::printf("tactics of the cuda_bf16 experts (the indices of bench moe --gemm1 / --gemm2):\n");
  std::printf("| # | name | kind | CTA tile (rows x columns x K) | swapped operands |\n|---|---|---|---|---|\n");
  for (size_t i = 0; i < table.size(); ++i) {
    const GemmTacticInfo& t = table[i];
    const bool gemv = t.kind == GemmKernelKind::gemv;
    const std::string tile = gemv ? fmt::format("up to {} rows per pass", t.tile_m)
                                  : fmt::format("{} x {} x {}", t.tile_m, t.tile_n, t.tile_k);
    std::printf("%s", fmt::format("| {} | {} | {} | {} | {} |\n", i, t.name, gemv ? "gemv" : "grouped", tile,
                                  t.swap_ab ? "yes" : "no")
                          .c_str());
  }
  std::printf(
      "%s",
      fmt::format(
          "\ndefault picks for {} on the {} rules (w13 {}; routed rows per expert = T * {} / {}, which the heuristic "
          "rounds up):\n",
          o.preset, tactic_gpu_name(gpu), gate_up_layout_name(cfg.gate_up), cfg.top_k, cfg.num_experts)
          .c_str());
  std::printf("| T | routed rows per expert (mean) | gemm1 | gemm2 | b13 + activation |\n|---|---|---|---|---|\n");
  for (int64_t t : tokens) {
    const ExpertTactic pick = cuda_expert_default_tactic(cfg, t, gpu);
    const char* act = cuda_expert_gemm1_fuses_activation(cfg, pick.gemm1) ? "in GEMM1" : "separate pass";
    std::printf("%s",
                fmt::format("| {} | {:.2f} | {} {} | {} {} | {} |\n", t, double(t) * cfg.top_k / cfg.num_experts,
                            pick.gemm1, table[pick.gemm1].name, pick.gemm2, table[pick.gemm2].name, act)
                    .c_str());
  }
}

}  // namespace

void add_tactics_command(CLI::App& app) {
  auto opts = std::make_shared<TacticsCli>();
  CLI::App* cmd = app.add_subcommand(
      "tactics", "Print the CUDA experts' GEMM tactics and the default pair for a preset at each T (no GPU needed)");
  cmd->add_option("--preset", opts->preset, "Layer preset (see moekit/presets.h)")->required();
  cmd->add_option("--tokens", opts->tokens, "Comma-separated token counts")->capture_default_str();
  CLI::Option* gate_up =
      cmd->add_option("--gate-up", opts->gate_up,
                      "w13's gate/up arrangement instead of the preset's: gate_first, up_first or interleaved");
  cmd->add_option("--gpu", opts->gpu,
                  "Whose rules: h200, h100, or auto (device 0's: h100 below 31 GB/s of peak DRAM bandwidth per SM; "
                  "h200 without a GPU)")
      ->capture_default_str();
  cmd->callback([opts, gate_up] { print_tactics(*opts, gate_up->count() > 0); });
}

}  // namespace moekit::cli

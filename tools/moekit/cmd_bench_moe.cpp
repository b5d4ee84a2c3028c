// `moekit bench moe --preset NAME --tokens LIST [--samples N] [--gemm1 I --gemm2 J] [--json PATH]`: verifies the
// bf16 GPU experts of a preset against the CPU reference, then times experts-only and route + experts (cold-L2
// kernel time and CUDA-graph replay, through the shared harness) with the ceilings measured in the same run, and
// prints a markdown table with the fraction of the roofline floor.
#include <fmt/format.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.h"
#include "moekit/bench.h"
#include "moekit/cuda_experts.h"
#include "moekit/error.h"
#include "moekit/presets.h"

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
};

nlohmann::json to_json(const MoeBenchReport& r) {
  nlohmann::json j;
  j["preset"] = r.preset;
  j["device"] = r.device;
  j["timing_source"] = r.timing_source;
  j["ceilings"] = {{"copy_tb_per_s", r.ceilings.copy_tb_per_s},
                   {"gemm_tflop_per_s", r.ceilings.gemm_tflop_per_s},
                   {"graph_launch_us", r.ceilings.graph_launch_us}};
  for (const MoeBenchRow& x : r.rows) {
    j["rows"].push_back({{"tokens", x.tokens},
                         {"gemm1", x.gemm1},
                         {"gemm2", x.gemm2},
                         {"active_experts", x.active_experts},
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
                         {"verify_error", x.verify_error}});
  }
  return j;
}

void print_table(const MoeBenchReport& r) {
  std::printf("%s", fmt::format("moe bench: {} on {}; ceilings: copy {:.2f} TB/s, bf16 GEMM {:.0f} TFLOP/s, graph "
                                "launch {:.1f} us; cold = kernel time from {}\n",
                                r.preset, r.device, r.ceilings.copy_tb_per_s, r.ceilings.gemm_tflop_per_s,
                                r.ceilings.graph_launch_us, r.timing_source)
                        .c_str());
  std::printf("| T | gemm1 / gemm2 | experts | floor us | experts cold us | experts graph us | route+experts cold "
              "us | route+experts graph us | TB/s | TFLOP/s | floor fraction (graph) | (cold) | verify err |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const MoeBenchRow& x : r.rows) {
    std::printf("%s", fmt::format("| {} | {} / {} | {} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.2f} | {:.0f} | "
                                  "{:.2f} | {:.2f} | {:.1e} |\n",
                                  x.tokens, x.gemm1, x.gemm2, x.active_experts, x.floor_us, x.experts_cold_us,
                                  x.experts_graph_us, x.route_experts_cold_us, x.route_experts_graph_us,
                                  x.bytes / (x.experts_graph_us * 1e-6) / 1e12,
                                  x.flops / (x.experts_graph_us * 1e-6) / 1e12, x.floor_us / x.experts_graph_us,
                                  x.floor_us / x.experts_cold_us, x.verify_error)
                          .c_str());
  }
}

}  // namespace

void add_bench_moe_command(CLI::App& bench) {
  auto opts = std::make_shared<BenchMoeCli>();
  CLI::App* cmd = bench.add_subcommand("moe", "Verify, then time the bf16 GPU experts of a preset");
  cmd->add_option("--preset", opts->preset, "Layer preset (see moekit/presets.h)")->required();
  cmd->add_option("--tokens", opts->tokens, "Token counts to time")->delimiter(',');
  cmd->add_option("--samples", opts->samples, "Timed samples per measurement (median)");
  cmd->add_option("--verify-tokens", opts->verify_tokens, "Tokens of the verification run of each tactic pair");
  cmd->add_option("--seed", opts->seed, "Seed of the hash-generated weights, hidden states and logits");
  cmd->add_option("--gemm1", opts->gemm1, "GEMM1 tactic index (default: the heuristic)");
  cmd->add_option("--gemm2", opts->gemm2, "GEMM2 tactic index (default: the heuristic)");
  cmd->add_option("--json", opts->json, "Write the report as JSON to this path");
  cmd->callback([opts] {
    MoeBenchOptions o;
    o.preset = opts->preset;
    o.tokens = opts->tokens;
    o.samples = opts->samples;
    o.verify_tokens = opts->verify_tokens;
    o.seed = opts->seed;
    o.tactic = {opts->gemm1, opts->gemm2};
    find_preset(o.preset);  // a bad name is reported before any device setup
    bench::Harness harness;
    const MoeBenchReport report = bench_moe(harness, o);
    print_table(report);
    if (!opts->json.empty()) {
      std::ofstream f(opts->json);
      if (!f) throw InvalidArgument("bench", fmt::format("json path ({}) must be writable", opts->json));
      f << to_json(report).dump(2) << "\n";
    }
  });
}

}  // namespace moekit::cli

// `moekit bench ep --gpus N --preset NAME --tokens LIST [--modes LIST] [--iterations N] [--experts E] [--json PATH]`:
// the expert-parallel layer of a preset on N GPUs (one thread each, NCCL with NVLink multicast off) against the
// whole layer on one GPU: verifies every mode against the single-GPU layer, then prints per-rank throughput.
#include <fmt/format.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_util.h"
#include "commands.h"
#include "moekit/error.h"
#include "moekit/expert_parallel.h"
#include "moekit/presets.h"

namespace moekit::cli {
namespace {

struct BenchEpCli {
  std::string preset;
  int gpus = 2;
  std::vector<int64_t> tokens{64, 4096};
  std::vector<std::string> modes{"all_gather", "all_to_all"};
  int iterations = 50;
  int experts = 0;
  uint64_t seed = 1;
  std::string json;
};

nlohmann::json to_json(const EpBenchReport& r) {
  nlohmann::json j;
  j["preset"] = r.preset;
  j["device"] = r.device;
  j["gpus"] = r.gpus;
  j["num_experts"] = r.num_experts;
  j["reduced"] = r.reduced;
  j["rows"] = nlohmann::json::array();
  for (const EpBenchRow& x : r.rows)
    j["rows"].push_back({{"mode", ep_mode_name(x.mode)},
                         {"tokens_per_rank", x.tokens},
                         {"single_us", x.single_us},
                         {"ep_us", x.ep_us},
                         {"single_tokens_per_s", x.single_tokens_per_s},
                         {"ep_tokens_per_s_per_rank", x.ep_tokens_per_s_per_rank},
                         {"verify_error", x.verify_error}});
  return j;
}

void print_table(const EpBenchReport& r) {
  std::printf("%s",
              fmt::format("ep bench: {} (E = {}{}) on {} x {}; eager forward calls, CUDA events, medians; "
                          "single = the whole layer on one GPU at T tokens\n",
                          r.preset, r.num_experts, r.reduced ? ", reduced to fit one GPU" : "", r.gpus, r.device)
                  .c_str());
  std::printf(
      "| mode | T per rank | single GPU us | EP us (slowest rank) | single tok/s | EP tok/s per rank | "
      "EP / single | verify err |\n|---|---|---|---|---|---|---|---|\n");
  for (const EpBenchRow& x : r.rows)
    std::printf(
        "%s", fmt::format("| {} | {} | {:.1f} | {:.1f} | {:.3g} | {:.3g} | {:.2f} | {:.1e} |\n", ep_mode_name(x.mode),
                          x.tokens, x.single_us, x.ep_us, x.single_tokens_per_s, x.ep_tokens_per_s_per_rank,
                          x.ep_tokens_per_s_per_rank / x.single_tokens_per_s, x.verify_error)
                  .c_str());
}

}  // namespace

void add_bench_ep_command(CLI::App& bench) {
  auto opts = std::make_shared<BenchEpCli>();
  CLI::App* cmd = bench.add_subcommand("ep", "Verify, then time the expert-parallel layer of a preset on N GPUs");
  cmd->add_option("--preset", opts->preset, "Layer preset (see moekit/presets.h)")->required();
  cmd->add_option("--gpus", opts->gpus, "World size: GPUs 0..N-1, one thread each");
  cmd->add_option("--tokens", opts->tokens, "Token counts per rank")->delimiter(',');
  cmd->add_option("--modes", opts->modes, "Exchange modes: all_gather, all_to_all")->delimiter(',');
  cmd->add_option("--iterations", opts->iterations, "Timed forward calls per measurement (median)");
  cmd->add_option("--experts", opts->experts, "Routed experts (default: the preset's, reduced if it does not fit)");
  cmd->add_option("--seed", opts->seed, "Seed of the hash-generated weights and inputs");
  cmd->add_option("--json", opts->json, "Write the report as JSON to this path");
  cmd->callback([opts] {
    EpBenchOptions o;
    o.preset = opts->preset;
    o.gpus = opts->gpus;
    o.tokens = opts->tokens;
    o.modes.clear();
    for (const std::string& m : opts->modes) o.modes.push_back(parse_ep_mode(m));
    o.iterations = opts->iterations;
    o.num_experts = opts->experts;
    o.seed = opts->seed;
    find_preset(o.preset);  // a bad name is reported before any device setup
    const EpBenchReport report = bench_ep(o);
    print_table(report);
    if (!opts->json.empty()) write_json_file("bench", opts->json, to_json(report).dump(2));
  });
}

}  // namespace moekit::cli

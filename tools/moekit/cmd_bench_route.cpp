// `moekit bench route`: verifies the fused CUDA router against the CPU reference, then times it (cold-L2 CUPTI
// kernel time and CUDA-graph replay) beside the ceilings measured in the same run. Fixtures (--fixtures seed6|dsv3)
// or one custom case (--experts/--top-k/--tokens/--block/--method ...); --verify-only checks without timing.
#include <fmt/format.h>

#include <string>
#include <vector>

#include "cli_util.h"
#include "commands.h"
#include "moekit/bench.h"
#include "moekit/error.h"

namespace moekit::cli {
namespace {

struct BenchRouteArgs {
  std::string fixtures;
  int experts = 512, top_k = 8, shared = 0, block = 16, n_group = 1, topk_group = 1;
  std::vector<int64_t> tokens{128};
  std::string method = "softmax_topk", dtype = "fp32", json;
  bool renormalize = false, bias = false, verify_only = false, phases = false, warm = false;
  float scale = 1.0f;
  int samples = 100;
  uint64_t seed = 1;
  std::vector<int> ctas;
  std::string pairs = "auto", instances = "auto";
};

void run(const BenchRouteArgs& a) {
  std::vector<bench::RouteCase> cases;
  if (!a.fixtures.empty()) {
    for (const bench::RouteCase& c : bench::route_fixtures(a.fixtures)) cases.push_back(c);
  } else {
    for (int64_t t : a.tokens) {
      bench::RouteCase c;
      c.fixture = "custom";
      c.cfg.method = parse_routing_method(a.method);
      c.cfg.num_experts = a.experts;
      c.cfg.top_k = a.top_k;
      c.cfg.num_shared_experts = a.shared;
      c.cfg.renormalize = a.renormalize;
      c.cfg.n_group = a.n_group;
      c.cfg.topk_group = a.topk_group;
      c.cfg.routed_scaling_factor = a.scale;
      c.cfg.validate();
      c.tokens = t;
      c.block = a.block;
      c.dtype = parse_dtype(a.dtype);
      c.bias = a.bias;
      cases.push_back(c);
    }
  }
  if (a.samples < 1) throw InvalidArgument("bench", fmt::format("samples ({}) must be >= 1", a.samples));
  bench::Harness harness;
  const bench::Ceilings ceilings = a.verify_only ? bench::Ceilings{} : harness.measure_ceilings();
  bench::RouteBenchOptions opt;
  opt.verify_only = a.verify_only;
  opt.seed = a.seed;
  opt.timing.samples = a.samples;
  opt.ctas = a.ctas;
  opt.pairs = a.pairs == "never" ? -1 : a.pairs == "always" ? 1 : 0;
  opt.general_instance = a.instances == "general";
  opt.phases = a.phases;
  opt.timing.flush_l2 = !a.warm;
  const std::vector<bench::RouteResult> results = bench::bench_route(harness, cases, opt, ceilings);
  if (!a.json.empty()) write_json_file("bench", a.json, bench::route_json(results, ceilings));
  fmt::print("{}", bench::route_markdown(results, ceilings));
  for (const bench::RouteResult& r : results)
    if (!r.verified) throw Internal("bench", "route plan differs from the CPU reference: " + r.mismatch);
}

}  // namespace

void add_bench_route_command(CLI::App& bench) {
  auto args = std::make_shared<BenchRouteArgs>();
  CLI::App* cmd = bench.add_subcommand("route", "Verify, then time the fused CUDA router (logits -> route plan)");
  cmd->add_option("--fixtures", args->fixtures, "DESIGN §11 fixtures: seed6 or dsv3 (overrides the custom case)");
  cmd->add_option("--experts", args->experts, "E (custom case)");
  cmd->add_option("--top-k", args->top_k, "K (custom case)");
  cmd->add_option("--shared", args->shared, "fused shared experts S (custom case)");
  cmd->add_option("--tokens", args->tokens, "T, one or more: 1,16,64 or 1 16 64 (custom case)")->delimiter(',');
  cmd->add_option("--block", args->block, "plan block size B (custom case)");
  cmd->add_option("--method", args->method, "routing method (custom case)");
  cmd->add_option("--dtype", args->dtype, "logits dtype: fp32 or bf16 (custom case)");
  cmd->add_option("--n-group", args->n_group, "sigmoid_grouped groups (custom case)");
  cmd->add_option("--topk-group", args->topk_group, "sigmoid_grouped kept groups (custom case)");
  cmd->add_option("--scale", args->scale, "routed scaling factor (custom case)");
  cmd->add_flag("--renormalize", args->renormalize, "renormalize the K weights (custom case)");
  cmd->add_flag("--bias", args->bias, "add a random selection bias (custom case)");
  cmd->add_option("--ctas", args->ctas, "grid sizes to time (0 = the router's choice); default: 0")->delimiter(',');
  cmd->add_option("--pairs", args->pairs, "two tokens per warp: auto (the router's choice), never or always")
      ->check(CLI::IsMember({"auto", "never", "always"}));
  cmd->add_option("--instances", args->instances,
                  "kernel instances: auto (the router's choice) or general (no decode or token-mask instance)")
      ->check(CLI::IsMember({"auto", "general"}));
  cmd->add_option("--samples", args->samples, "timed samples per case (>= 100 for the medians we report)");
  cmd->add_option("--seed", args->seed, "seed of the random logits");
  cmd->add_option("--json", args->json, "also write the results as JSON to this path");
  cmd->add_flag("--verify-only", args->verify_only, "only check against the CPU reference");
  cmd->add_flag("--warm-l2", args->warm, "do not flush the L2 between kernel-time samples (the goal is cold)");
  cmd->add_flag("--phases", args->phases, "also time the router's phases from in-kernel timestamps (cold L2)");
  cmd->callback([args] { run(*args); });
}

}  // namespace moekit::cli

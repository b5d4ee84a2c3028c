// `moekit bench`: the parent of the benchmark subcommands (route, moe). Each verifies against the CPU reference
// before it times.
#include "commands.h"

namespace moekit::cli {

void add_bench_command(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Verify, then time moekit's kernels on the GPU");
  bench->require_subcommand(1);
  add_bench_route_command(*bench);
  add_bench_moe_command(*bench);
  add_bench_ep_command(*bench);
}

}  // namespace moekit::cli

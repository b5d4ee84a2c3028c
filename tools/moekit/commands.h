// The moekit CLI's subcommands. Each add_*_command registers one subcommand (options and callback) on its parent;
// callbacks throw moekit::Error on bad input, which main() prints and turns into exit status 1.
#pragma once

#include <CLI/CLI.hpp>

namespace moekit::cli {

void add_demo_command(CLI::App& app);     // moekit demo
void add_route_command(CLI::App& app);    // moekit route
void add_bench_command(CLI::App& app);    // moekit bench {route, moe}
void add_tune_command(CLI::App& app);     // moekit tune
void add_tactics_command(CLI::App& app);  // moekit tactics

// Children of `moekit bench`.
void add_bench_route_command(CLI::App& bench);
void add_bench_moe_command(CLI::App& bench);
void add_bench_ep_command(CLI::App& bench);

}  // namespace moekit::cli

// `moekit bench moe`: not available in this build yet; the command exists so that --help and scripts see it.
#include "commands.h"
#include "moekit/error.h"

namespace moekit::cli {

void add_bench_moe_command(CLI::App& parent) {
  CLI::App* cmd = parent.add_subcommand("moe", "(not available yet)");
  cmd->allow_extras();
  cmd->callback([] { throw NotSupported("bench moe", "this command is not available in this build yet"); });
}

}  // namespace moekit::cli

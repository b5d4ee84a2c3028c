// `moekit tune`: not available in this build yet; the command exists so that --help and scripts see it.
#include "commands.h"
#include "moekit/error.h"

namespace moekit::cli {

void add_tune_command(CLI::App& parent) {
  CLI::App* cmd = parent.add_subcommand("tune", "(not available yet)");
  cmd->allow_extras();
  cmd->callback([] { throw NotSupported("tune", "this command is not available in this build yet"); });
}

}  // namespace moekit::cli

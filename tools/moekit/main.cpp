// moekit: the command-line entry point. Parses the subcommand, runs it, and turns moekit::Error into a message on
// stderr and exit status 1 (2 for a command-line syntax error).
#include <cstdio>
#include <exception>
#include <new>

#include "commands.h"
#include "moekit/error.h"

int main(int argc, char** argv) {
  CLI::App app{"moekit: Mixture-of-Experts inference kernels for Hopper, with a CPU reference"};
  app.require_subcommand(1);
  moekit::cli::add_demo_command(app);
  moekit::cli::add_route_command(app);
  moekit::cli::add_bench_command(app);
  moekit::cli::add_tune_command(app);
  moekit::cli::add_tactics_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  } catch (const moekit::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr,
                 "error: out of host memory for this command's buffers (fewer --tokens, or a smaller preset)\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}

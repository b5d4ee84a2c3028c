// moekit: the command-line entry point. Parses the subcommand, runs it, and turns moekit::Error into a message on
// stderr and exit status 1 (2 for a command-line syntax error).
#include <fmt/format.h>

#include <cstdio>
#include <exception>
#include <new>
#include <string>

#include "commands.h"
#include "moekit/device.h"
#include "moekit/error.h"
#include "moekit/version.h"

namespace {

// What `moekit --version` prints: the library version, whether this build has the CUDA kernels, and each GPU it
// sees (what a bug report needs).
std::string version_text() {
  std::string s = fmt::format("moekit {} ({})", moekit::kVersion,
                              moekit::built_with_cuda() ? "CUDA kernels for sm_90a" : "CPU only: built without CUDA");
  const int n = moekit::cuda_device_count();
  for (int i = 0; i < n; ++i) {
    const moekit::DeviceInfo d = moekit::device_info(i);
    s += fmt::format("\ncuda:{} {}, sm_{}{}, {} SMs{}", i, d.name, d.cc_major, d.cc_minor, d.sm_count,
                     moekit::device_is_sm90(i) ? "" : " (not sm_90: the CUDA backend will not run on it)");
  }
  if (moekit::built_with_cuda() && n == 0) s += "\nno CUDA device visible";
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"moekit: Mixture-of-Experts inference kernels for Hopper, with a CPU reference"};
  app.require_subcommand(1);
  app.set_version_flag("--version", version_text);
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

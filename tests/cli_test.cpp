// The moekit CLI on the CPU backend: exit codes and the validation messages users see, --help everywhere, and
// the demo printing a result.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <string>
#include <utility>

#include "moekit/cuda_experts.h"
#include "moekit/device.h"
#include "moekit/version.h"

// GCC names its sanitizers by macros, clang by __has_feature.
#if defined(__has_feature)
#define MOEKIT_CLANG_SANITIZER (__has_feature(address_sanitizer) || __has_feature(thread_sanitizer))
#else
#define MOEKIT_CLANG_SANITIZER 0
#endif

namespace {

struct CliRun {
  int status = -1;
  std::string output;  // stdout and stderr together
};

// Runs `prefix` (shell commands ending in "; " or empty), then the CLI with `args`.
CliRun run_cli(const std::string& args, const std::string& prefix = "") {
  const std::string cmd = prefix + std::string(MOEKIT_CLI_PATH) + " " + args + " 2>&1";
  CliRun r;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return r;
  std::array<char, 4096> buf{};
  while (fgets(buf.data(), buf.size(), pipe)) r.output += buf.data();
  const int raw = pclose(pipe);
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  return r;
}

TEST(Cli, TopKAboveExpertsFailsWithTheRule) {
  CliRun r = run_cli("route --experts 8 --top-k 9");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("moekit::route: top_k (9) must be <= num_experts (8)"), std::string::npos) << r.output;
}

TEST(Cli, BadBlockFailsWithTheRule) {
  for (const char* b : {"0", "300"}) {
    CliRun r = run_cli(std::string("route --experts 8 --top-k 2 --block ") + b);
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.output.find(std::string("block (") + b + ") must be in [1, 256]"), std::string::npos) << r.output;
  }
}

TEST(Cli, UnknownMethodListsTheMethods) {
  CliRun r = run_cli("route --method softmax");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("sigmoid_grouped"), std::string::npos) << r.output;
}

TEST(Cli, RoutePrintsIdsAndPlan) {
  CliRun r = run_cli(
      "route --experts 16 --top-k 4 --shared 1 --tokens 5 --block 4 --method sigmoid_grouped "
      "--n-group 4 --topk-group 2 --renormalize --scale 2.5 --bias");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("token 0: ids ["), std::string::npos) << r.output;
  // 5 tokens x 5 slots; the shared expert (id 16) receives every token.
  EXPECT_NE(r.output.find("plan: padded rows"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" 5\n"), std::string::npos) << r.output;
}

TEST(Cli, RouteReadsLogitsFromAFile) {
  char path[] = "/tmp/moekit_cli_logitsXXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  // Two tokens over 4 experts: token 0 prefers 2 then 0, token 1 prefers 3 then 1.
  const std::string text = "1.0 -1.0 3.0 0.5\n-2.0 2.0 0.0 4.0\n";
  ASSERT_EQ(write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  close(fd);
  CliRun r = run_cli(std::string("route --experts 4 --top-k 2 --method topk_softmax --logits ") + path);
  std::remove(path);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("token 0: ids [2, 0]"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("token 1: ids [3, 1]"), std::string::npos) << r.output;
}

// Values in the logits file: subnormal ones are numbers (expert 1 wins over 0 by 1e-40), values past fp32's range
// and words that are not numbers are refused with the word.
TEST(Cli, LogitsFileValues) {
  auto route_with = [](const std::string& text) {
    char path[] = "/tmp/moekit_cli_logitsXXXXXX";
    const int fd = mkstemp(path);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
    close(fd);
    CliRun r = run_cli(std::string("route --experts 2 --top-k 1 --method topk_softmax --logits ") + path);
    std::remove(path);
    return r;
  };
  CliRun tiny = route_with("0 1e-40\n");
  ASSERT_EQ(tiny.status, 0) << tiny.output;
  EXPECT_NE(tiny.output.find("token 0: ids [1]"), std::string::npos) << tiny.output;
  CliRun huge = route_with("1e50 0\n");
  EXPECT_EQ(huge.status, 1);
  EXPECT_NE(huge.output.find("'1e50' is outside fp32's range"), std::string::npos) << huge.output;
  CliRun word = route_with("1.5x 0\n");
  EXPECT_EQ(word.status, 1);
  EXPECT_NE(word.output.find("'1.5x' is not a number"), std::string::npos) << word.output;
}

// What a GPU command says on this machine when it has no GPU: a CUDA build asks for a device, a build without CUDA
// says it has none.
bool says_gpu_needed(const std::string& output) {
  const char* need = moekit::built_with_cuda() ? "a CUDA device (none found) is needed" : "has no CUDA support";
  return output.find(need) != std::string::npos;
}

// Lists take commas, as in bench moe and tune (and spaces); without a GPU the command then says what it needs.
// A command whose buffers do not fit in host memory says so (here: 3.2 GB of logits under a 1 GB address-space
// limit), instead of "std::bad_alloc".
TEST(Cli, OutOfHostMemoryIsReported) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || MOEKIT_CLANG_SANITIZER
  GTEST_SKIP() << "the sanitizer reserves more address space than the limit allows";
#else
  CliRun r = run_cli("route --experts 8 --top-k 2 --tokens 100000000", "ulimit -v 1000000; ");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("error: out of host memory for this command's buffers"), std::string::npos) << r.output;
#endif
}

TEST(Cli, BenchRouteTakesCommaLists) {
  for (const char* args : {"--tokens 1,2,4", "--tokens 1 2 4", "--ctas 0,8 --tokens 64"}) {
    CliRun r = run_cli(std::string("bench route --verify-only ") + args);
    EXPECT_EQ(r.output.find("Could not convert"), std::string::npos) << args << ": " << r.output;
    if (r.status != 0) {
      EXPECT_TRUE(says_gpu_needed(r.output)) << args << ": " << r.output;
    }
  }
}

// `args` are accepted (an unknown flag exits with 2 and "was not expected"): with a GPU the output holds
// `on_gpu`, without one the command says it needs one.
void expect_accepted(const std::string& args, const std::string& on_gpu) {
  CliRun r = run_cli(args);
  EXPECT_EQ(r.output.find("was not expected"), std::string::npos) << r.output;
  if (r.status != 0) {
    EXPECT_TRUE(says_gpu_needed(r.output)) << r.output;
  } else {
    EXPECT_NE(r.output.find(on_gpu), std::string::npos) << r.output;
  }
}

// --instances: by default a one-CTA call of 12 tokens over 96 slots takes the router's token-mask instance, which the
// CTAs column names; `general` routes it through the general instance; another value does not parse.
TEST(Cli, BenchRouteInstances) {
  const std::string args = "bench route --verify-only --experts 128 --top-k 8 --tokens 12";
  expect_accepted(args, "| 1, token masks |");
  CliRun general = run_cli(args + " --instances general");
  if (general.status == 0) {
    EXPECT_EQ(general.output.find("token masks"), std::string::npos) << general.output;
  } else {
    EXPECT_TRUE(says_gpu_needed(general.output)) << general.output;
  }
  EXPECT_EQ(run_cli(args + " --instances decode").status, 2);
}

// An option of the plain benchmark only: `PREFIX --tuned ARGS` (PREFIX: "bench moe --preset NAME") is refused as a
// conflict, and `bench moe --help` lists `flag`.
void expect_plain_only(const std::string& prefix, const std::string& args, const std::string& flag) {
  CliRun both = run_cli(prefix + " --tuned " + args);
  EXPECT_NE(both.status, 0) << args;
  EXPECT_NE(both.output.find("excludes"), std::string::npos) << both.output;
  CliRun help = run_cli("bench moe --help");
  EXPECT_NE(help.output.find(flag), std::string::npos) << help.output;
}

// --kernels is accepted; with a GPU the breakdown is printed.
TEST(Cli, BenchMoeTakesKernels) {
  expect_accepted("bench moe --preset qwen3-30b-a3b --tokens 1 --samples 1 --verify-tokens 1 --kernels",
                  "kernels of one experts call, T = 1");
  expect_plain_only("bench moe --preset qwen3-30b-a3b", "--kernels", "--kernels");  // --tuned has no kernel table
}

// --cublas is accepted for the plain benchmark only; with a GPU the reference table is printed.
TEST(Cli, BenchMoeTakesCublas) {
  expect_accepted("bench moe --preset qwen3-30b-a3b --tokens 1 --samples 1 --verify-tokens 1 --cublas",
                  "cuBLAS strided-batched GEMM1 + GEMM2");
  expect_plain_only("bench moe --preset qwen3-30b-a3b", "--cublas", "--cublas");
}

// --sustained-ceiling: with a GPU the table names the sustained GEMM ceiling and gets a column against it; values
// outside [0, 60] seconds and non-finite ones are rejected before any device setup; --tuned excludes it.
TEST(Cli, BenchMoeSustainedCeiling) {
  expect_accepted("bench moe --preset qwen3-30b-a3b --tokens 1 --samples 1 --verify-tokens 1 --sustained-ceiling 0.5",
                  "sustained bf16 GEMM ceiling: ");
  for (const char* bad : {"-1", "61", "nan", "inf"}) {
    CliRun r = run_cli(std::string("bench moe --preset qwen3-30b-a3b --tokens 1 --sustained-ceiling ") + bad);
    EXPECT_NE(r.status, 0) << bad;
    EXPECT_NE(r.output.find(std::string("sustained_ceiling_s (") + bad + ") must be finite and in [0, 60]"),
              std::string::npos)
        << r.output;
    EXPECT_EQ(r.output.find("a CUDA device"), std::string::npos) << r.output;
  }
  expect_plain_only("bench moe --preset qwen3-30b-a3b", "--sustained-ceiling 1", "--sustained-ceiling");
}

// A non-negative number option of the plain benchmark (not --tuned): `accepted` (a valid value) gets as far as
// asking for a GPU without one, and with one prints `shown`; negative and non-finite values are rejected with a
// message naming `field`, before any device setup.
void expect_non_negative_bench_option(const std::string& prefix, const std::string& flag, const std::string& field,
                                      const char* accepted, const char* shown, bool tuned_excludes = true) {
  expect_accepted(prefix + " --tokens 64 --samples 1 --verify-tokens 1 " + flag + " " + accepted, shown);
  for (const char* bad : {"-0.5", "nan", "inf"}) {
    CliRun r = run_cli(prefix + " --tokens 1 " + flag + " " + bad);
    EXPECT_NE(r.status, 0) << flag << " " << bad;
    EXPECT_NE(r.output.find(field + " (" + bad + ") must be finite and >= 0"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("a CUDA device"), std::string::npos) << r.output;
  }
  if (tuned_excludes) {
    expect_plain_only(prefix, flag + " " + accepted, flag);
  } else {
    CliRun help = run_cli("bench moe --help");
    EXPECT_NE(help.output.find(flag), std::string::npos) << help.output;
  }
}

// --verify-tokens: the plain benchmark verifies at min(T, N) tokens, so N >= 1, checked before any device setup (the
// tuned one takes 0 for no verification).
TEST(Cli, BenchMoeVerifyTokens) {
  for (const char* bad : {"0", "-3"}) {
    CliRun r = run_cli(std::string("bench moe --preset qwen3-30b-a3b --tokens 1 --verify-tokens ") + bad);
    EXPECT_NE(r.status, 0) << bad;
    EXPECT_NE(r.output.find(std::string("verify_tokens (") + bad + ") must be >= 1"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("a CUDA device"), std::string::npos) << r.output;
  }
}

// --bias-scale: the selection bias's range on presets that have one.
TEST(Cli, BenchMoeBiasScale) {
  expect_non_negative_bench_option("bench moe --preset deepseek-v3", "--bias-scale", "bias_scale", "0",
                                   "selection bias uniform in [-S, S) with S = 0");
}

// --logit-skew: with a GPU the table says how the logits were skewed (and its rows column shows the busiest expert).
// With --tuned the tuner times on the skewed logits, and the bad values are rejected there too, before any device
// setup.
TEST(Cli, BenchMoeLogitSkew) {
  expect_non_negative_bench_option("bench moe --preset mixtral-8x7b", "--logit-skew", "logit_skew", "1",
                                   "routing skew: each expert's logits offset by a fixed value uniform in [-S, S) "
                                   "with S = 1",
                                   false);
  for (const char* bad : {"-0.5", "nan"}) {
    CliRun r = run_cli(std::string("bench moe --preset mixtral-8x7b --tuned --tokens 1 --logit-skew ") + bad);
    EXPECT_NE(r.status, 0) << bad;
    EXPECT_NE(r.output.find(std::string("logit_skew (") + bad + ") must be finite and >= 0"), std::string::npos)
        << r.output;
  }
  CliRun tuned = run_cli(
      "bench moe --preset mixtral-8x7b --tuned --tokens 1 --samples 1 --verify-tokens 1 "
      "--logit-skew 1");
  EXPECT_EQ(tuned.output.find("excludes"), std::string::npos) << tuned.output;
  if (tuned.status == 0) {
    EXPECT_NE(tuned.output.find("tuned and timed with each expert's logits offset by a fixed value uniform in "
                                "[-S, S) with S = 1"),
              std::string::npos)
        << tuned.output;
    EXPECT_NE(tuned.output.find("| default / tuned | default spread | tuner ratio |"), std::string::npos)
        << tuned.output;
  } else {
    EXPECT_NE(tuned.output.find("runner cuda_bf16 cannot run preset mixtral-8x7b here"), std::string::npos)
        << tuned.output;
  }
}

// --gate-up: a layout name, for the plain benchmark only; the table's first line names the arrangement timed.
TEST(Cli, BenchMoeGateUp) {
  expect_accepted("bench moe --preset qwen3-30b-a3b --tokens 1 --samples 1 --verify-tokens 1 --gate-up interleaved",
                  "qwen3-30b-a3b (w13 interleaved)");
  CliRun bad = run_cli("bench moe --preset qwen3-30b-a3b --tokens 1 --gate-up diagonal");  // before any device setup
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.output.find("unknown gate_up layout 'diagonal' (expected one of: gate_first, up_first, interleaved)"),
            std::string::npos)
      << bad.output;
  EXPECT_EQ(bad.output.find("a CUDA device"), std::string::npos) << bad.output;
  expect_plain_only("bench moe --preset qwen3-30b-a3b", "--gate-up interleaved", "--gate-up");
}

// Bad token counts and sample counts are reported as such, before any device setup (without a GPU as with one).
TEST(Cli, BenchMoeRejectsBadArgumentsFirst) {
  for (const auto& [args, message] : {std::pair<const char*, const char*>{"--tokens 0", "tokens (0) must be >= 1"},
                                      {"--tokens 4 --samples 0", "samples (0) must be >= 1"}}) {
    CliRun r = run_cli(std::string("bench moe --preset qwen3-30b-a3b ") + args);
    EXPECT_NE(r.status, 0) << args;
    EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("a CUDA device"), std::string::npos) << r.output;
  }
}

// The tactic table and the default picks, without a GPU and in builds without CUDA: T = 1 takes the decode GEMV,
// qwen3's 1024 rows per expert at T = 16384 the cooperative 128x256 tiles (whose GEMM1 applies the activation itself
// only for interleaved w13), and --gate-up changes the layout the heuristic sees.
TEST(Cli, TacticsPrintsTheTableAndTheDefaultPicks) {
  CliRun r = run_cli("tactics --preset qwen3-30b-a3b --tokens 1,16384 --gpu h200");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("| 0 | gemv_8rows | gemv | up to 8 rows per pass | no |"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("| 5 | sm90_swap_ab_cooperative_32x128x64 | grouped | 32 x 128 x 64 | yes |"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("default picks for qwen3-30b-a3b on the h200 rules (w13 gate_first; routed rows per expert "
                          "= T * 8 / 128"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("| 1 | 0.06 | 0 gemv_8rows | 0 gemv_8rows | in GEMM1 |"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("| 16384 | 1024.00 | 3 sm90_cooperative_128x256x64 | 3 sm90_cooperative_128x256x64 | "
                          "separate pass |"),
            std::string::npos)
      << r.output;
  CliRun il = run_cli("tactics --preset qwen3-30b-a3b --tokens 64,16384 --gate-up interleaved");
  ASSERT_EQ(il.status, 0) << il.output;
  EXPECT_NE(il.output.find("(w13 interleaved;"), std::string::npos) << il.output;
  EXPECT_NE(il.output.find("| 16384 | 1024.00 | 3 sm90_cooperative_128x256x64 | 3 sm90_cooperative_128x256x64 | "
                           "in GEMM1 |"),
            std::string::npos)
      << il.output;
  // --gpu picks the rules: mixtral's 1024 rows per expert take 128x256 on the H100's, 64x256 on the H200's.
  for (const auto& [gpu, row] :
       {std::pair<const char*, const char*>{"h100",
                                            "| 4096 | 1024.00 | 3 sm90_cooperative_128x256x64 "
                                            "| 3 sm90_cooperative_128x256x64 | separate pass |"},
        {"h200",
         "| 4096 | 1024.00 | 4 sm90_pingpong_64x256x64 | 4 sm90_pingpong_64x256x64 | "
         "in GEMM1 |"}}) {
    CliRun g = run_cli(std::string("tactics --preset mixtral-8x7b --tokens 4096 --gpu ") + gpu);
    ASSERT_EQ(g.status, 0) << g.output;
    EXPECT_NE(g.output.find(std::string("on the ") + gpu + " rules"), std::string::npos) << g.output;
    EXPECT_NE(g.output.find(row), std::string::npos) << g.output;
  }
  // auto: device 0's rules, h200's without a GPU.
  CliRun au = run_cli("tactics --preset mixtral-8x7b --tokens 4096");
  ASSERT_EQ(au.status, 0) << au.output;
  const moekit::TacticGpu gpu =
      moekit::cuda_device_count() > 0 ? moekit::tactic_gpu_of(moekit::device_info(0)) : moekit::TacticGpu::h200;
  EXPECT_NE(au.output.find(fmt::format("on the {} rules", moekit::tactic_gpu_name(gpu))), std::string::npos)
      << au.output;
  for (const auto& [args, message] :
       {std::pair<const char*, const char*>{"--preset gpt-5", "unknown preset 'gpt-5'"},
        {"--preset qwen3-30b-a3b --gpu a100", "--gpu ('a100') must be auto, h200 or h100"},
        {"--preset qwen3-30b-a3b --tokens 4,0", "token list entry '0' must be a positive integer"},
        {"--preset qwen3-30b-a3b --gate-up diagonal", "unknown gate_up layout 'diagonal'"}}) {
    CliRun bad = run_cli(std::string("tactics ") + args);
    EXPECT_EQ(bad.status, 1) << args;
    EXPECT_NE(bad.output.find(message), std::string::npos) << bad.output;
  }
}

TEST(Cli, HelpEverywhere) {
  for (const char* sub : {"", "demo", "route", "bench", "tune", "tactics"}) {
    CliRun r = run_cli(std::string(sub) + " --help");
    EXPECT_EQ(r.status, 0) << sub << ": " << r.output;
    EXPECT_NE(r.output.find("Usage"), std::string::npos) << sub << ": " << r.output;
  }
}

// `--version` names the library version and the build, then one line per visible GPU.
TEST(Cli, VersionNamesTheBuildAndTheGpus) {
  CliRun r = run_cli("--version");
  EXPECT_EQ(r.status, 0) << r.output;
  const std::string first = r.output.substr(0, r.output.find('\n'));
  EXPECT_EQ(first,
            std::string("moekit ") + std::string(moekit::kVersion) +
                (moekit::built_with_cuda() ? " (CUDA kernels for sm_90a)" : " (CPU only: built without CUDA)"));
  size_t lines = 0;
  for (char c : r.output) lines += c == '\n' ? 1 : 0;
  const int gpus = moekit::cuda_device_count();
  EXPECT_EQ(lines, 1u + static_cast<size_t>(gpus) + (moekit::built_with_cuda() && gpus == 0 ? 1u : 0u)) << r.output;
  if (gpus > 0) {
    EXPECT_NE(r.output.find("\ncuda:0 " + moekit::device_info(0).name + ", sm_"), std::string::npos) << r.output;
  }
}

TEST(Cli, NoSubcommandIsAnError) {
  CliRun r = run_cli("");
  EXPECT_NE(r.status, 0);
}

TEST(Cli, DemoRunsOnTheCpuReference) {
  CliRun r = run_cli("demo --preset qwen3-30b-a3b --tokens 3 --backend cpu");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("backend: cpu"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("checksum sum="), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" ms per forward"), std::string::npos) << r.output;
  // The same seed gives the same checksum.
  CliRun again = run_cli("demo --preset qwen3-30b-a3b --tokens 3 --backend cpu");
  const auto line = [](const std::string& s) {
    return s.substr(s.find("checksum"), s.find('\n', s.find("checksum")) - s.find("checksum"));
  };
  EXPECT_EQ(line(r.output), line(again.output));
}

TEST(Cli, DemoRejectsUnknownPreset) {
  CliRun r = run_cli("demo --preset gpt-5");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("unknown preset 'gpt-5'"), std::string::npos) << r.output;
}

}  // namespace

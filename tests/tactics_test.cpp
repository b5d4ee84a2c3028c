// The CUDA experts' tactic table as host code: the default heuristic's picks on the real presets (the H200's rules
// and where the H100's differ), which GEMM1 tactics apply the activation themselves per w13 arrangement, the tactic
// index checks, and which GPU's rules a device takes. No GPU and no CUDA needed.
#include "experts/tactics.h"

#include <gtest/gtest.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "error_of.h"
#include "moekit/cuda_experts.h"
#include "moekit/device.h"
#include "moekit/error.h"
#include "moekit/experts.h"
#include "moekit/presets.h"

namespace moekit {
namespace {

// The default heuristic's picks on the real presets: the rules of src/experts/tactics.cpp as fitted to the H200
// sweeps in docs/benchmarks.md.
TEST(TacticHeuristic, PresetsGetTheMeasuredTactics) {
  const char* const gemv = "gemv_8rows";
  const char* const swap = "sm90_swap_ab_cooperative_32x128x64";
  const char* const small = "sm90_pingpong_64x256x64";
  const char* const large = "sm90_cooperative_128x256x64";
  const char* const swap96 = "sm90_swap_ab_cooperative_96x256x64";
  struct Pick {
    const char* preset;
    int64_t tokens;
    const char* tactic;  // GEMM1's, and GEMM2's unless gemm2 is set
    const char* gemm2 = nullptr;
    GateUpLayout gate_up = GateUpLayout::gate_first;  // interleaved: the preset with w13 interleaved at load time
    int64_t intermediate = 0;                         // I instead of the preset's (0: the preset's)
  };
  constexpr GateUpLayout interleaved = GateUpLayout::interleaved, gate_first = GateUpLayout::gate_first;
  // I no multiple of 128: gate-first w13 without the fused 64x256 GEMM1 (mixtral's 14336 and qwen3-next's 512 less
  // 64).
  constexpr int64_t mixtral_unfused = 14272, qwen3_next_unfused = 448;
  const Pick picks[] = {
      // Decode without shared experts: at most 3/4 of a routed row per expert (4 T K <= 3 E).
      {"mixtral-8x7b", 1, gemv},
      {"mixtral-8x7b", 3, gemv},
      {"qwen3-30b-a3b", 12, gemv},
      {"qwen3-30b-a3b", 13, swap},
      {"qwen3-next-80b", 1, gemv},
      {"qwen3-next-80b", 38, gemv},
      {"qwen3-next-80b", 39, swap},
      {"gpt-oss-120b", 24, gemv},
      {"gpt-oss-120b", 25, swap},
      // With or without shared experts: up to 4 tokens at ~1 routed row per expert.
      {"mixtral-8x7b", 4, gemv},  // a load of 1, 1 row per active expert
      {"mixtral-8x7b", 5, swap},  // 2 rows
      {"deepseek-v3", 4, gemv},
      {"deepseek-v3", 5, swap},  // past the token bound: the shared expert holds T rows
      {"deepseek-v3", 16, swap},
      // Swapped 32x128 tiles up to 16 routed rows per expert; with shared experts up to 64 tokens.
      {"mixtral-8x7b", 16, swap},
      {"mixtral-8x7b", 64, swap},      // 16 rows
      {"qwen3-30b-a3b", 256, swap},    // 16 rows
      {"qwen3-30b-a3b", 257, small},   // 17 rows
      {"deepseek-v3", 64, swap},       // 2 rows, the shared expert's 64
      {"deepseek-v3", 65, small},      // 3 rows, the shared expert's 65
      {"deepseek-v3", 512, small},     // 16 rows
      {"gpt-oss-120b", 512, swap},     // 16 rows
      {"qwen3-next-80b", 819, swap},   // 16 rows
      {"qwen3-next-80b", 820, small},  // 17 rows
      // A few large experts (mixtral): 64x256 below 56 routed rows per expert, swapped 96x256 from 56 to 64; above,
      // 64x256 up to 3071 rows and 128x256 from 3072 on; interleaved w13 takes 128x256 at 65-111 rows as well.
      {"mixtral-8x7b", 128, small},    // 32 rows
      {"mixtral-8x7b", 220, small},    // 55 rows
      {"mixtral-8x7b", 221, swap96},   // 56 rows
      {"mixtral-8x7b", 256, swap96},   // 64 rows
      {"mixtral-8x7b", 257, small},    // 65 rows
      {"mixtral-8x7b", 444, small},    // 111 rows
      {"mixtral-8x7b", 445, small},    // 112 rows
      {"mixtral-8x7b", 892, small},    // 223 rows
      {"mixtral-8x7b", 893, small},    // 224 rows
      {"mixtral-8x7b", 1024, small},   // 256 rows
      {"mixtral-8x7b", 1276, small},   // 319 rows
      {"mixtral-8x7b", 1277, small},   // 320 rows
      {"mixtral-8x7b", 12284, small},  // 3071 rows
      {"mixtral-8x7b", 12285, large},  // 3072 rows
      // Interleaved w13 (GEMM1's fused gated epilogue) takes the same tiles but 128x256 at 65-111 rows.
      {"mixtral-8x7b", 256, swap96, nullptr, interleaved},  // 64 rows
      {"mixtral-8x7b", 257, large, nullptr, interleaved},   // 65 rows
      {"mixtral-8x7b", 280, large, nullptr, interleaved},   // 70 rows
      {"mixtral-8x7b", 444, large, nullptr, interleaved},   // 111 rows
      {"mixtral-8x7b", 445, small, nullptr, interleaved},   // 112 rows
      {"mixtral-8x7b", 893, small, nullptr, interleaved},   // 224 rows
      {"mixtral-8x7b", 1276, small, nullptr, interleaved},  // 319 rows
      {"mixtral-8x7b", 1277, small, nullptr, interleaved},  // 320 rows
      // The others, deepseek-v3's 256 large experts too: 64x256 up to 256 routed rows per expert, 128x256 above.
      {"deepseek-v3", 1024, small},     // 32 rows (the shared expert's 1024 do not count)
      {"deepseek-v3", 4096, small},     // 128 rows
      {"deepseek-v3", 8192, small},     // 256 rows
      {"deepseek-v3", 16384, large},    // 512 rows
      {"qwen3-30b-a3b", 4096, small},   // 256 rows
      {"qwen3-30b-a3b", 16384, large},  // 1024 rows
      // Gate-first w13 on experts below kLargeExpert: GEMM1 keeps the fused 64x256 tile up to 640 rows, GEMM2 up to
      // 440 rows.
      {"qwen3-30b-a3b", 4097, small},          // 257 rows
      {"qwen3-30b-a3b", 7040, small},          // 440 rows
      {"qwen3-30b-a3b", 7041, small, large},   // 441 rows
      {"qwen3-30b-a3b", 8192, small, large},   // 512 rows
      {"qwen3-30b-a3b", 10240, small, large},  // 640 rows
      {"qwen3-30b-a3b", 10241, large},         // 641 rows
      {"qwen3-30b-a3b", 8192, large, nullptr, interleaved},
      {"qwen3-next-80b", 16384, small},         // 320 rows
      {"qwen3-next-80b", 24576, small, large},  // 480 rows
      {"gpt-oss-120b", 10240, large},           // 320 rows, interleaved w13 (the checkpoint's)
      // Interleaved w13 on experts below kLargeExpert: the cooperative 128x256 pair at 200-240 rows, up to 256 rows
      // on experts of at least kMidExpert.
      {"gpt-oss-120b", 6368, small},                         // 199 rows
      {"gpt-oss-120b", 6369, large},                         // 200 rows
      {"gpt-oss-120b", 7680, large},                         // 240 rows
      {"gpt-oss-120b", 8192, large},                         // 256 rows: experts of at least kMidExpert
      {"qwen3-30b-a3b", 3841, small, nullptr, interleaved},  // 241 rows of smaller experts
      {"qwen3-30b-a3b", 4096, small, nullptr, interleaved},  // 256 rows
      {"qwen3-30b-a3b", 3584, large, nullptr, interleaved},  // 224 rows
      {"qwen3-30b-a3b", 3584, small},                        // 224 rows, gate-first
      {"deepseek-v3", 7168, small},                          // 224 rows of large experts
      // Experts of kMidExpert to kLargeExpert at 70-90 routed rows: swapped 96x256 tiles, one row tile per expert;
      // smaller experts keep 64x256.
      {"gpt-oss-120b", 2208, small},                          // 69 rows
      {"gpt-oss-120b", 2209, swap96},                         // 70 rows
      {"gpt-oss-120b", 2560, swap96},                         // 80 rows
      {"gpt-oss-120b", 2880, swap96},                         // 90 rows
      {"gpt-oss-120b", 2881, small},                          // 91 rows
      {"qwen3-next-80b", 3533, small},                        // 70 rows
      {"qwen3-next-80b", 4096, small},                        // 80 rows
      {"qwen3-next-80b", 4608, small},                        // 90 rows
      {"qwen3-next-80b", 4096, small, nullptr, interleaved},  // 80 rows
      {"qwen3-30b-a3b", 1280, small},                         // 80 rows
      {"deepseek-v3", 2560, small},                           // 80 rows of large experts
      {"mixtral-8x7b", 320, small},                           // 80 rows of a few large experts
      {"gpt-oss-120b", 4096, small},                          // 128 rows
      {"gpt-oss-120b", 16384, large},                         // 512 rows
      // Gate-first w13 without the fused GEMM1 keeps the bands chosen against GEMM1 plus the activation pass:
      // mixtral's 128x256 at 65-111 rows, and the swapped 96x256 at 70-90 rows on experts below kMidExpert (where
      // neither the halves form nor interleaved w13 takes it).
      {"mixtral-8x7b", 256, swap96, nullptr, gate_first, mixtral_unfused},        // 64 rows
      {"mixtral-8x7b", 257, large, nullptr, gate_first, mixtral_unfused},         // 65 rows
      {"mixtral-8x7b", 444, large, nullptr, gate_first, mixtral_unfused},         // 111 rows
      {"mixtral-8x7b", 445, small, nullptr, gate_first, mixtral_unfused},         // 112 rows
      {"qwen3-next-80b", 3532, small, nullptr, gate_first, qwen3_next_unfused},   // 69 rows
      {"qwen3-next-80b", 3533, swap96, nullptr, gate_first, qwen3_next_unfused},  // 70 rows
      {"qwen3-next-80b", 4608, swap96, nullptr, gate_first, qwen3_next_unfused},  // 90 rows
      {"qwen3-next-80b", 4609, small, nullptr, gate_first, qwen3_next_unfused},   // 91 rows
      {"qwen3-next-80b", 4096, small, nullptr, interleaved, qwen3_next_unfused},  // 80 rows
  };
  const std::span<const GemmTacticInfo> tactics = cuda_expert_gemm_tactics();
  for (const Pick& p : picks) {
    ExpertConfig cfg = find_preset(p.preset).experts;
    if (p.gate_up == GateUpLayout::interleaved) cfg.gate_up = p.gate_up;
    if (p.intermediate != 0) cfg.intermediate = p.intermediate;
    const ExpertTactic t = cuda_expert_default_tactic(cfg, p.tokens, TacticGpu::h200);
    const std::string where = std::string(p.preset) + " T=" + std::to_string(p.tokens) +
                              " I=" + std::to_string(cfg.intermediate) + " " +
                              std::string(gate_up_layout_name(cfg.gate_up));
    ASSERT_TRUE(t.gemm1 >= 0 && t.gemm1 < static_cast<int>(tactics.size())) << where;
    ASSERT_TRUE(t.gemm2 >= 0 && t.gemm2 < static_cast<int>(tactics.size())) << where;
    EXPECT_EQ(tactics[t.gemm1].name, p.tactic) << where;
    EXPECT_EQ(tactics[t.gemm2].name, p.gemm2 != nullptr ? p.gemm2 : p.tactic) << where;
  }
}

// Where paired runs on an H100 favoured other tiles, its picks differ from the H200's; elsewhere they are the same.
TEST(TacticHeuristic, H100RulesOverrideOnlyWhereMeasured) {
  const std::span<const GemmTacticInfo> tactics = cuda_expert_gemm_tactics();
  auto names = [&](const char* preset, int64_t tokens, TacticGpu gpu) {
    const ExpertTactic t = cuda_expert_default_tactic(find_preset(preset).experts, tokens, gpu);
    return std::string(tactics[t.gemm1].name) + " / " + std::string(tactics[t.gemm2].name);
  };
  const std::string large = "sm90_cooperative_128x256x64 / sm90_cooperative_128x256x64";
  const std::string small = "sm90_pingpong_64x256x64 / sm90_pingpong_64x256x64";
  const std::string swap96 = "sm90_swap_ab_cooperative_96x256x64 / sm90_swap_ab_cooperative_96x256x64";
  const std::string mixed = "sm90_pingpong_64x256x64 / sm90_swap_ab_cooperative_96x256x64";
  const std::string swap_g1 = "sm90_swap_ab_cooperative_96x256x64 / sm90_pingpong_64x256x64";
  struct Cell {
    const char* preset;
    int64_t tokens;
    const std::string& h100;
    const std::string& h200;
  };
  const Cell cells[] = {
      // Experts of at least kLargeExpert from 192 routed rows per expert: 128x256 on the H100.
      {"mixtral-8x7b", 764, small, small},    // 191 rows
      {"mixtral-8x7b", 765, large, small},    // 192 rows
      {"mixtral-8x7b", 4096, large, small},   // 1024 rows
      {"mixtral-8x7b", 12284, large, small},  // 3071 rows
      {"mixtral-8x7b", 16384, large, large},  // 4096 rows
      {"llama4-scout", 3056, small, small},   // 191 rows
      {"llama4-scout", 3057, large, small},   // 192 rows
      {"llama4-scout", 16384, large, small},  // 1024 rows
      {"deepseek-v3", 6112, small, small},    // 191 rows
      {"deepseek-v3", 6113, large, small},    // 192 rows
      {"deepseek-v3", 8192, large, small},    // 256 rows
      {"deepseek-v3", 16384, large, large},   // 512 rows
      // Experts of kMidExpert to kLargeExpert (gpt-oss): 128x256 at 56-72 rows on the H100, 64x256 at 73-90 rows
      // where the H200 takes swapped 96x256, GEMM1 on swapped 96x256 at 97-117 rows.
      {"gpt-oss-120b", 1760, small, small},    // 55 rows
      {"gpt-oss-120b", 1761, large, small},    // 56 rows
      {"gpt-oss-120b", 2048, large, small},    // 64 rows
      {"gpt-oss-120b", 2304, large, swap96},   // 72 rows
      {"gpt-oss-120b", 2305, small, swap96},   // 73 rows
      {"gpt-oss-120b", 2880, small, swap96},   // 90 rows
      {"gpt-oss-120b", 2881, small, small},    // 91 rows
      {"gpt-oss-120b", 3072, small, small},    // 96 rows
      {"gpt-oss-120b", 3073, swap_g1, small},  // 97 rows
      {"gpt-oss-120b", 3584, swap_g1, small},  // 112 rows
      {"gpt-oss-120b", 3744, swap_g1, small},  // 117 rows
      {"gpt-oss-120b", 3745, small, small},    // 118 rows
      // More than 64 experts of at least kLargeExpert on the H100: deepseek-v3's 256 take swapped 96x256 for GEMM2
      // at 70-80 rows and for both at 81-128, kimi-k2's 384 for both at 70-191 rows.
      {"deepseek-v3", 2208, small, small},   // 69 rows
      {"deepseek-v3", 2209, mixed, small},   // 70 rows
      {"deepseek-v3", 2560, mixed, small},   // 80 rows
      {"deepseek-v3", 2561, swap96, small},  // 81 rows
      {"deepseek-v3", 2880, swap96, small},  // 90 rows
      {"deepseek-v3", 3584, swap96, small},  // 112 rows
      {"deepseek-v3", 4096, swap96, small},  // 128 rows
      {"deepseek-v3", 4097, small, small},   // 129 rows
      {"kimi-k2", 3312, small, small},       // 69 rows
      {"kimi-k2", 3313, swap96, small},      // 70 rows
      {"kimi-k2", 4096, swap96, small},      // 86 rows
      {"kimi-k2", 4321, swap96, small},      // 91 rows
      {"kimi-k2", 9168, swap96, small},      // 191 rows
      {"kimi-k2", 9169, large, small},       // 192 rows
      {"mixtral-8x7b", 320, small, small},   // 80 rows on 8 experts: the few large experts' rules
      // Smaller experts: unchanged.
      {"qwen3-30b-a3b", 4096, small, small},    // 256 rows
      {"qwen3-next-80b", 16384, small, small},  // 320 rows
  };
  for (const Cell& c : cells) {
    const std::string where = std::string(c.preset) + " T=" + std::to_string(c.tokens);
    EXPECT_EQ(names(c.preset, c.tokens, TacticGpu::h100), c.h100) << where;
    EXPECT_EQ(names(c.preset, c.tokens, TacticGpu::h200), c.h200) << where;
  }
  // Below the bands the rules agree, GEMV and swapped tiles included.
  for (const char* preset : {"mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3", "qwen3-next-80b", "gpt-oss-120b"})
    for (int64_t t : {1, 4, 16, 64, 256})
      EXPECT_EQ(names(preset, t, TacticGpu::h100), names(preset, t, TacticGpu::h200)) << preset << " T=" << t;
}

// Which GEMM1 tactics apply b13 + the activation themselves, per w13 arrangement: the GEMV always, the tiles with a
// fused gated epilogue for that arrangement, and none of the grouped tiles for gate-first / up-first w13 whose I is
// no multiple of 128.
TEST(TacticHeuristic, ActivationInGemm1WhereAFusedFormExists) {
  const int n = static_cast<int>(cuda_expert_gemm_tactics().size());
  ASSERT_EQ(n, 7);
  struct Expect {
    GateUpLayout gate_up;
    int64_t intermediate;
    std::array<bool, 7> fused;  // by tactic index
  };
  const Expect cases[] = {
      {GateUpLayout::interleaved, 768, {true, false, false, true, true, true, false}},
      {GateUpLayout::interleaved, 448, {true, false, false, true, true, true, false}},
      {GateUpLayout::gate_first, 768, {true, false, false, false, true, true, false}},
      {GateUpLayout::up_first, 512, {true, false, false, false, true, true, false}},
      {GateUpLayout::gate_first, 448, {true, false, false, false, false, false, false}},
      {GateUpLayout::up_first, 14272, {true, false, false, false, false, false, false}},
  };
  for (const Expect& e : cases) {
    ExpertConfig cfg = find_preset("qwen3-30b-a3b").experts;
    cfg.gate_up = e.gate_up;
    cfg.intermediate = e.intermediate;
    for (int t = 0; t < n; ++t)
      EXPECT_EQ(cuda_expert_gemm1_fuses_activation(cfg, t), e.fused[t])
          << gate_up_layout_name(e.gate_up) << " I = " << e.intermediate << " tactic " << t;
  }
  for (int bad : {-1, n}) {
    const ExpertConfig cfg = find_preset("mixtral-8x7b").experts;
    const std::string message =
        moekit::testing::error_of<NotSupported>([&] { cuda_expert_gemm1_fuses_activation(cfg, bad); });
    EXPECT_NE(message.find("gemm1 tactic (" + std::to_string(bad) + ") must be one of: 0: gemv_8rows"),
              std::string::npos)
        << message;
  }
}

// Every rule of the default heuristic picks the pair somewhere: none is shadowed by the rules before it. Swept over
// the presets with each w13 arrangement (and I off a multiple of kHalvesRows, for the unfused form), with and without
// their shared experts, at every T up to 16384 on both GPUs' rules.
TEST(TacticHeuristic, EveryRuleIsReachable) {
  const size_t count = detail::default_tactic_rule_count();
  ASSERT_GT(count, 0u);
  std::vector<int64_t> hits(count, 0);
  for (const Preset& p : presets())
    for (GateUpLayout layout : {GateUpLayout::gate_first, GateUpLayout::up_first, GateUpLayout::interleaved})
      for (int64_t intermediate : {p.experts.intermediate, p.experts.intermediate + 64})
        for (int shared : {0, p.experts.num_shared_experts})
          for (TacticGpu gpu : {TacticGpu::h200, TacticGpu::h100}) {
            ExpertConfig c = p.experts;
            c.gate_up = layout;
            c.intermediate = intermediate;
            c.num_shared_experts = shared;
            for (int64_t t = 1; t <= 16384; ++t) {
              const size_t rule = detail::default_tactic_rule(c, t, gpu);
              ASSERT_LT(rule, count);
              ++hits[rule];
            }
          }
  for (size_t i = 0; i < count; ++i) EXPECT_GT(hits[i], 0) << "rule " << i << " of " << count << " is never taken";
}

// The rules a device gets: the H100 SXM's and GPUs with as little DRAM bandwidth per SM take h100's, the H200 and
// anything the fields do not describe h200's.
TEST(TacticGpu, FollowsDramBandwidthPerSm) {
  auto gpu = [](int clock_khz, int bus_bits, int sms) {
    DeviceInfo d;
    d.memory_clock_khz = clock_khz;
    d.memory_bus_bits = bus_bits;
    d.sm_count = sms;
    return tactic_gpu_of(d);
  };
  EXPECT_NEAR(peak_dram_bytes_per_s(DeviceInfo{.memory_clock_khz = 2619000, .memory_bus_bits = 5120}), 3.352e12, 1e9);
  EXPECT_EQ(gpu(2619000, 5120, 132), TacticGpu::h100);  // H100 SXM: 25.4 GB/s per SM
  EXPECT_EQ(gpu(3201000, 6144, 132), TacticGpu::h200);  // H200: 37.3 GB/s per SM
  EXPECT_EQ(gpu(2619000, 6144, 132), TacticGpu::h100);  // 30.5 GB/s per SM
  EXPECT_EQ(gpu(2619000, 6144, 78), TacticGpu::h200);   // 51.6 GB/s per SM
  EXPECT_EQ(gpu(0, 5120, 132), TacticGpu::h200);        // unknown clock
  EXPECT_EQ(gpu(2619000, 0, 132), TacticGpu::h200);     // unknown bus
  EXPECT_EQ(gpu(2619000, 5120, 0), TacticGpu::h200);    // unknown SM count
  EXPECT_EQ(tactic_gpu_name(TacticGpu::h100), "h100");
  EXPECT_EQ(tactic_gpu_name(TacticGpu::h200), "h200");
}

}  // namespace
}  // namespace moekit

// The CUDA experts' GEMM tactic table and what host code needs to know of it: which grouped tiles have a GEMM1 with
// the gated activation in its epilogue for each form w13 takes. Host code, in every build: the default heuristic
// (tactics.cpp), `moekit tactics` and the tests read it without CUDA; cuda/cuda_experts.cpp checks its tables of
// instantiations against it at compile time.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "moekit/cuda_experts.h"
#include "moekit/experts.h"

namespace moekit::detail {

inline constexpr std::array<GemmTacticInfo, 7> kTactics{{
    {"gemv_8rows", GemmKernelKind::gemv, 8, 8, 0},
    {"sm90_pingpong_64x128x64", GemmKernelKind::grouped, 64, 128, 64},
    {"sm90_cooperative_128x128x64", GemmKernelKind::grouped, 128, 128, 64},
    {"sm90_cooperative_128x256x64", GemmKernelKind::grouped, 128, 256, 64},
    {"sm90_pingpong_64x256x64", GemmKernelKind::grouped, 64, 256, 64},
    {"sm90_swap_ab_cooperative_32x128x64", GemmKernelKind::grouped, 32, 128, 64, true},
    {"sm90_swap_ab_cooperative_96x256x64", GemmKernelKind::grouped, 96, 256, 64, true},
}};

/// Rows of each w13 block that the halves form's GEMM1 tile loads at once: gate-first / up-first w13 takes the fused
/// form where I is a multiple of this.
inline constexpr int64_t kHalvesRows = 128;

// The three forms w13 takes in GEMM1, a bit each (w13_form()); a rule serves a set of them.
using W13Forms = uint8_t;
inline constexpr W13Forms kHalvesW13 = 1;  // gate-first / up-first, I a multiple of kHalvesRows: fused (kHalvesOps)
inline constexpr W13Forms kInterleavedW13 = 2;  // interleaved: fused epilogue on gate/up column pairs (kGatedOps)
inline constexpr W13Forms kUnfusedW13 = 4;      // gate-first / up-first otherwise: GEMM1, then the activation pass
inline constexpr W13Forms kAnyW13 = kHalvesW13 | kInterleavedW13 | kUnfusedW13;

/// The form `c`'s w13 takes in GEMM1: interleaved, or gate-first / up-first through the halves main loop where I is
/// a multiple of kHalvesRows, else unfused.
W13Forms w13_form(const ExpertConfig& c);

/// By tactic index: whether GEMM1 on that grouped tile has a fused gated epilogue for interleaved w13 (kGatedOps in
/// cuda/cuda_experts.cpp) and for the halves form (kHalvesOps). The GEMV applies the activation itself and is false
/// here.
inline constexpr std::array<bool, kTactics.size()> kFusedInterleaved{false, false, false, true, true, true, false};
inline constexpr std::array<bool, kTactics.size()> kFusedHalves{false, false, false, false, true, true, false};

/// The index, in the default heuristic's table of rules (src/experts/tactics.cpp), of the rule that picks
/// cuda_expert_default_tactic(c, tokens, gpu): the first that matches, else the last. For tests that every rule is
/// reachable, i.e. none is shadowed by the rules before it.
size_t default_tactic_rule(const ExpertConfig& c, int64_t tokens, TacticGpu gpu);
/// The number of rules in that table.
size_t default_tactic_rule_count();

/// Throws NotSupported naming the valid indices unless 0 <= index < kTactics.size(); `which` is "gemm1" or "gemm2".
void check_tactic(int index, std::string_view which);

}  // namespace moekit::detail

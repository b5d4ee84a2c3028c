// CudaExperts: validation, the tactic table and its heuristic, workspace for max_tokens (one cudaMalloc at
// construction), and run(), which only enqueues kernels: fill grouped-GEMM arrays (when a grouped GEMM runs),
// gather + GEMM1 + activation or the fused decode GEMV, GEMM2 (grouped or GEMV), combine. Intermediates are bf16
// in the plan's padded row order: a1/y [cap, H] (one buffer: a1 is dead once GEMM1 has run), c1 [cap, 2I],
// act [cap, I].
#include "moekit/cuda_experts.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <climits>
#include <string>

#include "core/device_scope.h"
#include "core/in_place.h"
#include "experts/cuda/experts_kernels.h"
#include "moekit/device.h"
#include "moekit/error.h"

namespace moekit {
namespace {

using detail::GroupedGemmOps;

constexpr std::array<GemmTacticInfo, 7> kTactics{{
    {"gemv_8rows", GemmKernelKind::gemv, 8, 8, 0},
    {"sm90_pingpong_64x128x64", GemmKernelKind::grouped, 64, 128, 64},
    {"sm90_cooperative_128x128x64", GemmKernelKind::grouped, 128, 128, 64},
    {"sm90_cooperative_128x256x64", GemmKernelKind::grouped, 128, 256, 64},
    {"sm90_pingpong_64x256x64", GemmKernelKind::grouped, 64, 256, 64},
    {"sm90_swap_ab_cooperative_32x128x64", GemmKernelKind::grouped, 32, 128, 64, true},
    {"sm90_swap_ab_cooperative_96x256x64", GemmKernelKind::grouped, 96, 256, 64, true},
}};
// The instantiation behind each grouped entry of kTactics (nullptr for the GEMV).
constexpr std::array<GroupedGemmOps (*)(), kTactics.size()> kGroupedOps{
    nullptr,
    &detail::sm90_grouped_gemm_pingpong_64x128x64,
    &detail::sm90_grouped_gemm_cooperative_128x128x64,
    &detail::sm90_grouped_gemm_cooperative_128x256x64,
    &detail::sm90_grouped_gemm_pingpong_64x256x64,
    &detail::sm90_grouped_gemm_swap_ab_cooperative_128x32x64,
    &detail::sm90_grouped_gemm_swap_ab_cooperative_256x96x64};
// GEMM1 with the gated activation in its epilogue, where a tile exists in that form: used instead of the tactic's
// GEMM1 + activation pass when w13 is interleaved (gate and up rows of an output side by side in one tile). The
// pingpong 64x256 tile has one (one consumer's epilogue overlaps the other's main loop), so has the swapped 32x128
// tile, whose epilogue holds at most 32 plan rows (experts graph time against GEMM1 + the pass, H200: gpt-oss T =
// 64 / 256 / 512 0.993 / 0.981 / 0.980, qwen3 with interleaved w13 T = 16 / 64 / 256 0.974 / 0.979 / 0.982), and so
// has the cooperative 128x256 tile, since its act staging sits in the void-D epilogue's unused D staging and its
// main loop keeps four stages (with its own staging it had three and ran 1.17x slower than GEMM1 + the pass at
// gpt-oss T = 16384; now, against that pass, gpt-oss T = 16384 0.975, qwen3 with interleaved w13 T = 16384 0.967).
// The swapped 96x256 tile in that form was mixed (gpt-oss T = 2560 1.013, qwen3 T = 1280 0.993, qwen3-next T = 4096
// 0.990) and is not built.
constexpr std::array<GroupedGemmOps (*)(), kTactics.size()> kGatedOps{
    nullptr,
    nullptr,
    nullptr,
    &detail::sm90_grouped_gemm_gated_cooperative_128x256x64,
    &detail::sm90_grouped_gemm_gated_pingpong_64x256x64,
    &detail::sm90_grouped_gemm_gated_swap_ab_cooperative_128x32x64,
    nullptr};
// The same for w13 in two blocks (gate-first / up-first) with I a multiple of kHalvesRows, on the pingpong 64x256
// tile: tile n loads rows [128 n, 128 n + 128) of each block into its two halves, two TMA boxes per stage (a 3D view
// that alternated gate and up rows in one box ran 1.1-2.2x slower: docs/benchmarks.md, "Twelfth session"). Experts
// graph time against GEMM1 + the pass, paired runs on the H200 ("Thirty-sixth session"): qwen3 T = 1024 / 4096
// 0.960-0.963 / 0.988-1.000, qwen3-next T = 1024 0.972-0.973, mixtral T = 1024 / 4096 0.954-0.956 / 0.977-0.980,
// deepseek-v3 T = 256 / 1024 0.995 / 0.980-0.983, but deepseek-v3 T = 4096 1.016-1.027. The cooperative 128x256
// tile in that form was no faster (T = 16384: qwen3 0.994-1.001, qwen3-next 0.992-0.993, deepseek-v3 1.002-1.004,
// mixtral 1.015-1.016) and is not built. The swapped 32x128 tile has one too: its A tile is 64 rows of each block,
// whose pairs lie in different warpgroups, so both are staged and paired when the tile is copied out. Against
// GEMM1 + the pass, paired runs in both orders on the H200 ("Fifty-first session"): qwen3 T = 16 / 64 0.982-0.994 /
// 0.977-0.981, mixtral T = 16 / 64 0.989-1.000 / 0.985-0.986, qwen3-next T = 64 0.983-0.993, deepseek-v3 T = 16 /
// 64 0.999-1.001. Elsewhere these layouts keep GEMM1 + the pass, or rearrange_gate_up() interleaves them.
constexpr int64_t kHalvesRows = 128;
constexpr std::array<GroupedGemmOps (*)(), kTactics.size()> kHalvesOps{
    nullptr,
    nullptr,
    nullptr,
    nullptr,
    &detail::sm90_grouped_gemm_gated_halves_pingpong_64x256x64,
    &detail::sm90_grouped_gemm_gated_halves_swap_ab_cooperative_128x32x64,
    nullptr};

// Default heuristic, first matching rule. Keys: the rows a routed expert is expected to get (the average over active
// routed experts, ceil(T*K / min(E, T*K))), T, the size of one expert's GEMM1 weights (2I x H), the number of routed
// experts, the routed load 4 T K / E (routed rows per expert, in quarters) and the number of shared experts. Fitted
// to the H200 sweeps in docs/benchmarks.md: the GEMV wins while at most 3/4 of a routed row falls on each expert
// without shared experts (qwen3 T = 8 / 12: 0.91 / 0.88 of the floor against 0.77 / 0.82 for 64x256; gpt-oss T = 16 /
// 24: 1.07 / 1.03 against 0.97 / 1.00; qwen3-next T = 32: 1.00 against 0.94; a tie at a load of 3/4-1, 64x256 ahead
// from 1 on: "Fourteenth session"), and with shared experts (each of which holds T rows) for up to 4 tokens at ~1 row
// per expert (deepseek-v3 T = 8 / 16: 64x256 1.02x / 1.10x faster than the GEMV); 128x256 cooperative tiles win over
// 64x256 from 64 rows per expert on a few large experts (mixtral T = 256: 1.07x), and take them from 65 rows (below,
// swapped 96x256 tiles: see the end of this comment) up to 111 rows; beyond that, on such experts, the 128-row tiles'
// padding (half the experts one tile more when the rows sit near a multiple of 128) and GEMM2's few waves (16 N tiles
// of 256 per row tile on mixtral) decide, by bands of rows per expert ("Twenty-first session", experts graph time
// against 128x256 for both GEMMs, same call: mixtral T = 512 / 768 0.875-0.886 / 0.949 with 64x256 for both, T = 1024
// 0.976-0.978 with 64x256 for GEMM2 only, T = 1536 / 2048 / 4096 / 8192 0.949 / 0.982 / 0.978 / 0.985 with 64x256 for
// both, and T = 16384 1.019-1.043 with any 64x256; the bands' edges lie between those token counts, and the bands
// held between them: T = 640 / 1152 / 1280 / 2560 / 6144 0.879 / 0.988 / 0.989 / 0.987 / 0.993 against 128x256 for
// both). From 224 to 319 rows GEMM1 also takes 64x256, since routing is never uniform in an engine: against 128x256 /
// 64x256 (paired runs, "Thirty-fourth session"), uniform routing at T = 893 / 896 / 1024 / 1152 / 1276 1.015 / 1.021
// / 1.010 / 0.941 / 0.965, with the hottest expert at 1.2x the mean (bench moe --logit-skew 0.25) T = 893 / 1024 /
// 1276 0.986 / 0.963 / 0.979, at 1.4x (0.5) T = 896 / 1024 / 1152 0.942 / 0.983 / 0.967; the 128-row tiles pad each
// expert that skew moves off a multiple of 128 rows by up to a tile (with interleaved w13 the 64x256 tile's fused
// epilogue adds to that: T = 1024 0.975 against 1.014 on 128x256 / 64x256). Above 256 rows on the others 128x256
// (gpt-oss at 512 rows: 1.14x over 64x256; deepseek-v3 at 256 rows: within 0.4%); swapped 32x128 tiles up to 16
// routed rows per expert, with shared experts (T rows each, ceil(T / 32) tiles per weight tile) up to T = 64
// ("Seventeenth session", experts time against 64x256: mixtral T = 8 / 16 / 64 0.979 / 0.980 / 0.982, qwen3 T = 32
// 0.963, gpt-oss T = 64 / 256 0.983 / 0.989, qwen3-next T = 64 / 256 0.990 / 0.993, deepseek-v3 T = 8 / 16 / 64 0.971
// / 0.983 / 0.998 but T = 256 / 512 1.003 / 1.014; at 32 rows, gpt-oss T = 1024, 1.13); 64x256 pingpong tiles below
// 256 rows (mixtral T = 16-64: 1.03-1.06x over 64x128; qwen3-next T = 1024-4096: 1.04-1.10x, qwen3 and gpt-oss T =
// 4096: 1.02x, deepseek-v3 at 64-128 rows with every expert routed: 1.03-1.04x over 128x256), except from 70 to 90
// rows on experts of kMidExpert to kLargeExpert, where swapped 96x256 tiles hold an expert's rows in one row tile
// instead of two ("Twenty-seventh session", experts graph time against 64x256, same call: qwen3-next T = 3584 / 4096
// / 4608 (70 / 80 / 90 rows) 0.989 / 0.967 / 0.984, qwen3 T = 1280 (80) 0.965, gpt-oss T = 2560 (80) 0.943; outside
// the band qwen3-next 60 / 100 rows 1.028 / 1.075, qwen3 and gpt-oss 64 / 96 rows 0.993-1.011 / 1.036-1.067, and
// deepseek-v3's large experts 1.004-1.015 at 64-80 rows; inside the band GEMM2 on 64x256 / 128x256 instead ran
// 1.002-1.029 / 1.009-1.014x, "Twenty-ninth session"). That band wins only on near-uniform routing: with skew, 64x256
// for both ran, against it, qwen3-next T = 4096 0.945 / 0.929 (S = 0.25 / 0.5), qwen3 T = 1280 0.983 / 0.937 and
// gpt-oss T = 2560 0.977 / 0.998, and 1.020 on qwen3-next with uniform routing in the same call ("Thirty-fourth
// session"). It is kept for the uniform routing the benchmarks use; an engine whose routing is skewed tunes on its
// own logits (TuneOptions::logits, moekit tune --logits). Since gate-first / up-first w13 got its fused 64x256 GEMM1
// (kHalvesOps), the band lost on the smaller experts ("Forty-ninth session", paired, 64x256 for both against it:
// qwen3-next T = 3584 / 4096 / 4608 0.980 / 0.997 / 0.972, qwen3 T = 1280 0.992, qwen3-next with w13 interleaved T =
// 4096 0.991), but not on gpt-oss (T = 2560: 1.019); so it serves experts of at least kMidExpert, and smaller ones
// only where gate-first / up-first w13 has no fused GEMM1 (I no multiple of kHalvesRows), as when it was chosen (not
// measured since). On an H100 it lost on all three presets (0.957-0.978), and the H100's rules below drop it. On a
// few large experts swapped 96x256 tiles take 56-64 rows: there the hottest of mixtral's 8 experts outgrows one
// 64-row tile (each extra row tile streams the expert's weights again), while one 96-row tile holds it with half the
// mean to spare for skewed routing ("Twenty-eighth session", same call, against the 64x256 / 128x256 defaults:
// mixtral T = 224 / 240 / 256 0.917 / 0.932 / 0.957-0.973; at 44-52 rows 1.010-1.016). Above 64 rows the 128-row
// tiles stay: with uniform routing the 96-row tiles still ran 0.945-0.969 at 68-84 rows, but 1.105-1.124 at 88-92
// rows, where the hottest expert needs a second 96-row tile, and a skewed router reaches that sooner. Measured with
// skew (bench moe --logit-skew S): with the hottest expert at 67-88 rows (S = 0.25 / 0.5) the band's T = 224 / 240 /
// 256 ran 0.927-0.961 of the old tiles' time, with it at 98-115 rows (S = 1, 1.75-1.8x the mean) 1.052-1.123.
// Likewise at 224-288 rows, where three 96-row tiles hold an expert that needs three 128-row tiles above 256 rows:
// swapped 96x256 for both GEMMs ran 0.934 / 0.987 of 128x256 / 64x256 at mixtral T = 1024 / 1152 with uniform
// routing, but 1.037 at T = 1024 with S = 0.5 (hottest expert 361 rows) and 1.111 at T = 896 ("Thirty-third
// session"); not taken. Cooperative 128x256 tiles took 65-111 rows of these experts ("Twenty-first session") until
// gate-first / up-first w13 got its fused 64x256 GEMM1; since then 64x256 for both ran 0.962-0.997 of their time at
// mixtral T = 260-444 (65-111 rows), but 1.006 at T = 320 and 1.021 at T = 260 in one of two calls each ("Fiftieth
// session", paired, H200), so the band no longer serves the halves form; it stays for interleaved w13 (there T =
// 300-444 tied at 0.998-1.010 and T = 260 favoured 128x256 by 1.023) and for gate-first / up-first w13 whose GEMM1
// still needs the activation pass, as when it was chosen (not measured since). Where w13 takes the halves form
// (gate-first / up-first, I a multiple of kHalvesRows), experts smaller than kLargeExpert keep GEMM1 on the fused
// 64x256 tile up to 640 rows, GEMM2 on 128x256: against 128x256 for both (GEMM1 + the activation pass), paired runs
// ("Thirty-seventh session"), qwen3 at 384 / 512 / 640 rows 0.958 / 0.957 / 0.983 but 1024 / 1280 rows 1.018 / 1.019
// (768 / 896 rows 1.001 / 1.003), qwen3-next at 320 / 400 rows 0.964 / 0.972; with interleaved w13 the 128x256 tile
// has a fused epilogue of its own and wins (gpt-oss at 320 rows: 64x256 1.055), and so do deepseek-v3's large experts
// (512 rows: 1.026). In that band GEMM2 stays on 64x256 up to 440 rows ("Thirty-eighth session", paired, against
// 128x256: qwen3-next at 320 / 400 / 440 / 480 rows 0.988 / 0.988 / 0.998 / 1.009, qwen3 at 384 / 512 / 640 rows
// 0.999 / 0.994 / 1.018). Interleaved w13 on experts below kLargeExpert takes the cooperative 128x256 pair (its GEMM1
// fused) at 200-240 rows, where four 64-row tiles and two 128-row tiles hold most experts' rows alike (same session,
// against 64x256 for both: gpt-oss at 200 / 208 / 224 / 240 / 256 rows 0.978 / 0.966 / 0.989 / 0.974 / 0.963, qwen3
// with w13 interleaved at 224 / 240 rows 0.986 / 1.008, qwen3-next at 220 / 240 rows 0.985 / 0.980; at 192 rows
// gpt-oss 1.040), and experts of at least kMidExpert up to 256 rows (gpt-oss at 256 rows 0.963; qwen3 with w13
// interleaved there 1.045: how much padding the 128-row tile's fewer bytes per FLOP outweigh depends on the shape).
constexpr int64_t kAny = INT64_MAX;
// The three forms w13 takes in GEMM1, a bit each (w13_form()); a rule serves a set of them.
using W13Forms = uint8_t;
constexpr W13Forms kHalvesW13 = 1;       // gate-first / up-first, I a multiple of kHalvesRows: fused (kHalvesOps)
constexpr W13Forms kInterleavedW13 = 2;  // interleaved: fused epilogue on gate/up column pairs (kGatedOps)
constexpr W13Forms kUnfusedW13 = 4;      // gate-first / up-first otherwise: GEMM1, then the activation pass
constexpr W13Forms kAnyW13 = kHalvesW13 | kInterleavedW13 | kUnfusedW13;
// The GPUs a rule serves (TacticGpu), a bit each.
using Gpus = uint8_t;
constexpr Gpus kH200Gpu = 1;
constexpr Gpus kH100Gpu = 2;
constexpr Gpus kAnyGpu = kH200Gpu | kH100Gpu;
constexpr Gpus gpu_bit(TacticGpu g) {
  return g == TacticGpu::h100 ? kH100Gpu : kH200Gpu;
}
struct HeuristicRule {
  int64_t min_rows = 0, max_rows = kAny, max_tokens = kAny, min_weights = 0, max_weights = kAny;
  int64_t max_experts = kAny;
  int64_t max_load4 = kAny, max_shared = kAny;
  W13Forms w13 = kAnyW13;
  Gpus gpus = kAnyGpu;
  int gemm1, gemm2;
};
constexpr int64_t kLargeExpert = int64_t{24} << 20;  // 2I x H elements
// 2I x H elements, between qwen3's 3.1M and gpt-oss's 16.6M: the interleaved band's 241-256 rows and the swapped
// 96x256 band at 70-90 rows win on gpt-oss only.
constexpr int64_t kMidExpert = int64_t{8} << 20;
// A band of rows per expert for at most 64 experts of at least kLargeExpert weights each, for the w13 forms `form`.
constexpr HeuristicRule few_large(int64_t min_rows, int64_t max_rows, int gemm1, int gemm2, W13Forms form = kAnyW13) {
  return {.min_rows = min_rows,
          .max_rows = max_rows,
          .min_weights = kLargeExpert,
          .max_experts = 64,
          .w13 = form,
          .gemm1 = gemm1,
          .gemm2 = gemm2};
}
// A band of rows per expert for experts of kMidExpert to kLargeExpert weights, on the GPUs `gpus`.
constexpr HeuristicRule mid_sized(int64_t min_rows, int64_t max_rows, int gemm1, int gemm2, Gpus gpus = kAnyGpu) {
  return {.min_rows = min_rows,
          .max_rows = max_rows,
          .min_weights = kMidExpert,
          .max_weights = kLargeExpert - 1,
          .gpus = gpus,
          .gemm1 = gemm1,
          .gemm2 = gemm2};
}
// The H100's rules (TacticGpu::h100), ahead of the H200's that they override: cooperative 128x256 tiles for both
// GEMMs from 192 routed rows per expert on experts of at least kLargeExpert, and at 56-72 rows on experts of
// kMidExpert to kLargeExpert, which keep 64x256 at 73-90 rows instead of the H200's swapped 96x256 (gpt-oss at 80
// rows: 0.973 of its time, "Forty-ninth session", on an H100). Paired runs on an H100 SXM (docs/benchmarks.md,
// "Sixtieth session", experts graph time of 128x256 for both against the H200's picks, same call): mixtral at 192 /
// 256 / 512 / 1024 / 2048 rows 1.000 / 0.961 / 0.950 / 0.819 / 0.857 (112 / 128 rows 1.067 / 1.075), llama4-scout at
// 192 / 256 / 512 / 1024 rows 0.911 / 0.897 / 0.836 / 0.810 (112 / 128 rows 0.996 / 0.975), deepseek-v3 at 192 / 256
// rows 0.915 / 0.877 (64 / 96 / 128 rows 1.039 / 0.946 / 0.998); gpt-oss at 56 / 64 / 72 rows 0.979 / 0.898 / 0.974
// (128 rows 1.034). With 3.35 TB/s against the H200's 4.92, the 128-row tile's half as many reads of each weight tile
// outweigh its padding there; gpt-oss's mean at 56-72 rows puts about half its experts past one 64-row tile. Routing
// skew was not measured on the H100.
constexpr std::array<HeuristicRule, 19> kHeuristic{{
    {.max_load4 = 3, .max_shared = 0, .gemm1 = 0, .gemm2 = 0},
    {.max_rows = 1, .max_tokens = 4, .gemm1 = 0, .gemm2 = 0},
    {.max_rows = 16, .max_tokens = 64, .gemm1 = 5, .gemm2 = 5},
    {.max_rows = 16, .max_shared = 0, .gemm1 = 5, .gemm2 = 5},
    {.min_rows = 192, .min_weights = kLargeExpert, .gpus = kH100Gpu, .gemm1 = 3, .gemm2 = 3},
    mid_sized(56, 72, 3, 3, kH100Gpu),
    mid_sized(73, 90, 4, 4, kH100Gpu),
    few_large(56, 64, 6, 6),
    few_large(65, 111, 3, 3, kInterleavedW13 | kUnfusedW13),
    few_large(112, 3071, 4, 4),
    few_large(3072, kAny, 3, 3),
    mid_sized(70, 90, 6, 6),
    {.min_rows = 70, .max_rows = 90, .max_weights = kMidExpert - 1, .w13 = kUnfusedW13, .gemm1 = 6, .gemm2 = 6},
    {.min_rows = 200,
     .max_rows = 240,
     .max_weights = kLargeExpert - 1,
     .w13 = kInterleavedW13,
     .gemm1 = 3,
     .gemm2 = 3},
    {.min_rows = 241,
     .max_rows = 256,
     .min_weights = kMidExpert,
     .max_weights = kLargeExpert - 1,
     .w13 = kInterleavedW13,
     .gemm1 = 3,
     .gemm2 = 3},
    {.max_rows = 256, .gemm1 = 4, .gemm2 = 4},
    {.max_rows = 440, .max_weights = kLargeExpert - 1, .w13 = kHalvesW13, .gemm1 = 4, .gemm2 = 4},
    {.max_rows = 640, .max_weights = kLargeExpert - 1, .w13 = kHalvesW13, .gemm1 = 4, .gemm2 = 3},
    {.gemm1 = 3, .gemm2 = 3},
}};

// The form `c`'s w13 takes in GEMM1: interleaved, or gate-first / up-first through the halves main loop
// (kHalvesOps) where I is a multiple of kHalvesRows, else unfused.
W13Forms w13_form(const ExpertConfig& c) {
  if (c.gate_up == GateUpLayout::interleaved) return kInterleavedW13;
  return c.intermediate % kHalvesRows == 0 ? kHalvesW13 : kUnfusedW13;
}

// GEMM1's instantiations with the gated activation in their epilogue for `c`'s w13 (kGatedOps or kHalvesOps), or
// nullptr where no tile has that form.
const std::array<GroupedGemmOps (*)(), kTactics.size()>* gated_table(const ExpertConfig& c) {
  switch (w13_form(c)) {
    case kInterleavedW13:
      return &kGatedOps;
    case kHalvesW13:
      return &kHalvesOps;
    default:
      return nullptr;
  }
}

constexpr int64_t kAlign = 256;
int64_t round_up(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}

void cuda_check(cudaError_t err, std::string_view call) {
  detail::check_cuda(err, "experts", call);
}

// TMA and the 16-byte loads need 16; the fp32 biases' scalar fallback needs 4.
void check_aligned(const TensorView& t, std::string_view name, int bytes = 16) {
  if (t.present() && !t.starts_aligned(bytes))
    throw InvalidArgument("experts", fmt::format("{} data ({}) must be {}-byte aligned", name, t.data, bytes));
}

std::string tactic_list() {
  std::string s;
  for (size_t i = 0; i < kTactics.size(); ++i) s += fmt::format("{}{}: {}", i ? ", " : "", i, kTactics[i].name);
  return s;
}

void check_tactic(int index, std::string_view which) {
  if (index < 0 || index >= static_cast<int>(kTactics.size()))
    throw NotSupported("experts", fmt::format("{} tactic ({}) must be one of: {}", which, index, tactic_list()));
}

detail::BiasRef bias_ref(const TensorView& b) {
  return {b.present() ? b.data : nullptr, b.dtype == DType::bf16};
}

}  // namespace

void detail::check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw CudaError("experts", fmt::format("{} launch failed: {}", what, cudaGetErrorString(err)));
}

std::span<const GemmTacticInfo> cuda_expert_gemm_tactics() {
  return kTactics;
}

bool cuda_expert_gemm1_fuses_activation(const ExpertConfig& config, int gemm1) {
  check_tactic(gemm1, "gemm1");
  if (kTactics[gemm1].kind == GemmKernelKind::gemv) return true;
  const auto* table = gated_table(config);
  return table != nullptr && (*table)[gemm1] != nullptr;
}

struct CudaExperts::Impl {
  ExpertConfig cfg;
  ExpertWeights w;
  int64_t max_tokens = 0;
  int block = 0;
  Device device;
  int sm_count = 0;
  TacticGpu gpu = TacticGpu::h200;  // the default heuristic's rules for this device
  int groups = 0;                   // G = E + S
  int64_t bytes = 0;
  void* storage = nullptr;
  void* a1y = nullptr;  // [cap, H]
  void* c1 = nullptr;   // [cap, 2I]
  void* act = nullptr;  // [cap, I]
  detail::GroupedGemmArgs gemm1, gemm2;
  std::array<GroupedGemmOps, kTactics.size()> ops{};
  std::array<GroupedGemmOps, kTactics.size()> gated_ops{};  // kGatedOps or kHalvesOps, by w13's layout
  detail::ExpertMap map;                                    // global expert id -> local weights

  ~Impl() {
    if (storage != nullptr) cudaFree(storage);  // errors ignored: a destructor must not throw
  }
};

CudaExperts::CudaExperts(const CudaExpertsArgs& a) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  validate_expert_weights(a.config, a.weights, a.device);
  check_aligned(a.weights.w13, "w13");
  check_aligned(a.weights.w2, "w2");
  check_aligned(a.weights.b13, "b13", 4);
  check_aligned(a.weights.b2, "b2", 4);
  if (a.max_tokens < 1) throw InvalidArgument("experts", fmt::format("max_tokens ({}) must be >= 1", a.max_tokens));
  if (a.block < 1 || a.block > kMaxBlock)
    throw InvalidArgument("experts", fmt::format("block ({}) must be in [1, {}]", a.block, kMaxBlock));
  if (!a.device.is_cuda() || !device_is_sm90(a.device.index))
    throw NotSupported("experts", fmt::format("device ({}) must be an sm_90 GPU", device_name(a.device)));

  m.cfg = a.config;
  m.w = a.weights;
  m.max_tokens = a.max_tokens;
  m.block = a.block;
  m.device = a.device;
  const DeviceInfo info = device_info(a.device.index);
  m.sm_count = info.sm_count;
  m.gpu = tactic_gpu_of(info);
  m.groups = a.config.num_experts + a.config.num_shared_experts;
  for (size_t i = 0; i < kTactics.size(); ++i)
    if (kGroupedOps[i] != nullptr) m.ops[i] = kGroupedOps[i]();
  if (const auto* table = gated_table(a.config))
    for (size_t i = 0; i < kTactics.size(); ++i)
      if ((*table)[i] != nullptr) m.gated_ops[i] = (*table)[i]();
  m.map = {a.config.num_experts, a.config.local_expert_offset, a.config.local_experts()};

  const ExpertConfig& c = m.cfg;
  const int64_t cap = plan_capacity(a.max_tokens, c.num_experts, c.top_k, c.num_shared_experts, a.block);
  const int64_t h = c.hidden, in = c.intermediate, g = m.groups;
  const detail::GroupedArraySizes sz = detail::grouped_array_sizes();
  size_t gemm_ws = 0;
  for (const auto& ops : {m.ops, m.gated_ops})
    for (const GroupedGemmOps& op : ops)
      if (op.workspace_size != nullptr) gemm_ws = std::max(gemm_ws, op.workspace_size(m.groups, m.sm_count));

  // Carve every buffer from one allocation, each 256-byte aligned.
  int64_t at = 0;
  auto take = [&](int64_t n) {
    const int64_t here = at;
    at += round_up(std::max<int64_t>(n, 1), kAlign);
    return here;
  };
  const int64_t o_a1y = take(cap * h * 2), o_c1 = take(cap * 2 * in * 2), o_act = take(cap * in * 2);
  struct ArrayOffsets {
    int64_t shapes, a, b, d, sa, sb, sd;
  };
  auto take_arrays = [&] {
    return ArrayOffsets{take(g * static_cast<int64_t>(sz.problem_shape)),
                        take(g * 8),
                        take(g * 8),
                        take(g * 8),
                        take(g * static_cast<int64_t>(sz.stride_a)),
                        take(g * static_cast<int64_t>(sz.stride_b)),
                        take(g * static_cast<int64_t>(sz.stride_d))};
  };
  const ArrayOffsets o1 = take_arrays(), o2 = take_arrays();
  const int64_t o_ws = take(static_cast<int64_t>(gemm_ws));
  m.bytes = at;

  {
    detail::CurrentDeviceScope scope(a.device.index, "experts");
    cuda_check(cudaMalloc(&m.storage, static_cast<size_t>(m.bytes)), fmt::format("cudaMalloc({} bytes)", m.bytes));
  }

  char* base = static_cast<char*>(m.storage);
  m.a1y = base + o_a1y;
  m.c1 = base + o_c1;
  m.act = base + o_act;
  auto bind = [&](detail::GroupedGemmArgs& ga, const ArrayOffsets& o) {
    ga.groups = m.groups;
    ga.problem_shapes = base + o.shapes;
    ga.ptr_a = reinterpret_cast<const void**>(base + o.a);
    ga.ptr_b = reinterpret_cast<const void**>(base + o.b);
    ga.ptr_d = reinterpret_cast<void**>(base + o.d);
    ga.stride_a = base + o.sa;
    ga.stride_b = base + o.sb;
    ga.stride_d = base + o.sd;
    ga.workspace = gemm_ws > 0 ? base + o_ws : nullptr;
    ga.sm_count = m.sm_count;
  };
  bind(m.gemm1, o1);
  bind(m.gemm2, o2);
  // The fused epilogue writes act rows where GEMM2 reads them; run() names the pointer array (it depends on GEMM2's
  // form).
  m.gemm1.gated = {nullptr, in, bias_ref(m.w.b13), m.map, c.activation, c.act, c.gate_up == GateUpLayout::up_first};
}

CudaExperts::~CudaExperts() = default;
CudaExperts::CudaExperts(CudaExperts&&) noexcept = default;
CudaExperts& CudaExperts::operator=(CudaExperts&&) noexcept = default;

const CudaExperts::Impl& CudaExperts::impl() const {
  if (!impl_) throw InvalidArgument("experts", "this CudaExperts owns no workspace (it was moved from)");
  return *impl_;
}

const ExpertConfig& CudaExperts::config() const {
  return impl().cfg;
}
int64_t CudaExperts::max_tokens() const {
  return impl().max_tokens;
}
int64_t CudaExperts::workspace_bytes() const {
  return impl().bytes;
}

ExpertTactic cuda_expert_default_tactic(const ExpertConfig& c, int64_t tokens, TacticGpu gpu) {
  const int64_t t = std::max<int64_t>(tokens, 1), routed = t * c.top_k;
  const int64_t active = std::min<int64_t>(c.num_experts, routed);
  const int64_t rows = (routed + active - 1) / active;
  const int64_t weights = int64_t{2} * c.intermediate * c.hidden;
  auto load_at_most = [&](int64_t quarters) { return quarters == kAny || 4 * routed <= quarters * c.num_experts; };
  for (const HeuristicRule& r : kHeuristic)
    if (rows >= r.min_rows && rows <= r.max_rows && t <= r.max_tokens && weights >= r.min_weights &&
        weights <= r.max_weights && c.num_experts <= r.max_experts && load_at_most(r.max_load4) &&
        c.num_shared_experts <= r.max_shared && (r.w13 & w13_form(c)) != 0 && (r.gpus & gpu_bit(gpu)) != 0)
      return {r.gemm1, r.gemm2};
  return {kHeuristic.back().gemm1, kHeuristic.back().gemm2};
}

ExpertTactic CudaExperts::default_tactic(int64_t tokens) const {
  return cuda_expert_default_tactic(impl().cfg, tokens, impl().gpu);
}
TacticGpu CudaExperts::tactic_gpu() const {
  return impl().gpu;
}

void CudaExperts::run(const RoutePlan& plan, const TensorView& hidden, const TensorView& out, Stream stream,
                      ExpertTactic tactic) const {
  const Impl& m = impl();
  const ExpertConfig& c = m.cfg;
  const PlanShape& ps = plan.shape();
  const RoutePlanView& pv = plan.view();
  if (!(plan.device() == m.device))
    throw InvalidArgument(
        "experts", fmt::format("plan device ({}) must be {}", device_name(plan.device()), device_name(m.device)));
  auto require_equal = [](std::string_view field, int64_t plan_value, int64_t value, std::string_view of) {
    if (plan_value != value)
      throw InvalidArgument("experts",
                            fmt::format("plan {} ({}) must equal the {} ({})", field, plan_value, of, value));
  };
  require_equal("num_experts", ps.num_experts, c.num_experts, "expert config's num_experts");
  require_equal("top_k", ps.top_k, c.top_k, "expert config's top_k");
  require_equal("num_shared_experts", ps.num_shared_experts, c.num_shared_experts,
                "expert config's num_shared_experts");
  require_equal("block", ps.block, m.block, "layer's block");
  const int64_t t = pv.tokens;
  if (t > m.max_tokens)
    throw InvalidArgument("experts", fmt::format("plan tokens ({}) must be <= max_tokens ({})", t, m.max_tokens));
  auto check_act = [&](const TensorView& v, std::string_view name) {
    const bool ok = v.present() && v.ndim == 2 && v.shape[0] == t && v.shape[1] == c.hidden &&
                    v.dtype == DType::bf16 && v.is_contiguous() && v.device == m.device &&
                    (t == 0 || v.data != nullptr);
    if (!ok)
      throw InvalidArgument("experts",
                            fmt::format("{} ({}) must be [T, H] = [{}, {}] bf16 contiguous on {}", name,
                                        v.present() ? v.describe() : "absent", t, c.hidden, device_name(m.device)));
    check_aligned(v, name);
  };
  check_act(hidden, "hidden");
  check_act(out, "out");
  if (std::string why = detail::in_place_problem(out, "out", hidden, "hidden"); !why.empty())
    throw InvalidArgument("experts", why);
  const ExpertTactic def = default_tactic(t);
  if (tactic.gemm1 < 0) tactic.gemm1 = def.gemm1;
  if (tactic.gemm2 < 0) tactic.gemm2 = def.gemm2;
  check_tactic(tactic.gemm1, "gemm1");
  check_tactic(tactic.gemm2, "gemm2");
  if (t == 0) return;

  const detail::PlanArrays pa{.topk_ids = pv.topk_ids,
                              .topk_weights = pv.topk_weights,
                              .expert_counts = pv.expert_counts,
                              .expert_offsets = pv.expert_offsets,
                              .sorted_slots = pv.sorted_slots,
                              .slot_rows = pv.slot_rows,
                              .block_experts = pv.block_experts,
                              .tokens = t,
                              .slots = ps.slots(),
                              .groups = ps.groups(),
                              .block = ps.block,
                              .capacity = plan_capacity(t, c.num_experts, c.top_k, c.num_shared_experts, ps.block)};
  const detail::ExpertMap& map = m.map;
  const bool grouped1 = kTactics[tactic.gemm1].kind == GemmKernelKind::grouped;
  const bool grouped2 = kTactics[tactic.gemm2].kind == GemmKernelKind::grouped;

  detail::CurrentDeviceScope scope(m.device.index, "experts");

  detail::FillProblemsParams f{pa,    map,  c.hidden, c.intermediate, m.w.w13.data, m.w.w2.data,
                               m.a1y, m.c1, m.act,    m.a1y,          m.gemm1,      m.gemm2};
  f.swap1 = kTactics[tactic.gemm1].swap_ab;
  f.swap2 = kTactics[tactic.gemm2].swap_ab;
  // GEMM1 reads rows gathered into plan order, and so does the GEMV when routed rows must be scaled by their weight
  // first (routing_weight_on_input); otherwise the GEMV reads hidden by token. The gather fills both GEMMs' arrays.
  const bool gathered = grouped1 || c.routing_weight_on_input;
  if (gathered)
    detail::launch_gather({pa, map, hidden.data, m.a1y, c.hidden, f, c.routing_weight_on_input}, stream);
  else if (grouped2)
    detail::launch_fill_problems(f, stream);
  if (grouped1) {
    if (m.gated_ops[tactic.gemm1].run != nullptr) {
      // GEMM2's act row pointers: its A operand, or its B operand when it runs swapped (A then holds w2).
      detail::GroupedGemmArgs gemm1 = m.gemm1;
      gemm1.gated.ptr_out = f.swap2 ? m.gemm2.ptr_b : m.gemm2.ptr_a;
      m.gated_ops[tactic.gemm1].run(gemm1, stream);
    } else {
      m.ops[tactic.gemm1].run(m.gemm1, stream);
      detail::ActivationKernelParams ap{pa,           map,       m.c1, m.act, bias_ref(m.w.b13), c.intermediate,
                                        c.activation, c.gate_up, c.act};
      detail::launch_activation(ap, stream);
    }
  } else {
    detail::GemvParams gp{pa,        map,      true,           hidden.data,       m.w.w13.data,
                          m.act,     c.hidden, c.intermediate, bias_ref(m.w.b13), c.activation,
                          c.gate_up, c.act};
    if (gathered) gp.x = m.a1y;
    gp.x_per_row = gathered;
    detail::launch_gemv(gp, stream);
  }
  if (grouped2) {
    m.ops[tactic.gemm2].run(m.gemm2, stream);
  } else {
    detail::GemvParams gp{pa,       map, false,        m.act,     m.w.w2.data, m.a1y, c.intermediate,
                          c.hidden, {},  c.activation, c.gate_up, c.act};
    gp.x_per_row = true;
    detail::launch_gemv(gp, stream);
  }
  detail::launch_combine({pa, map, m.a1y, bias_ref(m.w.b2), out.data, c.hidden, c.routing_weight_on_input}, stream);
}

}  // namespace moekit

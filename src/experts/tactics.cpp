// The CUDA experts' tactic table as host code, in every build (with or without CUDA): the default heuristic
// (cuda_expert_default_tactic), which tactics apply the activation in GEMM1, the tactic index checks, and which GPU's
// rules a device takes (tactic_gpu_of). The kernels behind the table are in cuda/.
#include "experts/tactics.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <string>

#include "moekit/device.h"
#include "moekit/error.h"

namespace moekit {
namespace detail {

W13Forms w13_form(const ExpertConfig& c) {
  if (c.gate_up == GateUpLayout::interleaved) return kInterleavedW13;
  return c.intermediate % kHalvesRows == 0 ? kHalvesW13 : kUnfusedW13;
}

void check_tactic(int index, std::string_view which) {
  if (index < 0 || index >= static_cast<int>(kTactics.size())) {
    std::string valid;
    for (size_t i = 0; i < kTactics.size(); ++i) valid += fmt::format("{}{}: {}", i ? ", " : "", i, kTactics[i].name);
    throw NotSupported("experts", fmt::format("{} tactic ({}) must be one of: {}", which, index, valid));
  }
}

}  // namespace detail
namespace {

using detail::kAnyW13;
using detail::kHalvesW13;
using detail::kInterleavedW13;
using detail::kTactics;
using detail::kUnfusedW13;
using detail::W13Forms;

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
  int64_t min_experts = 0, max_experts = kAny;
  int64_t max_load4 = kAny, max_shared = kAny;
  W13Forms w13 = kAnyW13;
  Gpus gpus = kAnyGpu;
  int gemm1, gemm2;
};
constexpr int64_t kLargeExpert = int64_t{24} << 20;  // 2I x H elements
// 2I x H elements, between qwen3's 3.1M and gpt-oss's 16.6M: the interleaved band's 241-256 rows and the swapped
// 96x256 band at 70-90 rows win on gpt-oss only.
constexpr int64_t kMidExpert = int64_t{8} << 20;
// At most this many experts of at least kLargeExpert are "few": the bands of few_large() were measured on mixtral's
// 8 (llama4-scout has 16), and more experts (deepseek-v3's 256, kimi-k2's 384) do not take them.
constexpr int64_t kFewExperts = 64;
// A band of rows per expert for at most kFewExperts experts of at least kLargeExpert weights each, for the w13 forms
// `form`.
constexpr HeuristicRule few_large(int64_t min_rows, int64_t max_rows, int gemm1, int gemm2, W13Forms form = kAnyW13) {
  return {.min_rows = min_rows,
          .max_rows = max_rows,
          .min_weights = kLargeExpert,
          .max_experts = kFewExperts,
          .w13 = form,
          .gemm1 = gemm1,
          .gemm2 = gemm2};
}
// More than this many experts of at least kLargeExpert (kimi-k2's 384, not deepseek-v3's 256) take the H100's
// swapped 96x256 tiles up to 191 rows per expert.
constexpr int64_t kManyExperts = 256;
// An H100 band of rows per expert for at least `min_experts` experts of at least kLargeExpert weights each.
constexpr HeuristicRule many_large(int64_t min_rows, int64_t max_rows, int64_t min_experts, int gemm1, int gemm2) {
  return {.min_rows = min_rows,
          .max_rows = max_rows,
          .min_weights = kLargeExpert,
          .min_experts = min_experts,
          .gpus = kH100Gpu,
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
// rows 0.915 / 0.877 (64 / 96 / 128 rows 1.039 / 0.946 / 0.998, and 128 rows 1.004 in the "Sixty-fourth session",
// where the tuner's 0.89 there came from a synthetic selection bias that left most experts idle); gpt-oss at 56 / 64
// / 72 rows 0.979 / 0.898 / 0.974 (128 rows 1.034). With 3.35 TB/s against the H200's 4.92, the 128-row tile's half
// as many reads of each weight tile outweigh its padding there; gpt-oss's mean at 56-72 rows puts about half its
// experts past one 64-row tile. Routing skew was not measured on the H100. And swapped 96x256 tiles, which hold up to
// 96 rows in one row tile where 64x256 takes two, on more than 64 experts of at least kLargeExpert (paired runs,
// "Sixty-sixth session", experts graph time against the pair named): on kimi-k2's 384 experts for both GEMMs at
// 70-191 rows, against 64x256 for both at 60 / 96 / 112 / 171 rows 0.994 / 0.751 / 0.729 / 0.736, against 64x256
// for GEMM1 alone at 70 / 80 rows 0.953 / 0.891, against 128x256 at 192 / 256 rows 0.987 / 1.041 (the rule above
// keeps 128x256 from 192); on deepseek-v3's 256 experts of the same shape for GEMM2 at 70-80 rows, against 64x256
// for it at 70 / 80 rows 0.996 / 0.985, where GEMM1 keeps 64x256 (swapped 96x256 for it at 70 / 75 / 80 rows 1.025
// / 1.017 / 1.003), and for both at 81-128 rows (90 rows: 0.937 of GEMM1 on 64x256; at 144 / 168 rows 1.017 / 0.984
// of 64x256 for both, which stays). From 91 to 128 rows ("Sixty-seventh session", deepseek-v3, experts graph time of
// runs one after another on one H100): 112 rows 0.716 of 64x256 for both (whose GEMM1 read 26.3 GB from DRAM for
// 15.1 GB of weights, against 16.7 GB on the swapped tiles), 128 rows 0.980-0.984. The few large experts of the
// rules below (mixtral) keep theirs. On experts of kMidExpert to kLargeExpert (gpt-oss), GEMM1 on swapped 96x256
// and GEMM2 on 64x256 at 97-117 rows ("Seventieth session", paired, against 64x256 for both: 100 / 108 / 112 / 116
// rows 0.921 / 0.922 / 0.961 / 0.951; at 96 / 120 / 124 rows 1.082 / 1.021 / 1.088; swapped 96x256 for both at
// 100 / 112 / 128 rows 0.933 / 0.952 / 1.104).
constexpr std::array<HeuristicRule, 23> kHeuristic{{
    {.max_load4 = 3, .max_shared = 0, .gemm1 = 0, .gemm2 = 0},
    {.max_rows = 1, .max_tokens = 4, .gemm1 = 0, .gemm2 = 0},
    {.max_rows = 16, .max_tokens = 64, .gemm1 = 5, .gemm2 = 5},
    {.max_rows = 16, .max_shared = 0, .gemm1 = 5, .gemm2 = 5},
    {.min_rows = 192, .min_weights = kLargeExpert, .gpus = kH100Gpu, .gemm1 = 3, .gemm2 = 3},
    mid_sized(56, 72, 3, 3, kH100Gpu),
    mid_sized(73, 90, 4, 4, kH100Gpu),
    mid_sized(97, 117, 6, 4, kH100Gpu),
    many_large(70, 191, kManyExperts + 1, 6, 6),
    many_large(70, 80, kFewExperts + 1, 4, 6),
    many_large(81, 128, kFewExperts + 1, 6, 6),
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

}  // namespace

std::span<const GemmTacticInfo> cuda_expert_gemm_tactics() {
  return kTactics;
}

bool cuda_expert_gemm1_fuses_activation(const ExpertConfig& config, int gemm1) {
  detail::check_tactic(gemm1, "gemm1");
  if (kTactics[gemm1].kind == GemmKernelKind::gemv) return true;
  switch (detail::w13_form(config)) {
    case kInterleavedW13:
      return detail::kFusedInterleaved[gemm1];
    case kHalvesW13:
      return detail::kFusedHalves[gemm1];
    default:
      return false;
  }
}

size_t detail::default_tactic_rule(const ExpertConfig& c, int64_t tokens, TacticGpu gpu) {
  const int64_t t = std::max<int64_t>(tokens, 1), routed = t * c.top_k;
  const int64_t active = std::min<int64_t>(c.num_experts, routed);
  const int64_t rows = (routed + active - 1) / active;
  const int64_t weights = int64_t{2} * c.intermediate * c.hidden;
  auto load_at_most = [&](int64_t quarters) { return quarters == kAny || 4 * routed <= quarters * c.num_experts; };
  for (size_t i = 0; i < kHeuristic.size(); ++i) {
    const HeuristicRule& r = kHeuristic[i];
    if (rows >= r.min_rows && rows <= r.max_rows && t <= r.max_tokens && weights >= r.min_weights &&
        weights <= r.max_weights && c.num_experts >= r.min_experts && c.num_experts <= r.max_experts &&
        load_at_most(r.max_load4) && c.num_shared_experts <= r.max_shared && (r.w13 & detail::w13_form(c)) != 0 &&
        (r.gpus & gpu_bit(gpu)) != 0)
      return i;
  }
  return kHeuristic.size() - 1;
}

size_t detail::default_tactic_rule_count() {
  return kHeuristic.size();
}

ExpertTactic cuda_expert_default_tactic(const ExpertConfig& c, int64_t tokens, TacticGpu gpu) {
  const HeuristicRule& r = kHeuristic[detail::default_tactic_rule(c, tokens, gpu)];
  return {r.gemm1, r.gemm2};
}

TacticGpu tactic_gpu_of(const DeviceInfo& info) {
  if (info.sm_count <= 0) return TacticGpu::h200;
  const double per_sm = peak_dram_bytes_per_s(info) / info.sm_count;
  return per_sm > 0 && per_sm < kLeanDramPerSm ? TacticGpu::h100 : TacticGpu::h200;
}

std::string_view tactic_gpu_name(TacticGpu gpu) {
  return gpu == TacticGpu::h100 ? "h100" : "h200";
}

}  // namespace moekit

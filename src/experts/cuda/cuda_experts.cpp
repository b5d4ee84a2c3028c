// CudaExperts: validation, the instantiations behind the tactic table (experts/tactics.h), workspace for max_tokens
// (one cudaMalloc at construction), and run(), which only enqueues kernels: fill grouped-GEMM arrays (when a grouped
// GEMM runs), gather + GEMM1 + activation or the fused decode GEMV, GEMM2 (grouped or GEMV), combine. Intermediates
// are bf16 in the plan's padded row order: a1/y [cap, H] (one buffer: a1 is dead once GEMM1 has run), c1 [cap, 2I],
// act [cap, I].
#include "moekit/cuda_experts.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <string>

#include "core/device_scope.h"
#include "core/in_place.h"
#include "experts/cuda/experts_kernels.h"
#include "experts/tactics.h"
#include "moekit/device.h"
#include "moekit/error.h"

namespace moekit {
namespace {

using detail::check_tactic;
using detail::GroupedGemmOps;
using detail::kTactics;

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
constexpr std::array<GroupedGemmOps (*)(), kTactics.size()> kHalvesOps{
    nullptr,
    nullptr,
    nullptr,
    nullptr,
    &detail::sm90_grouped_gemm_gated_halves_pingpong_64x256x64,
    &detail::sm90_grouped_gemm_gated_halves_swap_ab_cooperative_128x32x64,
    nullptr};
// The host-side table (experts/tactics.h) says which tiles have these forms, for the heuristic and the CLI.
constexpr bool built_where(const std::array<GroupedGemmOps (*)(), kTactics.size()>& ops,
                           const std::array<bool, kTactics.size()>& fused) {
  for (size_t i = 0; i < ops.size(); ++i)
    if ((ops[i] != nullptr) != fused[i]) return false;
  return true;
}
static_assert(built_where(kGatedOps, detail::kFusedInterleaved), "kGatedOps and kFusedInterleaved disagree");
static_assert(built_where(kHalvesOps, detail::kFusedHalves), "kHalvesOps and kFusedHalves disagree");
constexpr bool grouped_ops_match_kinds() {
  for (size_t i = 0; i < kTactics.size(); ++i)
    if ((kGroupedOps[i] != nullptr) != (kTactics[i].kind == GemmKernelKind::grouped)) return false;
  return true;
}
static_assert(grouped_ops_match_kinds(), "kGroupedOps must hold an instantiation exactly for the grouped tactics");

// GEMM1's instantiations with the gated activation in their epilogue for `c`'s w13 (kGatedOps or kHalvesOps), or
// nullptr where no tile has that form.
const std::array<GroupedGemmOps (*)(), kTactics.size()>* gated_table(const ExpertConfig& c) {
  switch (detail::w13_form(c)) {
    case detail::kInterleavedW13:
      return &kGatedOps;
    case detail::kHalvesW13:
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

detail::BiasRef bias_ref(const TensorView& b) {
  return {b.present() ? b.data : nullptr, b.dtype == DType::bf16};
}

}  // namespace

void detail::check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw CudaError("experts", fmt::format("{} launch failed: {}", what, cudaGetErrorString(err)));
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

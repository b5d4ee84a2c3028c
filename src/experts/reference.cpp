// CPU reference for expert compute (DESIGN §5): gated activations and the whole expert layer
//   h = W13[e] x (+ b13) -> a = act(gate, up) -> y = W2[e] a (+ b2) -> out[t] = sum_j w[t,j] * y_(t,j)
// all in fp32, with one rounding to bf16 at the end. With routing_weight_on_input a routed row's GEMM1 sees w x:
// h = w (W13[e] x) (+ b13), the same product in exact arithmetic, and the combine adds that row's y with weight 1.
// Slots are grouped by local expert (ascending slot order), so each weight matrix is streamed once for all of its
// rows; weights are widened from bf16 on the fly inside fixed-width lane loops that -O3 vectorizes. Work is split
// over (expert, column chunk) tasks; every output element is computed by the same sequence of operations whatever the
// thread count, so results are bitwise independent of it. Tokens are processed in chunks that bound the fp32 scratch
// (about 128 MiB).
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "core/in_place.h"
#include "experts/internal.h"
#include "moekit/error.h"
#include "moekit/experts.h"

namespace moekit {
namespace {

// Partial sums of a dot product live in kLanes independent accumulators (GCC vectors: explicit, so this is vector
// code at any -march and the order of operations is fixed), reduced in a fixed tree at the end. The compiler's
// own SLP vectorizer turned the same loop written with arrays into mostly scalar code. H and I are multiples of 8
// (ExpertConfig::validate), so there is no tail.
constexpr int kLanes = 8;
constexpr int kMaxRowGroup = 4;        // rows sharing each widened weight chunk (register blocking)
constexpr int kGemm1ColsPerTask = 16;  // intermediate columns (x2 weight rows: gate and up) per task
constexpr int kGemm2ColsPerTask = 32;  // hidden columns per task
constexpr int kCombineTokensPerTask = 8;
constexpr int64_t kScratchFloats = int64_t{1} << 25;

// Two 16-byte vectors per lane group: 32-byte vector values would change the calling convention without AVX.
using F32x4 = float __attribute__((vector_size(16)));
using U32x4 = uint32_t __attribute__((vector_size(16)));
using U16x4 = uint16_t __attribute__((vector_size(8)));

inline float widen_bf16(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

inline F32x4 widen_bf16x4(const uint16_t* p) {
  U16x4 h;
  std::memcpy(&h, p, sizeof h);
  return std::bit_cast<F32x4>(__builtin_convertvector(h, U32x4) << 16);
}

inline F32x4 load_f32x4(const float* p) {
  F32x4 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

/// The 8 lanes (lo[0..3], hi[0..3]) summed in a fixed tree.
inline float reduce_lanes(F32x4 lo, F32x4 hi) {
  return ((lo[0] + lo[1]) + (lo[2] + lo[3])) + ((hi[0] + hi[1]) + (hi[2] + hi[3]));
}

/// sums[r] = dot(w, x[r]) for R rows; w [n] bf16, x[r] [n] fp32, n a multiple of kLanes.
template <int R>
void dot_rows(const uint16_t* w, const float* const* x, int64_t n, float* sums) {
  F32x4 lo[R] = {}, hi[R] = {};
  const float* xr[R];
  for (int r = 0; r < R; ++r) xr[r] = x[r];
  for (int64_t k = 0; k < n; k += kLanes) {
    const F32x4 wlo = widen_bf16x4(w + k), whi = widen_bf16x4(w + k + 4);
    for (int r = 0; r < R; ++r) {
      lo[r] += wlo * load_f32x4(xr[r] + k);
      hi[r] += whi * load_f32x4(xr[r] + k + 4);
    }
  }
  for (int r = 0; r < R; ++r) sums[r] = reduce_lanes(lo[r], hi[r]);
}

using DotRowsFn = void (*)(const uint16_t*, const float* const*, int64_t, float*);
constexpr DotRowsFn kDotRows[kMaxRowGroup + 1] = {nullptr, dot_rows<1>, dot_rows<2>, dot_rows<3>, dot_rows<4>};

/// Runs task(i) for i in [0, n) on `threads` threads (the caller is one of them). Tasks write disjoint outputs.
template <class Task>
void parallel_for(int64_t n, int threads, const Task& task) {
  const int workers = static_cast<int>(std::min<int64_t>(threads, n));
  std::atomic<int64_t> next{0};
  auto work = [&] {
    for (int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) task(i);
  };
  std::vector<std::thread> pool;
  pool.reserve(workers > 1 ? workers - 1 : 0);
  for (int i = 1; i < workers; ++i) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
}

/// Reads element i of an optional fp32/bf16 bias as fp32; 0 when absent.
float bias_at(const TensorView& b, int64_t i) {
  if (!b.present()) return 0.0f;
  return b.dtype == DType::f32 ? b.as<const float>()[i] : widen_bf16(b.as<const uint16_t>()[i]);
}

void check_plan(const ExpertConfig& cfg, const RoutePlanView& plan) {
  const PlanShape& s = plan.shape;
  if (s.num_experts != cfg.num_experts)
    detail::fail_experts(
        fmt::format("plan num_experts ({}) must equal num_experts ({})", s.num_experts, cfg.num_experts));
  if (s.top_k != cfg.top_k)
    detail::fail_experts(fmt::format("plan top_k ({}) must equal top_k ({})", s.top_k, cfg.top_k));
  if (s.num_shared_experts != cfg.num_shared_experts)
    detail::fail_experts(fmt::format("plan num_shared_experts ({}) must equal num_shared_experts ({})",
                                     s.num_shared_experts, cfg.num_shared_experts));
  if (plan.tokens < 0 || plan.tokens > s.max_tokens)
    detail::fail_experts(fmt::format("plan tokens ({}) must be in 0..{}", plan.tokens, s.max_tokens));
  if (plan.tokens > 0 && (plan.topk_ids == nullptr || plan.topk_weights == nullptr))
    detail::fail_experts("plan topk_ids and topk_weights must not be null");
  const int slots = cfg.top_k + cfg.num_shared_experts, groups = cfg.num_experts + cfg.num_shared_experts;
  for (int64_t i = 0; i < plan.tokens * slots; ++i)
    if (plan.topk_ids[i] < 0 || plan.topk_ids[i] >= groups)
      detail::fail_experts(
          fmt::format("topk_ids[{}, {}] ({}) must be in 0..{}", i / slots, i % slots, plan.topk_ids[i], groups - 1));
}

}  // namespace

float apply_activation(Activation a, const ActivationParams& p, float gate, float up) {
  switch (a) {
    case Activation::silu_gated:
      return gate / (1.0f + std::exp(-gate)) * up;
    case Activation::swiglu_clamped: {
      const float g = std::min(gate, p.limit);
      const float u = std::clamp(up, -p.limit, p.limit);
      return g / (1.0f + std::exp(-p.alpha * g)) * (u + p.beta);
    }
    case Activation::gelu_gated: {
      constexpr float kSqrt2OverPi = 0.7978845608028654f;
      const float inner = kSqrt2OverPi * (gate + 0.044715f * gate * gate * gate);
      return 0.5f * gate * (1.0f + std::tanh(inner)) * up;
    }
  }
  detail::fail_experts(fmt::format("activation ({}) must be a known activation", static_cast<int>(a)));
}

namespace detail {

void experts_reference_chunked(const ExpertConfig& cfg, const ExpertWeights& weights, const TensorView& hidden,
                               const RoutePlanView& plan, const TensorView& out, int threads, int64_t chunk_tokens) {
  validate_expert_weights(cfg, weights, Device::cpu());
  check_plan(cfg, plan);
  const int64_t tokens = plan.tokens, H = cfg.hidden, I = cfg.intermediate;
  check_expert_tensor(hidden, "hidden", "[T, H]", {tokens, H}, false, Device::cpu());
  check_expert_tensor(out, "out", "[T, H]", {tokens, H}, false, Device::cpu());
  if (std::string why = in_place_problem(out, "out", hidden, "hidden"); !why.empty()) fail_experts(why);
  if (threads < 0) detail::fail_experts(fmt::format("threads ({}) must be >= 0", threads));
  if (threads == 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (tokens == 0) return;

  const int slots = cfg.top_k + cfg.num_shared_experts, local = cfg.local_experts();
  const int64_t num_local = cfg.weight_experts();
  const auto* w13 = weights.w13.as<const uint16_t>();  // [E', 2I, H] bf16
  const auto* w2 = weights.w2.as<const uint16_t>();    // [E', H, I] bf16
  const auto* x_bf16 = hidden.as<const uint16_t>();    // [T, H] bf16
  auto* out_bf16 = out.as<uint16_t>();                 // [T, H] bf16
  // Global id -> index into the weights, or -1 for another rank's expert.
  auto local_index = [&](int32_t id) -> int64_t {
    if (id >= cfg.num_experts) return local + (id - cfg.num_experts);
    const int64_t le = int64_t{id} - cfg.local_expert_offset;
    return le >= 0 && le < local ? le : -1;
  };
  // Whether slot id `id`'s weight scales its expert's input rather than its output (routed slots only).
  auto weight_on_input = [&](int32_t id) { return cfg.routing_weight_on_input && id < cfg.num_experts; };

  // Scratch for one chunk of tokens, allocated once per call.
  if (chunk_tokens <= 0) {  // the sizes are validated: no overflow
    const int64_t per_token = H + int64_t{cfg.top_k + cfg.num_shared_experts} * (I + H);
    chunk_tokens = std::max<int64_t>(1, kScratchFloats / per_token);
  }
  const int64_t chunk = std::clamp<int64_t>(chunk_tokens, 1, tokens);
  std::vector<float> xf(chunk * H);           // [chunk, H] hidden rows in fp32
  std::vector<float> act(chunk * slots * I);  // [rows, I] activations, rows grouped by expert
  std::vector<float> y(chunk * slots * H);    // [rows, H] expert outputs, rows grouped by expert
  std::vector<int64_t> row_begin(num_local + 1), cursor(num_local);
  std::vector<int32_t> row_token(chunk * slots);  // token (within the chunk) of each row
  std::vector<float> row_scale(chunk * slots);    // what scales each row's input (routing_weight_on_input), else 1
  std::vector<int32_t> slot_row(chunk * slots);   // row of each slot, -1 for other ranks' experts
  std::vector<int64_t> tasks;                     // (expert << 32 | column chunk)

  for (int64_t t0 = 0; t0 < tokens; t0 += chunk) {
    const int64_t tc = std::min(chunk, tokens - t0);
    const int32_t* ids = plan.topk_ids + t0 * slots;
    const float* wts = plan.topk_weights + t0 * slots;

    // Group slots by expert with a counting sort: within an expert, rows are in ascending slot order.
    std::fill(row_begin.begin(), row_begin.end(), 0);
    for (int64_t s = 0; s < tc * slots; ++s)
      if (int64_t le = local_index(ids[s]); le >= 0) ++row_begin[le + 1];
    for (int64_t e = 0; e < num_local; ++e) row_begin[e + 1] += row_begin[e];
    cursor.assign(row_begin.begin(), row_begin.end() - 1);
    for (int64_t s = 0; s < tc * slots; ++s) {
      const int64_t le = local_index(ids[s]);
      slot_row[s] = le >= 0 ? static_cast<int32_t>(cursor[le]) : -1;
      if (le < 0) continue;
      row_scale[cursor[le]] = weight_on_input(ids[s]) ? wts[s] : 1.0f;
      row_token[cursor[le]++] = static_cast<int32_t>(s / slots);
    }
    for (int64_t i = 0; i < tc * H; ++i) xf[i] = widen_bf16(x_bf16[t0 * H + i]);

    // Runs fn(expert, first column, last column) over every expert with rows, in column chunks of `cols`.
    auto for_expert_columns = [&](int64_t total_cols, int64_t cols, auto&& fn) {
      tasks.clear();
      const int64_t per_expert = (total_cols + cols - 1) / cols;
      for (int64_t e = 0; e < num_local; ++e)
        if (row_begin[e + 1] > row_begin[e])
          for (int64_t c = 0; c < per_expert; ++c) tasks.push_back(e << 32 | c);
      parallel_for(static_cast<int64_t>(tasks.size()), threads, [&](int64_t task) {
        const int64_t e = tasks[task] >> 32, c0 = (tasks[task] & 0xffffffff) * cols;
        fn(e, c0, std::min(total_cols, c0 + cols));
      });
    };

    // GEMM1 + activation: for each column i, the gate and up weight rows are widened once per group of rows.
    for_expert_columns(I, kGemm1ColsPerTask, [&](int64_t e, int64_t i0, int64_t i1) {
      const uint16_t* we = w13 + e * 2 * I * H;
      for (int64_t i = i0; i < i1; ++i) {
        const detail::GateUpRows rows = detail::gate_up_rows(cfg.gate_up, i, I);
        const float bg = bias_at(weights.b13, e * 2 * I + rows.gate), bu = bias_at(weights.b13, e * 2 * I + rows.up);
        for (int64_t r0 = row_begin[e]; r0 < row_begin[e + 1]; r0 += kMaxRowGroup) {
          const int n = static_cast<int>(std::min<int64_t>(kMaxRowGroup, row_begin[e + 1] - r0));
          const float* x[kMaxRowGroup];
          for (int r = 0; r < n; ++r) x[r] = xf.data() + row_token[r0 + r] * H;
          float g[kMaxRowGroup], u[kMaxRowGroup];
          kDotRows[n](we + rows.gate * H, x, H, g);
          kDotRows[n](we + rows.up * H, x, H, u);
          for (int r = 0; r < n; ++r) {
            const float scale = row_scale[r0 + r];  // 1 (an exact no-op) unless the weight scales the input
            act[(r0 + r) * I + i] = apply_activation(cfg.activation, cfg.act, scale * g[r] + bg, scale * u[r] + bu);
          }
        }
      }
    });

    // GEMM2: y = W2 a (+ b2), one weight row per hidden column.
    for_expert_columns(H, kGemm2ColsPerTask, [&](int64_t e, int64_t h0, int64_t h1) {
      const uint16_t* we = w2 + e * H * I;
      for (int64_t h = h0; h < h1; ++h) {
        const float b = bias_at(weights.b2, e * H + h);
        for (int64_t r0 = row_begin[e]; r0 < row_begin[e + 1]; r0 += kMaxRowGroup) {
          const int n = static_cast<int>(std::min<int64_t>(kMaxRowGroup, row_begin[e + 1] - r0));
          const float* a[kMaxRowGroup];
          for (int r = 0; r < n; ++r) a[r] = act.data() + (r0 + r) * I;
          float sums[kMaxRowGroup];
          kDotRows[n](we + h * I, a, I, sums);
          for (int r = 0; r < n; ++r) y[(r0 + r) * H + h] = sums[r] + b;
        }
      }
    });

    // Combine: out[t] = sum over j in slot order of w[t,j] * y_(t,j), in fp32, rounded once to bf16 (w = 1 for a
    // routed slot whose weight scaled its input instead).
    const int64_t combine_tasks = (tc + kCombineTokensPerTask - 1) / kCombineTokensPerTask;
    parallel_for(combine_tasks, threads, [&](int64_t task) {
      const int64_t ta = task * kCombineTokensPerTask, tb = std::min(tc, ta + kCombineTokensPerTask);
      for (int64_t t = ta; t < tb; ++t)
        for (int64_t h = 0; h < H; h += kLanes) {
          float acc[kLanes] = {};
          for (int j = 0; j < slots; ++j) {
            const int32_t row = slot_row[t * slots + j];
            if (row < 0) continue;
            const float w = weight_on_input(ids[t * slots + j]) ? 1.0f : wts[t * slots + j];
            const float* yr = y.data() + int64_t{row} * H + h;
            for (int l = 0; l < kLanes; ++l) acc[l] += w * yr[l];
          }
          for (int l = 0; l < kLanes; ++l) out_bf16[(t0 + t) * H + h + l] = float_to_bf16(acc[l]);
        }
    });
  }
}

}  // namespace detail

void experts_reference(const ExpertConfig& cfg, const ExpertWeights& weights, const TensorView& hidden,
                       const RoutePlanView& plan, const TensorView& out, int threads) {
  detail::experts_reference_chunked(cfg, weights, hidden, plan, out, threads, 0);
}

}  // namespace moekit

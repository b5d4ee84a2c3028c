// The fused CUDA router against the CPU reference: every method, dtype and plan field on fresh random inputs
// (seed printed; MOEKIT_TEST_SEED overrides it). Ids, counts, offsets, sorted rows, block experts, extent and
// replay rows must match exactly, weights within 1e-6 relative. Outputs are poisoned before every run so an
// unwritten element cannot pass. Also: forced grid sizes, the single-CTA/grid boundary, keys crowded into one
// lane (the selection's rescans), NaN logits, one plan reused across grids (the workspace's generations), and
// CUDA-graph capture then replay with new logits.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gpu/gpu_test.h"
#include "moekit/device.h"
#include "moekit/plan.h"
#include "moekit/routing.h"
#include "routing/cuda/route_cuda.h"
#include "routing/cuda/route_token.cuh"
#include "routing/routing_math.h"

namespace moekit {
namespace {

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// The run's seed (test::run_seed: MOEKIT_TEST_SEED where set, else a fresh one); each case derives its own from it.
uint64_t base_seed() {
  return test::run_seed("gpu route_test");
}

// lane_crowded: the experts one warp lane holds in the router's register layout (lane 3 of every 32*V block, V = 4
// fp32 or 8 bf16 values) get +50, so that lane supplies every winner. nan: ~30% NaN, every 7th row all NaN.
// wide: standard deviation 80, so about 40% of logits are below -69 (the sigmoid's exact-division path).
// tied_32 / tied_33: one logit of 5 in each of the 32 lanes' first values (plus one more in lane 0's second chunk
// for tied_33), the rest normal: exactly 32 (33) values reach the router's selection threshold, the edge between
// its threshold selection and its selection by rounds. special: rows by t % 6: a few +inf among normal values, all
// -inf, normal with some -inf, only +-0 (ties across the sign of zero), normal, only NaN and -inf (the softmax
// denominator's exact path and the keys' conventions for infinities and signed zeros).
// warp_crowded: experts 96-127 get +50, so 32 consecutive experts supply every winner.
enum class Dist {
  normal,
  ties,
  coarse,
  hot,
  positive,
  lane_crowded,
  nan,
  wide,
  tied_32,
  tied_33,
  special,
  warp_crowded
};

struct Case {
  std::string name;
  RoutingConfig cfg;
  int64_t tokens = 1;
  int block = 16;
  DType dtype = DType::f32;
  bool bias = false;
  DType bias_dtype = DType::f32;
  int64_t stride_pad = 0;  // row stride = E + stride_pad
  bool replay = true;
  Dist dist = Dist::normal;
  int ctas = 0;           // forced grid size, 0 = heuristic
  int row0 = 0;           // the distribution's first row: nan and special pick their rows' kind by row index
  bool general = false;   // calls of one token per warp through the general kernel instance (RouteCudaTuning)
  float hot_bias = 0.0f;  // added to expert 5's bias (with Dist::hot: a row max that the selection passes over)
};

// Host-side copy of one plan's fields for T tokens.
struct PlanHost {
  std::vector<int32_t> ids, counts, offsets, sorted, rows, blocks, extent;
  std::vector<float> weights;
};

PlanHost read_plan(const RoutePlanView& v, int64_t tokens, bool on_device) {
  const PlanShape& s = v.shape;
  const int64_t n = tokens * s.slots(),
                cap = plan_capacity(tokens, s.num_experts, s.top_k, s.num_shared_experts, s.block);
  PlanHost h;
  auto get = [&](auto& dst, const auto* src, int64_t count) {
    dst.resize(static_cast<size_t>(count));
    if (count == 0) return;
    if (on_device)
      ck(cudaMemcpy(dst.data(), src, count * sizeof(dst[0]), cudaMemcpyDeviceToHost), "cudaMemcpy plan");
    else
      std::memcpy(dst.data(), src, count * sizeof(dst[0]));
  };
  get(h.ids, v.topk_ids, n);
  get(h.weights, v.topk_weights, n);
  get(h.counts, v.expert_counts, s.groups());
  get(h.offsets, v.expert_offsets, s.groups() + 1);
  get(h.sorted, v.sorted_slots, cap);
  get(h.rows, v.slot_rows, n);
  get(h.blocks, v.block_experts, cap / s.block);
  get(h.extent, v.extent, 2);
  return h;
}

void poison_plan(const RoutePlanView& v) {
  const PlanShape& s = v.shape;
  const int64_t n = s.max_tokens * s.slots(), cap = s.capacity();
  // fill_device_bytes waits for every stream before and after: a plain cudaMemset is not ordered before a route()
  // on a non-blocking stream, and could land after it.
  fill_device_bytes(v.topk_ids, 0xa5, n * 4);
  fill_device_bytes(v.topk_weights, 0xa5, n * 4);  // -2.9e-16: finite, so a NaN row's weights must be written
  fill_device_bytes(v.expert_counts, 0xa5, s.groups() * 4);
  fill_device_bytes(v.expert_offsets, 0xa5, (s.groups() + 1) * 4);
  fill_device_bytes(v.sorted_slots, 0xa5, cap * 4);
  fill_device_bytes(v.slot_rows, 0xa5, n * 4);
  fill_device_bytes(v.block_experts, 0xa5, cap / s.block * 4);
  fill_device_bytes(v.extent, 0xa5, 8);
}

template <class T>
::testing::AssertionResult same(const char* field, const std::vector<T>& got, const std::vector<T>& want) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << field << ": size " << got.size() << " vs " << want.size();
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i])
      return ::testing::AssertionFailure() << field << "[" << i << "] = " << got[i] << ", reference " << want[i];
  return ::testing::AssertionSuccess();
}

// Weights within `tol` relative of the reference; NaN only against NaN (sigmoid(NaN) on both sides), an infinite
// reference only by the same infinity.
::testing::AssertionResult close(const std::vector<float>& got, const std::vector<float>& want, double tol = 1e-6) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "topk_weights: size " << got.size() << " vs " << want.size();
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(static_cast<double>(got[i]) - want[i]);
    const bool both_nan = std::isnan(got[i]) && std::isnan(want[i]);
    const bool within = std::isinf(want[i]) ? got[i] == want[i] : d <= tol * std::fabs(static_cast<double>(want[i]));
    if (!within && !(got[i] == want[i]) && !both_nan)
      return ::testing::AssertionFailure() << "topk_weights[" << i << "] = " << got[i] << ", reference " << want[i]
                                           << " (relative " << d / std::fabs(want[i]) << ")";
  }
  return ::testing::AssertionSuccess();
}

// Every plan array past the top-k ids and weights, exactly.
void expect_same_plan(const PlanHost& got, const PlanHost& want) {
  EXPECT_TRUE(same("expert_counts", got.counts, want.counts));
  EXPECT_TRUE(same("expert_offsets", got.offsets, want.offsets));
  EXPECT_TRUE(same("sorted_slots", got.sorted, want.sorted));
  EXPECT_TRUE(same("slot_rows", got.rows, want.rows));
  EXPECT_TRUE(same("block_experts", got.blocks, want.blocks));
  EXPECT_TRUE(same("extent", got.extent, want.extent));
}

// Inputs of one case on the host (fp32 values exactly representable in the case's dtype) and on the device.
struct Inputs {
  int64_t stride = 0;
  std::vector<float> logits;       // [T, stride] as fp32
  std::vector<uint16_t> logits16;  // bf16 bits when dtype is bf16
  std::vector<float> bias;
  std::vector<uint16_t> bias16;
};

Inputs make_inputs(const Case& c, uint64_t seed) {
  const int E = c.cfg.num_experts;
  Inputs in;
  in.stride = E + c.stride_pad;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::uniform_int_distribution<int> small(0, 2);
  in.logits.assign(static_cast<size_t>(c.tokens * in.stride), 7.0f);  // padding columns must not matter
  for (int64_t t = 0; t < c.tokens; ++t)
    for (int e = 0; e < E; ++e) {
      const int64_t row = t + c.row0;
      float v = 0.0f;
      switch (c.dist) {
        case Dist::normal:
          v = normal(rng);
          break;
        case Dist::ties:
          v = static_cast<float>(small(rng));
          break;
        case Dist::coarse:
          v = std::round(normal(rng) * 4.0f) / 4.0f;
          break;
        case Dist::hot:
          v = normal(rng) + (e == 5 ? 100.0f : 0.0f);
          break;
        case Dist::positive:
          v = std::fabs(normal(rng)) + 0.01f;
          break;
        case Dist::lane_crowded: {
          const int per_lane = c.dtype == DType::bf16 ? 8 : 4;
          v = normal(rng) + ((e / per_lane) % 32 == 3 ? 50.0f : 0.0f);
          break;
        }
        case Dist::nan:
          v = (row % 7 == 0 || small(rng) == 0) ? NAN : normal(rng);
          break;
        case Dist::wide:
          v = normal(rng) * 40.0f;
          break;
        case Dist::special: {
          const float x = normal(rng);
          const int pick = small(rng);
          switch (row % 6) {
            case 0:
              v = pick == 0 && x > 1.5f ? INFINITY : x;
              break;
            case 1:
              v = -INFINITY;
              break;
            case 2:
              v = pick == 0 ? -INFINITY : x;
              break;
            case 3:
              v = pick == 0 ? -0.0f : pick == 1 ? 0.0f : (x > 0 ? 0.0f : -0.0f);
              break;
            case 4:
              v = x;
              break;
            default:
              v = pick == 0 ? NAN : -INFINITY;
              break;
          }
          break;
        }
        case Dist::warp_crowded:
          v = normal(rng) + (e / 32 == 3 ? 50.0f : 0.0f);
          break;
        case Dist::tied_32:
        case Dist::tied_33: {
          const int per_lane = c.dtype == DType::bf16 ? 8 : 4;
          v = (e % per_lane == 0 && e < 32 * per_lane) || (c.dist == Dist::tied_33 && e == 32 * per_lane)
                  ? 5.0f
                  : std::fmin(normal(rng), 4.0f);
          break;
        }
      }
      if (c.dtype == DType::bf16) v = round_to_bf16(v);
      in.logits[t * in.stride + e] = v;
    }
  if (c.dtype == DType::bf16) {
    in.logits16.resize(in.logits.size());
    for (size_t i = 0; i < in.logits.size(); ++i) in.logits16[i] = float_to_bf16(in.logits[i]);
  }
  if (c.bias) {
    std::normal_distribution<float> b(0.0f, 0.05f);
    in.bias.resize(E);
    for (float& v : in.bias) v = c.bias_dtype == DType::bf16 ? round_to_bf16(b(rng)) : b(rng);
    if (c.hot_bias != 0.0f) in.bias[5] += c.hot_bias;
    in.bias16.resize(E);
    for (int e = 0; e < E; ++e) in.bias16[e] = float_to_bf16(in.bias[e]);
  }
  return in;
}

// softmax_topk without renormalization divides by the sum of all E softmax terms. The reference adds them in
// ascending expert order in fp32, whose own rounding reaches ~1.3e-6 relative at E = 512 (measured on the host
// against a double sum); the GPU adds them as a tree. So these weights are checked at 1e-6 against an independent
// double-accumulated computation, and at 4e-6 against the reference.
std::vector<float> softmax_weights_double(const Case& c, const Inputs& in, const std::vector<int32_t>& ids) {
  namespace rm = routing_math;
  const int E = c.cfg.num_experts, Kt = c.cfg.slots(), K = c.cfg.top_k;
  std::vector<float> w(ids.size());
  for (int64_t t = 0; t < c.tokens; ++t) {
    const float* x = in.logits.data() + t * in.stride;
    float max = -INFINITY;
    for (int e = 0; e < E; ++e) max = x[e] > max ? x[e] : max;
    auto term = [&](float v) { return v != v ? 0.0f : v == max ? 1.0f : rm::exp(rm::add(v, -max)); };
    double sum = 0.0;
    for (int e = 0; e < E; ++e) sum += term(x[e]);
    for (int j = 0; j < Kt; ++j) {
      const int e = ids[t * Kt + j];
      w[t * Kt + j] = j < K ? static_cast<float>(term(x[e]) / sum * c.cfg.routed_scaling_factor) : 1.0f;
    }
  }
  return w;
}

TensorView logits_view(void* data, const Case& c, int64_t tokens, int64_t stride, Device d) {
  TensorView v = TensorView::contiguous(data, c.dtype, {tokens, c.cfg.num_experts}, d);
  v.strides[0] = stride;
  return v;
}

class GpuRoute : public ::testing::Test {
 protected:
  void SetUp() override { MOEKIT_SKIP_WITHOUT_SM90("the fused router's kernels target sm_90a"); }
};

// Routes case `c` on the GPU (into `plan`, already allocated) and on the CPU, and compares everything. `pairs`:
// when the router may route two tokens per warp (RoutePairs::always: wherever its kernel instance allows).
// Returns whether it did; `token_masks`, if given, whether the call took the token-mask instance.
bool check_case(const Case& c, uint64_t seed, detail::RoutePairs pairs = detail::RoutePairs::heuristic,
                bool* token_masks = nullptr) {
  const bool forced = pairs == detail::RoutePairs::always;
  SCOPED_TRACE(c.name + " seed " + std::to_string(seed) + (forced ? " (pairs always)" : ""));
  std::printf("[ case     ] %s seed=%llu%s\n", c.name.c_str(), static_cast<unsigned long long>(seed),
              forced ? " pairs=always" : "");
  const Inputs in = make_inputs(c, seed);
  const int64_t T = c.tokens;
  const int K = c.cfg.top_k;
  const PlanShape shape{T, c.cfg.num_experts, K, c.cfg.num_shared_experts, c.block};

  // CPU reference.
  RoutePlan ref(shape, Device::cpu());
  const int64_t R = T + 3;
  std::vector<int16_t> replay_ref(static_cast<size_t>(R * K), int16_t{0x7777});
  TensorView host_logits = logits_view(const_cast<float*>(in.logits.data()), c, T, in.stride, Device::cpu());
  host_logits.dtype = DType::f32;
  std::vector<uint16_t> host16 = in.logits16;
  if (c.dtype == DType::bf16) host_logits = logits_view(host16.data(), c, T, in.stride, Device::cpu());
  std::vector<float> hb = in.bias;
  std::vector<uint16_t> hb16 = in.bias16;
  TensorView host_bias;
  if (c.bias)
    host_bias = c.bias_dtype == DType::bf16 ? TensorView::contiguous(hb16.data(), DType::bf16, {c.cfg.num_experts})
                                            : TensorView::contiguous(hb.data(), DType::f32, {c.cfg.num_experts});
  TensorView host_replay;
  if (c.replay) host_replay = TensorView::contiguous(replay_ref.data(), DType::i16, {R, K});
  route(c.cfg, host_logits, host_bias, ref, nullptr, host_replay);
  const PlanHost want = read_plan(ref.view(), T, false);

  // GPU.
  const size_t esz = c.dtype == DType::bf16 ? 2 : 4;
  DeviceBuffer d_logits(static_cast<size_t>(T * in.stride) * esz + 16);
  copy_to_device(d_logits.data(),
                 c.dtype == DType::bf16 ? static_cast<const void*>(in.logits16.data()) : in.logits.data(),
                 static_cast<size_t>(T * in.stride) * esz);
  DeviceBuffer d_bias(static_cast<size_t>(c.cfg.num_experts) * 4);
  TensorView dev_bias;
  if (c.bias) {
    const bool b16 = c.bias_dtype == DType::bf16;
    copy_to_device(d_bias.data(), b16 ? static_cast<const void*>(hb16.data()) : hb.data(),
                   c.cfg.num_experts * (b16 ? 2 : 4));
    dev_bias = TensorView::contiguous(d_bias.data(), c.bias_dtype, {c.cfg.num_experts}, Device::cuda());
  }
  DeviceBuffer d_replay(static_cast<size_t>(R * K) * 2);
  std::vector<int16_t> replay_poison(static_cast<size_t>(R * K), int16_t{0x7777});
  copy_to_device(d_replay.data(), replay_poison.data(), R * K * 2);
  TensorView dev_replay;
  if (c.replay) dev_replay = TensorView::contiguous(d_replay.data(), DType::i16, {R, K}, Device::cuda());

  RoutePlan plan(shape, Device::cuda());
  poison_plan(plan.view());
  detail::set_route_cuda_tuning({.ctas = c.ctas, .general_only = c.general, .pairs = pairs});
  route(c.cfg, logits_view(d_logits.data(), c, T, in.stride, Device::cuda()), dev_bias, plan, nullptr, dev_replay);
  detail::set_route_cuda_tuning({});
  const bool used_pairs = T > 0 && detail::route_cuda_last_pairs();
  if (token_masks != nullptr) *token_masks = detail::route_cuda_last_token_masks();
  ck(cudaDeviceSynchronize(), "route");
  const PlanHost got = read_plan(plan.view(), T, true);
  std::vector<int16_t> replay_got(static_cast<size_t>(R * K));
  ck(cudaMemcpy(replay_got.data(), d_replay.data(), R * K * 2, cudaMemcpyDeviceToHost), "copy replay back");

  EXPECT_TRUE(same("topk_ids", got.ids, want.ids));
  if (c.cfg.method == RoutingMethod::softmax_topk && !c.cfg.renormalize) {
    EXPECT_TRUE(close(got.weights, softmax_weights_double(c, in, want.ids), 1e-6));
    EXPECT_TRUE(close(got.weights, want.weights, 4e-6));
  } else {
    EXPECT_TRUE(close(got.weights, want.weights));
  }
  expect_same_plan(got, want);
  if (c.replay) EXPECT_TRUE(same("replay", replay_got, replay_ref));
  return used_pairs;
}

// Decode calls: every case above again at T = 1, through the decode kernel instance and through the general one, and
// the cases of 2-16 tokens on one CTA (decode and token-mask instances) and a few grids of one token per warp
// (token-mask instance) through the general one too; then one-token shapes (32 consecutive experts holding every
// winner, K = 32, E = 1-513, groups of 1-64 experts, each row kind of the nan and special distributions) and calls
// of 2-9 tokens.
void decode_cases(std::vector<Case>& v) {
  using M = RoutingMethod;
  const size_t n = v.size();
  for (size_t i = 0; i < n; ++i) {
    Case c = v[i];
    if (c.tokens == 1) continue;
    c.name += "_t1";
    c.tokens = 1;
    c.ctas = 0;
    v.push_back(c);
    c.name += "_general";
    c.general = true;
    v.push_back(c);
  }
  for (size_t i = 0; i < n; ++i) {  // the other calls of one CTA and one token per warp through the general one too
    Case c = v[i];
    if (c.tokens < 2 || c.tokens > 16 || c.ctas > 1) continue;
    c.name += "_general";
    c.general = true;
    v.push_back(c);
  }
  for (size_t i = 0; i < n; ++i) {  // grids of one token per warp (the token-mask instance) through the general one
    Case c = v[i];
    if (c.name != "dsv3_t64" && c.name != "dsv3_t1024" && c.name != "seed6_t512_k10" && c.name != "first_grid_t17" &&
        c.name != "ragged_topk_softmax_bf16" && c.name != "k30_s2_grouped_b3")
      continue;
    c.name += "_general";
    c.general = true;
    v.push_back(c);
  }
  auto add = [&](Case c) { v.push_back(std::move(c)); };
  for (auto [E, K] : {std::pair{128, 8}, std::pair{256, 32}, std::pair{512, 10}}) {
    Case c{"t1_warp_crowded_e" + std::to_string(E) + "_k" + std::to_string(K),
           make_routing_config(M::softmax_topk, E, K, K < 32 ? 1 : 0, true), 1, 16};
    c.dist = Dist::warp_crowded;
    add(c);
  }
  for (int E : {1, 5, 31, 33, 100, 511, 512, 513}) {
    Case c{"t1_e" + std::to_string(E), make_routing_config(M::topk_softmax, E, std::min(E, 7), 2, true), 1, 8};
    c.dist = E % 2 ? Dist::normal : Dist::ties;
    add(c);
  }
  add({"t1_k32_e512_bf16_b256", make_routing_config(M::softmax_topk, 512, 32, 0, false), 1, 256, DType::bf16});
  // Decode calls of 2-9 tokens (the decode instances up to 8 tokens).
  add({"decode_t2_e128_k8", make_routing_config(M::softmax_topk, 128, 8, 0, true), 2, 64});
  for (int64_t tokens : {8, 9}) {
    Case c{"decode_t" + std::to_string(tokens) + "_k2_ties", make_routing_config(M::topk_softmax, 64, 2), tokens, 4};
    c.dist = Dist::ties;
    add(c);
  }
  {
    Case c{"decode_t4_warp_crowded", make_routing_config(M::softmax_topk, 256, 8), 4, 16};
    c.dist = Dist::warp_crowded;
    add(c);
  }
  add({"decode_t8_e1024_k32_bf16", make_routing_config(M::softmax_topk, 1024, 32), 8, 32, DType::bf16});
  {
    Case c{"decode_t5_grouped_shared", make_routing_config(M::sigmoid_grouped, 256, 8, 2, true, 8, 4, 2.5f), 5, 16};
    c.bias = true;
    c.dist = Dist::coarse;
    add(c);
  }
  // A bias row of more words than the CTA has threads (two per thread), on the decode plan (T * Kt <= 32) and
  // decode counts instances.
  for (int64_t tokens : {1, 6}) {
    Case c{"decode_t" + std::to_string(tokens) + "_e1000_bias",
           make_routing_config(M::sigmoid_grouped, 1000, 8, 0, true, 8, 3, 1.5f), tokens, 16};
    c.bias = true;
    add(c);
  }
  // A decode call, and one of the token-mask instance (also through the general one).
  for (int64_t tokens : {2, 11}) {
    Case c{(tokens <= 8 ? "decode_t" : "one_cta_t") + std::to_string(tokens) + "_dsv3_bf16",
           make_routing_config(M::sigmoid_grouped, 256, 8, 0, true, 8, 4, 2.5f), tokens, 64, DType::bf16};
    c.bias = true;
    add(c);
    if (tokens > 8) {
      c.name += "_general";
      c.general = true;
      add(c);
    }
  }
  add({"t1_pre_scored_b1", make_routing_config(M::pre_scored, 96, 5, 0, true), 1, 1});
  add({"t1_llama4", make_routing_config(M::llama4, 128, 1, 1), 1, 4});
  for (auto [E, ng, kg, K] : {std::tuple{256, 256, 8, 8}, std::tuple{200, 8, 3, 8}, std::tuple{250, 10, 4, 12},
                              std::tuple{512, 8, 4, 8}, std::tuple{384, 6, 2, 31}, std::tuple{64, 1, 1, 4}}) {
    Case c{"t1_groups_e" + std::to_string(E) + "_g" + std::to_string(ng),
           make_routing_config(M::sigmoid_grouped, E, K, 1, true, ng, kg, 2.5f), 1, 64};
    c.bias = true;
    c.bias_dtype = E % 3 ? DType::f32 : DType::bf16;
    c.dist = E == 200 ? Dist::coarse : Dist::normal;
    add(c);
  }
  for (int row = 0; row < 7; ++row) {
    Case c{"t1_nan_row" + std::to_string(row), make_routing_config(M::sigmoid_grouped, 256, 8, 0, true, 8, 4), 1, 16};
    c.dist = Dist::nan;
    c.row0 = row;
    c.bias = true;
    add(c);
  }
  for (int row = 0; row < 6; ++row) {
    Case c{"t1_special_row" + std::to_string(row), make_routing_config(M::softmax_topk, 96, 6), 1, 8};
    c.dist = Dist::special;
    c.row0 = row;
    add(c);
    c.name += "_topk_softmax";
    c.cfg = make_routing_config(M::topk_softmax, 200, 6, 0, true);
    c.dtype = DType::bf16;
    add(c);
  }
}

std::vector<Case> cases() {
  using M = RoutingMethod;
  std::vector<Case> v;
  auto add = [&](Case c) { v.push_back(std::move(c)); };
  add({"seed6_t32", make_routing_config(M::softmax_topk, 512, 8), 32, 16});
  add({"seed6_t8_k10", make_routing_config(M::softmax_topk, 512, 10), 8, 8});
  add({"seed6_t512_k10", make_routing_config(M::softmax_topk, 512, 10), 512, 8});
  add({"seed6_t16384", make_routing_config(M::softmax_topk, 512, 10), 16384, 8});
  for (int64_t t : {1, 64, 1024, 16384}) {
    Case c{"dsv3_t" + std::to_string(t), make_routing_config(M::sigmoid_grouped, 256, 8, 0, true, 8, 4, 2.5f), t, 64};
    c.bias = true;
    add(c);
  }
  add({"one_token_softmax_renorm", make_routing_config(M::softmax_topk, 64, 6, 0, true), 1, 1});
  add({"ragged_topk_softmax_bf16", make_routing_config(M::topk_softmax, 128, 8, 0, true), 333, 64, DType::bf16});
  add({"llama4_shared", make_routing_config(M::llama4, 16, 1, 1), 77, 1});
  {
    Case c{"pre_scored_nonpow2_e60", make_routing_config(M::pre_scored, 60, 6, 0, true), 1000, 7};
    c.dist = Dist::positive;
    add(c);
  }
  add({"e1024_k32_fp32_b256", make_routing_config(M::softmax_topk, 1024, 32), 300, 256});
  add({"e1024_k32_bf16", make_routing_config(M::topk_softmax, 1024, 32), 100, 32, DType::bf16});
  {
    Case c{"k30_s2_grouped_b3", make_routing_config(M::sigmoid_grouped, 64, 30, 2, true, 4, 2), 129, 3};
    c.bias = true;
    c.bias_dtype = DType::bf16;
    add(c);
  }
  {
    Case c{"ties_01", make_routing_config(M::softmax_topk, 256, 8), 500, 16};
    c.dist = Dist::ties;
    add(c);
  }
  {
    Case c{"ties_coarse_grouped", make_routing_config(M::sigmoid_grouped, 256, 8, 1, true, 8, 4, 2.5f), 700, 64};
    c.dist = Dist::coarse;
    add(c);
  }
  {
    Case c{"one_hot_expert", make_routing_config(M::softmax_topk, 512, 4), 4096, 128};
    c.dist = Dist::hot;
    add(c);
  }
  // Renormalized softmax_topk where the bias passes over the row's max, 100 above the rest: every selected term
  // of the full-row softmax underflows fp32; the contract's weights (the softmax over the selected) do not.
  for (auto [E, dtype] : {std::pair{96, DType::f32}, std::pair{512, DType::bf16}}) {
    Case c{"hot_max_unselected_e" + std::to_string(E), make_routing_config(M::softmax_topk, E, 6, 1, true), 300, 16,
           dtype};
    c.dist = Dist::hot;
    c.bias = true;
    c.hot_bias = -1000.0f;
    add(c);
  }
  add({"empty_experts_e1000", make_routing_config(M::topk_softmax, 1000, 2), 3, 256});
  // Calls with at most 32 slots (the tiny plan of one CTA) and the first call above them.
  {
    Case c{"tiny_t4_k8_ties", make_routing_config(M::softmax_topk, 64, 8), 4, 16};
    c.dist = Dist::ties;
    add(c);
  }
  {
    Case c{"tiny_t4_shared_b3", make_routing_config(M::sigmoid_grouped, 64, 6, 2, true, 4, 2, 1.5f), 4, 3};
    c.bias = true;
    c.bias_dtype = DType::bf16;
    add(c);
  }
  add({"tiny_t1_k32_bf16_b256", make_routing_config(M::topk_softmax, 1024, 32), 1, 256, DType::bf16});
  {  // one token: three shared slots above 29 routed ones, an odd block, tied logits
    Case c{"one_token_e200_k29_s3_b5_ties", make_routing_config(M::softmax_topk, 200, 29, 3, true), 1, 5};
    c.dist = Dist::ties;
    add(c);
  }
  {
    Case c{"tiny_t3_hot", make_routing_config(M::softmax_topk, 512, 10), 3, 8};
    c.dist = Dist::hot;
    add(c);
  }
  add({"tiny_t16_llama4_shared", make_routing_config(M::llama4, 16, 1, 1), 16, 1});
  add({"above_tiny_t3_k11", make_routing_config(M::softmax_topk, 96, 11), 3, 4});
  add({"tiny_t5_k1_b2", make_routing_config(M::softmax_topk, 40, 1), 5, 2});
  {  // groups of one expert (group size 1: the division by the group size is the identity)
    Case c{"groups_of_one", make_routing_config(M::sigmoid_grouped, 64, 6, 0, true, 64, 16), 300, 16};
    c.bias = true;
    add(c);
  }
  {
    Case c{"stride_unaligned_fp32", make_routing_config(M::softmax_topk, 256, 8, 0, true), 200, 16};
    c.stride_pad = 7;
    add(c);
  }
  {
    Case c{"stride_bf16_e250", make_routing_config(M::sigmoid_grouped, 250, 6, 0, false, 5, 2), 150, 8, DType::bf16};
    c.stride_pad = 14;
    c.bias = true;
    add(c);
  }
  add({"e1_k1", make_routing_config(M::softmax_topk, 1, 1), 40, 1});
  add({"k_equals_e", make_routing_config(M::topk_softmax, 3, 3, 1), 50, 2});
  {
    Case c{"kimi_one_group_bf16_b1", make_routing_config(M::sigmoid_grouped, 384, 8, 1, true, 1, 1, 2.827f), 600, 1,
           DType::bf16};
    c.bias = true;
    add(c);
  }
  {
    Case c{"groups_32", make_routing_config(M::sigmoid_grouped, 256, 4, 0, false, 32, 3), 300, 16};
    add(c);
  }
  {
    Case c{"dsv3_bf16_nan", make_routing_config(M::sigmoid_grouped, 256, 8, 0, true, 8, 4, 2.5f), 90, 64,
           DType::bf16};
    c.bias = true;
    c.dist = Dist::nan;
    add(c);
  }
  {
    Case c{"dsv3_wide_logits", make_routing_config(M::sigmoid_grouped, 256, 8, 0, true, 8, 4, 2.5f), 300, 64};
    c.dist = Dist::wide;
    add(c);
  }
  {
    Case c{"groups_64", make_routing_config(M::sigmoid_grouped, 256, 8, 0, true, 64, 5), 300, 16};
    c.bias = true;
    add(c);
  }
  add({"no_replay_b256", make_routing_config(M::softmax_topk, 512, 10), 2000, 256});
  v.back().replay = false;
  add({"single_cta_edge_t16", make_routing_config(M::topk_softmax, 96, 5, 1, false), 16, 4});
  // One CTA at 9-16 tokens (the token-mask instance; bf16 dsv3 below): every token on one expert, ties with a shared
  // slot.
  {
    Case c{"one_cta_t16_hot", make_routing_config(M::softmax_topk, 64, 6), 16, 16};
    c.dist = Dist::hot;
    add(c);
  }
  {
    Case c{"one_cta_t13_shared_ties_b3", make_routing_config(M::topk_softmax, 96, 5, 1, true), 13, 3};
    c.dist = Dist::ties;
    add(c);
  }
  add({"first_grid_t17", make_routing_config(M::topk_softmax, 96, 5, 1, false), 17, 4});
  for (Dist d : {Dist::tied_32, Dist::tied_33}) {
    Case c{d == Dist::tied_32 ? "tied_32_e256_k8" : "tied_33_e256_k8", make_routing_config(M::softmax_topk, 256, 8),
           300, 16};
    c.dist = d;
    add(c);
  }
  {
    Case c{"lane_crowded_e512_k10", make_routing_config(M::softmax_topk, 512, 10), 200, 8};
    c.dist = Dist::lane_crowded;
    add(c);
  }
  {
    Case c{"lane_crowded_bf16_e1024_k32", make_routing_config(M::softmax_topk, 1024, 32, 0, true), 70, 16,
           DType::bf16};
    c.dist = Dist::lane_crowded;
    add(c);
  }
  {
    Case c{"nan_logits_topk_softmax", make_routing_config(M::topk_softmax, 64, 8, 0, true), 90, 8};
    c.dist = Dist::nan;
    add(c);
  }
  // Infinities, signed zeros and NaN where the full-row softmax denominator counts (no renormalization): with
  // columns past E in the instance (E = 96 of 128, bf16 200 of 256) and without (E = 512).
  for (auto [name, E, dtype] :
       {std::tuple{"special_softmax_e96", 96, DType::f32}, std::tuple{"special_softmax_e512", 512, DType::f32},
        std::tuple{"special_softmax_bf16_e200", 200, DType::bf16}}) {
    Case c{name, make_routing_config(M::softmax_topk, E, 6), 300, 8, dtype};
    c.dist = Dist::special;
    add(c);
  }
  {
    Case c{"special_topk_softmax_bias", make_routing_config(M::topk_softmax, 96, 4, 0, true), 120, 8};
    c.dist = Dist::special;
    c.bias = true;
    add(c);
  }
  for (int ctas : {1, 3, 7, 64, 1000}) {
    Case c{"forced_ctas_" + std::to_string(ctas), make_routing_config(M::softmax_topk, 160, 6, 1, true), 2500, 16};
    c.ctas = ctas;
    add(c);
  }
  // 32 values per lane (the instances that load a warp's next row only after the current token) with many tokens
  // per warp: few CTAs for T in the hundreds.
  {
    Case c{"warp_tokens_e1024_fp32", make_routing_config(M::softmax_topk, 1024, 8), 200, 16};
    c.ctas = 1;
    add(c);
  }
  {
    Case c{"warp_tokens_e1024_sigmoid_groups32", make_routing_config(M::sigmoid_grouped, 1024, 8, 0, true, 32, 4),
           100, 8};
    c.ctas = 1;
    c.bias = true;
    add(c);
  }
  {
    Case c{"warp_tokens_bf16_e1024_groups8", make_routing_config(M::sigmoid_grouped, 1000, 6, 2, false, 8, 3, 1.5f),
           150, 32, DType::bf16};
    c.ctas = 2;
    c.bias = true;
    add(c);
  }
  // Two tokens per warp (16 lanes each) where the heuristic grid gives a warp more than one token: fp32 and bf16,
  // groups of whole lanes, shared slots, ties; every case also runs with that instance forced (MatchesReference).
  {
    Case c{"pairs_dsv3_t9000", make_routing_config(M::sigmoid_grouped, 256, 8, 1, true, 8, 4, 2.5f), 9000, 64};
    c.bias = true;
    add(c);
  }
  {
    Case c{"pairs_bf16_e128_shared_t4500", make_routing_config(M::softmax_topk, 128, 8, 2, true), 4500, 16,
           DType::bf16};
    add(c);
  }
  {
    Case c{"pairs_topk_softmax_ties_t6000", make_routing_config(M::topk_softmax, 200, 4, 1, true), 6000, 8};
    c.dist = Dist::ties;
    add(c);
  }
  decode_cases(v);
  return v;
}

// MOEKIT_TEST_QUICK=1 (used under compute-sanitizer, which slows kernels 10-100x) skips cases above 2048 tokens.
// The rule for two tokens per warp at the grids the heuristic takes on 132 SMs (twenty-second session's sweep): not
// at one token per warp (T = 2048 on 128 CTAs), from 1.5 per warp on (T = 3072); sigmoid_grouped only on two CTAs
// per SM (dsv3 T = 8192 on 131 CTAs: no, T = 16384 on 261: yes). Host code: runs without a GPU.
TEST(RouteCudaPairs, HeuristicFollowsTheSweep) {
  EXPECT_FALSE(detail::route_cuda_pairs_pay(false, 2048, 128, 132));
  EXPECT_TRUE(detail::route_cuda_pairs_pay(false, 3072, 128, 132));
  EXPECT_TRUE(detail::route_cuda_pairs_pay(false, 16384, 261, 132));
  EXPECT_FALSE(detail::route_cuda_pairs_pay(false, 16, 1, 132));
  EXPECT_TRUE(detail::route_cuda_pairs_pay(false, 17, 1, 132));  // a forced single CTA with 17 tokens
  EXPECT_FALSE(detail::route_cuda_pairs_pay(true, 4096, 128, 132));
  EXPECT_FALSE(detail::route_cuda_pairs_pay(true, 8192, 131, 132));
  EXPECT_TRUE(detail::route_cuda_pairs_pay(true, 16384, 261, 132));
  EXPECT_FALSE(detail::route_cuda_pairs_pay(false, 100, 0, 132));
}

TEST_F(GpuRoute, MatchesReference) {
  uint64_t seed = base_seed();
  const bool quick = std::getenv("MOEKIT_TEST_QUICK") != nullptr;
  std::printf("[ seed     ] MOEKIT_TEST_SEED=%llu%s\n", static_cast<unsigned long long>(seed),
              quick ? " (quick)" : "");
  int pairs_default = 0, pairs_forced = 0, token_masks = 0;
  for (const Case& c : cases()) {
    const uint64_t s = seed++;
    if (quick && c.tokens > 2048) continue;
    bool masks = false;
    pairs_default += check_case(c, s, detail::RoutePairs::heuristic, &masks) ? 1 : 0;
    token_masks += masks ? 1 : 0;
    if (!c.general)  // again with two tokens per warp wherever the router has that instance
      pairs_forced += check_case(c, s, detail::RoutePairs::always) ? 1 : 0;
  }
  std::printf("[ pairs    ] %d cases routed two tokens per warp by the heuristic, %d when forced\n", pairs_default,
              pairs_forced);
  std::printf("[ masks    ] %d cases took the token-mask instance\n", token_masks);
  EXPECT_GE(token_masks, 30) << "the calls of one token per warp (but decode calls) should take the token-mask "
                                "instance";
  if (!quick) EXPECT_GE(pairs_default, 3) << "the large-T cases of at most 256 experts should route two per warp";
  EXPECT_GE(pairs_forced, 40) << "most cases of at most 256 experts and 16 slots should take the forced instance";
}

// One plan, consecutive calls with different T (single CTA, the tiny plan, an empty call and grids of several
// sizes): the workspace's totals are double-buffered by the call's parity, so every call must start from a clean
// state. The grid barrier's count starts 512 below 2^32, so the calls take it across the wrap-around.
TEST_F(GpuRoute, ReusedPlanAcrossGrids) {
  const uint64_t seed = base_seed() + 2000;
  std::printf("[ seed     ] MOEKIT_TEST_SEED=%llu (reuse: +2000)\n", static_cast<unsigned long long>(seed - 2000));
  const RoutingConfig cfg = make_routing_config(RoutingMethod::softmax_topk, 128, 4, 0, true);
  const int64_t max_t = 4000;
  RoutePlan plan(PlanShape{max_t, 128, 4, 0, 8}, Device::cuda());
  DeviceBuffer d_logits(max_t * 128 * 4);
  const uint32_t near_wrap = 0xfffffe00u;  // even: parity 0, whose totals buffer is zero
  for (int word : {detail::kRouteEpochWord, detail::kRouteArrivalsWord})
    copy_to_device(plan.view().workspace + word, &near_wrap, 4);
  int call = 0;
  for (int64_t T : {int64_t{4000}, int64_t{20}, int64_t{700}, int64_t{4000}, int64_t{100}, int64_t{1}, int64_t{0},
                    int64_t{2500}}) {
    const uint64_t s = seed + static_cast<uint64_t>(call++);
    SCOPED_TRACE("call " + std::to_string(call) + " T " + std::to_string(T) + " seed " + std::to_string(s));
    Case c{"reuse", cfg, T, 8};
    const Inputs in = make_inputs(c, s);
    if (T > 0) copy_to_device(d_logits.data(), in.logits.data(), T * 128 * 4);
    poison_plan(plan.view());
    route(cfg, logits_view(d_logits.data(), c, T, 128, Device::cuda()), {}, plan);
    ck(cudaDeviceSynchronize(), "route");
    const PlanHost got = read_plan(plan.view(), T, true);
    RoutePlan ref(PlanShape{std::max<int64_t>(T, 1), 128, 4, 0, 8}, Device::cpu());  // T = 0: an empty call
    std::vector<float> hl = in.logits;
    route(cfg, TensorView::contiguous(hl.data(), DType::f32, {T, 128}), {}, ref);
    const PlanHost want = read_plan(ref.view(), T, false);
    EXPECT_TRUE(same("topk_ids", got.ids, want.ids));
    EXPECT_TRUE(close(got.weights, want.weights));
    expect_same_plan(got, want);
  }
}

// Capture once, replay with new logits; smaller T are further graphs (T = 2: the tiny plan, T = 1: one token's
// plan); all must match the reference. Then all again with two tokens per warp wherever the router can.
void graph_replay_with_new_logits() {
  const uint64_t seed = base_seed() + 1000;
  std::printf("[ seed     ] MOEKIT_TEST_SEED=%llu (graph: +1000)\n", static_cast<unsigned long long>(seed - 1000));
  RoutingConfig cfg = make_routing_config(RoutingMethod::sigmoid_grouped, 256, 8, 1, true, 8, 4, 2.5f);
  const int64_t max_t = 3000;
  const PlanShape shape{max_t, 256, 8, 1, 64};
  RoutePlan plan(shape, Device::cuda());
  DeviceBuffer d_logits(max_t * 256 * 4), d_bias(256 * 4), d_replay(max_t * 8 * 2);
  // The calls before each capture read defined inputs (all ties) too: compute-sanitizer's initcheck flags reads of
  // bytes nothing has written.
  fill_device_bytes(d_logits.data(), 0, max_t * 256 * 4);
  fill_device_bytes(d_bias.data(), 0, 256 * 4);
  Case c{"graph", cfg, max_t, 64};
  c.bias = true;
  cudaStream_t stream;
  ck(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  const TensorView bias = TensorView::contiguous(d_bias.data(), DType::f32, {256}, Device::cuda());
  const TensorView replay = TensorView::contiguous(d_replay.data(), DType::i16, {max_t, 8}, Device::cuda());

  for (int64_t T : {max_t, int64_t{45}, int64_t{2}, int64_t{1}}) {
    c.tokens = T;
    const TensorView logits = logits_view(d_logits.data(), c, T, 256, Device::cuda());
    route(cfg, logits, bias, plan, stream, replay);  // first call outside the capture
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    ck(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "begin capture");
    route(cfg, logits, bias, plan, stream, replay);
    ck(cudaStreamEndCapture(stream, &graph), "end capture");
    ck(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
    for (int rep = 0; rep < 3; ++rep) {
      const uint64_t s = seed + static_cast<uint64_t>(T) * 10 + rep;
      SCOPED_TRACE("T " + std::to_string(T) + " replay " + std::to_string(rep) + " seed " + std::to_string(s));
      Case ci = c;
      const Inputs in = make_inputs(ci, s);
      copy_to_device(d_logits.data(), in.logits.data(), T * 256 * 4);
      copy_to_device(d_bias.data(), in.bias.data(), 256 * 4);
      poison_plan(plan.view());
      ck(cudaGraphLaunch(exec, stream), "graph launch");
      ck(cudaStreamSynchronize(stream), "graph sync");
      const PlanHost got = read_plan(plan.view(), T, true);

      const PlanShape rshape{T, 256, 8, 1, 64};
      RoutePlan ref(rshape, Device::cpu());
      std::vector<float> hl = in.logits, hb = in.bias;
      route(cfg, TensorView::contiguous(hl.data(), DType::f32, {T, 256}),
            TensorView::contiguous(hb.data(), DType::f32, {256}), ref);
      const PlanHost want = read_plan(ref.view(), T, false);
      EXPECT_TRUE(same("topk_ids", got.ids, want.ids));
      EXPECT_TRUE(close(got.weights, want.weights));
      expect_same_plan(got, want);
    }
    ck(cudaGraphExecDestroy(exec), "destroy exec");
    ck(cudaGraphDestroy(graph), "destroy graph");
  }
  ck(cudaStreamDestroy(stream), "stream destroy");
}

// route() launches on the plan's GPU whichever device is current, and leaves the caller's device current.
TEST_F(GpuRoute, RoutesOnThePlansGpuWhicheverDeviceIsCurrent) {
  if (cuda_device_count() < 2 || !device_is_sm90(1)) GTEST_SKIP() << "needs a second sm90 GPU";
  Case c{"on_device_1", make_routing_config(RoutingMethod::softmax_topk, 128, 8, 0, true), 200, 16};
  const Inputs in = make_inputs(c, base_seed() + 3000);
  const PlanShape shape{c.tokens, 128, 8, 0, 16};
  RoutePlan plan(shape, Device::cuda(1));
  DeviceBuffer d_logits(static_cast<size_t>(c.tokens * in.stride * 4), 1);
  d_logits.upload(in.logits.data(), in.logits.size() * 4);
  ck(cudaSetDevice(0), "cudaSetDevice(0)");
  route(c.cfg, logits_view(d_logits.data(), c, c.tokens, in.stride, Device::cuda(1)), {}, plan);
  int current = -1;
  ck(cudaGetDevice(&current), "cudaGetDevice");
  EXPECT_EQ(current, 0);
  device_synchronize(1);
  const PlanHost got = read_plan(plan.view(), c.tokens, true);
  RoutePlan ref(shape, Device::cpu());
  std::vector<float> hl = in.logits;
  route(c.cfg, logits_view(hl.data(), c, c.tokens, in.stride, Device::cpu()), {}, ref);
  const PlanHost want = read_plan(ref.view(), c.tokens, false);
  EXPECT_TRUE(same("topk_ids", got.ids, want.ids));
  EXPECT_TRUE(close(got.weights, want.weights));
  expect_same_plan(got, want);
}

TEST_F(GpuRoute, GraphReplayWithNewLogits) {
  for (detail::RoutePairs pairs : {detail::RoutePairs::heuristic, detail::RoutePairs::always}) {
    SCOPED_TRACE(pairs == detail::RoutePairs::always ? "pairs always" : "pairs by the heuristic");
    detail::set_route_cuda_tuning({.pairs = pairs});
    graph_replay_with_new_logits();
    detail::set_route_cuda_tuning({});
  }
}

// The router's sigmoid (fast reciprocal for x >= -69) against routing_math's (IEEE division, the CPU's bits), for
// every float from -69 up to +inf: any difference would make GPU keys, and so ids, differ from the reference.
__global__ void count_sigmoid_differences(uint32_t first, uint64_t n, unsigned long long* bad) {
  unsigned long long mine = 0;
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const float x = __uint_as_float(first + static_cast<uint32_t>(i));
    mine += __float_as_uint(detail::router::sigmoid_in_range(x)) != __float_as_uint(routing_math::sigmoid(x));
  }
  if (mine) atomicAdd(bad, mine);
}

TEST_F(GpuRoute, FastSigmoidMatchesExactForEveryFloatAboveMinus69) {
  DeviceBuffer d_bad(8);
  fill_device_bytes(d_bad.data(), 0, 8);
  auto* bad = static_cast<unsigned long long*>(d_bad.data());
  uint32_t minus69;
  const float m69 = -69.0f;
  std::memcpy(&minus69, &m69, 4);
  count_sigmoid_differences<<<1024, 256>>>(0u, 0x7f800001ull, bad);                         // +0 .. +inf
  count_sigmoid_differences<<<1024, 256>>>(0x80000000u, minus69 - 0x80000000ull + 1, bad);  // -0 .. -69
  ck(cudaDeviceSynchronize(), "sigmoid sweep");
  unsigned long long host = 1;
  ck(cudaMemcpy(&host, bad, 8, cudaMemcpyDeviceToHost), "copy count");
  EXPECT_EQ(host, 0ull);
}

}  // namespace
}  // namespace moekit

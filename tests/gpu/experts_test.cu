// CudaExperts (bf16 grouped GEMMs and the decode GEMV) against experts_reference, the fp32 CPU oracle: relative
// Frobenius error <= 1e-2 on fresh random inputs (the seed is printed; MOEKIT_TEST_SEED replays one). Cases:
// reduced-size versions of every preset at T in {1, 7, 64, 1000}, every tactic pair, every activation x gate/up
// layout with fp32 and bf16 biases, short weight rows on the decode path, shared experts, empty experts, one hot
// expert, fixed rows per expert around the cooperative tiles' halves, expert parallelism, CUDA-graph capture then
// replay with new data, bitwise repeatability of every case, and the argument checks. Plans are built on the CPU
// (build_plan_reference) and copied to the device, so these tests do not depend on the GPU router. Skips without an
// sm90 GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <numeric>
#include <random>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "error_of.h"
#include "gpu/gpu_test.h"
#include "moekit/cuda_experts.h"
#include "moekit/device.h"
#include "moekit/error.h"
#include "moekit/experts.h"
#include "moekit/plan.h"
#include "moekit/presets.h"

namespace moekit {
namespace {

#define MOEKIT_CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

#define MOEKIT_REQUIRE_SM90() MOEKIT_SKIP_WITHOUT_SM90("the bf16 expert kernels need an H100/H200")

uint32_t test_seed() {
  return test::run_seed("experts_test");
}

template <class T>
void upload(DeviceBuffer& d, const std::vector<T>& h) {
  copy_to_device(d.data(), h.data(), h.size() * sizeof(T));
}

std::vector<uint16_t> random_bf16(std::mt19937& rng, int64_t n, float scale) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = float_to_bf16(u(rng));
  return v;
}

// random: K distinct experts per token from all of them; one_hot: expert 0 always first; half_empty: from the lower
// half; counts: K = 1, expert e gets Case::counts[e] tokens, in a shuffled token order.
enum class Routing { random, one_hot, half_empty, counts };

struct Case {
  ExpertConfig cfg;
  int64_t tokens = 1;
  int block = 64;
  bool b13 = false, b2 = false;
  DType bias_dtype = DType::f32;
  int bias_offset = 0;  // bytes the device biases sit past a 256-byte boundary (4: only 4-byte aligned)
  Routing routing = Routing::random;
  std::vector<int> counts;  // Routing::counts: tokens per routed expert (they sum to tokens)
  ExpertTactic tactic{};
};

std::string describe(const Case& c) {
  std::ostringstream o;
  o << "E" << c.cfg.num_experts << " K" << c.cfg.top_k << " S" << c.cfg.num_shared_experts << " H" << c.cfg.hidden
    << " I" << c.cfg.intermediate << " T" << c.tokens << " B" << c.block << " " << activation_name(c.cfg.activation)
    << "/" << gate_up_layout_name(c.cfg.gate_up) << (c.b13 ? " b13" : "") << (c.b2 ? " b2" : "") << " local "
    << c.cfg.local_experts() << "@" << c.cfg.local_expert_offset << " tactic " << c.tactic.gemm1 << "/"
    << c.tactic.gemm2 << (c.cfg.routing_weight_on_input ? " weight on input" : "");
  return o.str();
}

// Host data of one layer problem: weights, hidden states and a CPU plan of random (or skewed) routing.
struct Problem {
  ExpertConfig cfg;
  int64_t tokens;
  std::vector<uint16_t> w13, w2, hidden;
  std::vector<uint16_t> b13_bf16, b2_bf16;
  std::vector<float> b13_f32, b2_f32;
  RoutePlan plan;
  ExpertWeights host_weights;

  Problem(const Case& c, std::mt19937& rng)
      : cfg(c.cfg),
        tokens(c.tokens),
        plan(PlanShape{std::max<int64_t>(c.tokens, 1), c.cfg.num_experts, c.cfg.top_k, c.cfg.num_shared_experts,
                       c.block},
             Device::cpu()) {
    const int64_t e = cfg.weight_experts(), h = cfg.hidden, in = cfg.intermediate;
    w13 = random_bf16(rng, e * 2 * in * h, 1.0f / std::sqrt(static_cast<float>(h)));
    w2 = random_bf16(rng, e * h * in, 1.0f / std::sqrt(static_cast<float>(in)));
    host_weights.w13 = TensorView::contiguous(w13.data(), DType::bf16, {e, 2 * in, h});
    host_weights.w2 = TensorView::contiguous(w2.data(), DType::bf16, {e, h, in});
    std::uniform_real_distribution<float> ub(-0.5f, 0.5f);
    if (c.b13) {
      if (c.bias_dtype == DType::bf16) {
        b13_bf16 = random_bf16(rng, e * 2 * in, 0.5f);
        host_weights.b13 = TensorView::contiguous(b13_bf16.data(), DType::bf16, {e, 2 * in});
      } else {
        for (int64_t i = 0; i < e * 2 * in; ++i) b13_f32.push_back(ub(rng));
        host_weights.b13 = TensorView::contiguous(b13_f32.data(), DType::f32, {e, 2 * in});
      }
    }
    if (c.b2) {
      if (c.bias_dtype == DType::bf16) {
        b2_bf16 = random_bf16(rng, e * h, 0.5f);
        host_weights.b2 = TensorView::contiguous(b2_bf16.data(), DType::bf16, {e, h});
      } else {
        for (int64_t i = 0; i < e * h; ++i) b2_f32.push_back(ub(rng));
        host_weights.b2 = TensorView::contiguous(b2_f32.data(), DType::f32, {e, h});
      }
    }
    hidden = random_bf16(rng, tokens * h, 1.0f);

    // Top-k ids: K distinct routed experts per token drawn from a pool (all experts, the lower half, or one hot
    // expert always first), random positive weights; then the shared slots with weight 1.
    const int kt = cfg.top_k + cfg.num_shared_experts, n = cfg.num_experts;
    RoutePlanView& v = plan.mutable_view();
    std::uniform_real_distribution<float> uw(0.05f, 1.0f);
    std::vector<int> expert_of;  // Routing::counts: token -> its one routed expert
    if (c.routing == Routing::counts) {
      if (cfg.top_k != 1 || std::accumulate(c.counts.begin(), c.counts.end(), int64_t{0}) != tokens)
        throw std::invalid_argument("Routing::counts needs top_k 1 and counts that sum to tokens");
      for (int e = 0; e < static_cast<int>(c.counts.size()); ++e) expert_of.insert(expert_of.end(), c.counts[e], e);
      std::shuffle(expert_of.begin(), expert_of.end(), rng);
    }
    for (int64_t t = 0; t < tokens; ++t) {
      std::vector<int> pool(n);
      for (int i = 0; i < n; ++i) pool[i] = i;
      int pool_size = c.routing == Routing::half_empty ? std::max(cfg.top_k, n / 2) : n;
      for (int j = 0; j < cfg.top_k; ++j) {
        int pick;
        if (c.routing == Routing::one_hot && j == 0) {
          pick = 0;  // pool[0] == 0 until it is swapped out below
        } else if (c.routing == Routing::counts) {
          pick = expert_of[t];  // j == 0 and pool[i] == i
        } else {
          std::uniform_int_distribution<int> ui(j, pool_size - 1);
          pick = ui(rng);
        }
        std::swap(pool[j], pool[pick]);
        v.topk_ids[t * kt + j] = pool[j];
        v.topk_weights[t * kt + j] = uw(rng);
      }
      for (int s = 0; s < cfg.num_shared_experts; ++s) {
        v.topk_ids[t * kt + cfg.top_k + s] = n + s;
        v.topk_weights[t * kt + cfg.top_k + s] = 1.0f;
      }
    }
    build_plan_reference(tokens, v);
  }
};

double rel_frobenius(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want) {
  if (got.size() != want.size()) return std::nan("");  // fails every <= check
  return relative_frobenius_bf16(got.data(), want.data(), static_cast<int64_t>(want.size()));
}

// Device copies of a problem's weights.
struct DeviceWeights {
  DeviceBuffer w13, w2, b13, b2;
  ExpertWeights view;
  DeviceWeights(const Problem& p, int bias_offset)
      : w13(p.w13.size() * 2),
        w2(p.w2.size() * 2),
        b13(p.host_weights.b13.numel() * 4 + 16),
        b2(p.host_weights.b2.numel() * 4 + 16) {
    const Device dev = Device::cuda(0);
    auto put = [&](DeviceBuffer& d, const TensorView& h, TensorView& out, int offset) {
      if (!h.present()) return;
      void* at = static_cast<char*>(d.data()) + offset;
      copy_to_device(at, h.data, h.numel() * dtype_size(h.dtype));
      out = h;
      out.data = at;
      out.device = dev;
    };
    put(w13, p.host_weights.w13, view.w13, 0);
    put(w2, p.host_weights.w2, view.w2, 0);
    put(b13, p.host_weights.b13, view.b13, bias_offset);
    put(b2, p.host_weights.b2, view.b2, bias_offset);
  }
};

// Runs one case on the GPU and checks it against experts_reference.
void check_case(const Case& c, uint32_t salt) {
  SCOPED_TRACE(describe(c));
  std::mt19937 rng(test_seed() ^ (salt * 2654435761u));
  Problem prob(c, rng);
  const int64_t t = c.tokens, h = c.cfg.hidden;

  std::vector<uint16_t> want(t * h);
  experts_reference(c.cfg, prob.host_weights, TensorView::contiguous(prob.hidden.data(), DType::bf16, {t, h}),
                    prob.plan.view(), TensorView::contiguous(want.data(), DType::bf16, {t, h}));

  const Device dev = Device::cuda(0);
  DeviceWeights dw(prob, c.bias_offset);
  RoutePlan dplan(prob.plan.shape(), dev);
  copy_plan(prob.plan, dplan);
  DeviceBuffer dh(t * h * 2), dout(t * h * 2);
  upload(dh, prob.hidden);
  fill_device_bytes(dout.data(), 0xff, t * h * 2);  // NaN poison: every element must be written

  CudaExperts layer({c.cfg, dw.view, std::max<int64_t>(t, 1), c.block, dev});
  layer.run(dplan, TensorView::contiguous(dh.data(), DType::bf16, {t, h}, dev),
            TensorView::contiguous(dout.data(), DType::bf16, {t, h}, dev), nullptr, c.tactic);
  MOEKIT_CUDA_OK(cudaDeviceSynchronize());
  std::vector<uint16_t> got(t * h);
  MOEKIT_CUDA_OK(cudaMemcpy(got.data(), dout.data(), t * h * 2, cudaMemcpyDeviceToHost));
  const double err = rel_frobenius(got, want);
  EXPECT_LE(err, 1e-2) << "relative Frobenius error " << err;

  // Deterministic: a second run gives the same bits.
  fill_device_bytes(dout.data(), 0xff, t * h * 2);
  layer.run(dplan, TensorView::contiguous(dh.data(), DType::bf16, {t, h}, dev),
            TensorView::contiguous(dout.data(), DType::bf16, {t, h}, dev), nullptr, c.tactic);
  MOEKIT_CUDA_OK(cudaDeviceSynchronize());
  std::vector<uint16_t> again(t * h);
  MOEKIT_CUDA_OK(cudaMemcpy(again.data(), dout.data(), t * h * 2, cudaMemcpyDeviceToHost));
  EXPECT_TRUE(again == got) << "a second run changed the output";
}

// A preset shrunk to test size, keeping K, S, activation, layout and biases (what changes the code path).
ExpertConfig reduced(const ExpertConfig& full) {
  ExpertConfig c = full;
  c.num_experts = std::min(full.num_experts, 32);
  c.hidden = std::min(full.hidden, 520);              // not a multiple of 64: a K tail in GEMM1
  c.intermediate = std::min(full.intermediate, 200);  // K tail in GEMM2, N tail in GEMM1
  return c;
}

TEST(CudaExperts, ReducedPresetsAllTokenCounts) {
  MOEKIT_REQUIRE_SM90();
  uint32_t salt = 1;
  for (const Preset& p : presets()) {
    for (int64_t t : {1, 7, 64, 1000}) {
      Case c;
      c.cfg = reduced(p.experts);
      c.tokens = t;
      c.block = p.block;
      c.b13 = c.b2 = p.has_expert_biases;
      check_case(c, salt++);
    }
  }
}

TEST(CudaExperts, FullWidthFewExperts) {
  MOEKIT_REQUIRE_SM90();
  // DeepSeek-V3's H and I with 4 routed experts + 1 shared: long K loops in both GEMMs, wide N.
  uint32_t salt = 100;
  for (ExpertTactic tactic : {ExpertTactic{0, 0}, ExpertTactic{2, 2}, ExpertTactic{3, 1}}) {
    Case c;
    c.cfg = find_preset("deepseek-v3").experts;
    c.cfg.num_experts = 4;
    c.cfg.top_k = 2;
    c.tokens = 33;
    c.tactic = tactic;
    check_case(c, salt++);
  }
}

TEST(CudaExperts, EveryTacticPair) {
  MOEKIT_REQUIRE_SM90();
  const int n = static_cast<int>(cuda_expert_gemm_tactics().size());
  uint32_t salt = 200;
  for (int64_t t : {3, 300}) {
    for (int g1 = 0; g1 < n; ++g1) {
      for (int g2 = 0; g2 < n; ++g2) {
        Case c;
        c.cfg = reduced(find_preset("qwen3-30b-a3b").experts);
        c.cfg.num_shared_experts = 1;
        c.tokens = t;
        c.b13 = c.b2 = true;
        c.tactic = {g1, g2};
        check_case(c, salt++);
      }
    }
  }
}

// A routed slot's weight on the expert's input (Llama-4): the gather (grouped GEMM1, every tactic) or the decode
// GEMV (tactic 0) scales it, the combine adds the output unweighted, shared slots keep their weight; K = 2 and a
// rank holding 3 of 8 routed experts, against the reference (which scales GEMM1's sums in fp32).
TEST(CudaExperts, RoutingWeightOnInput) {
  MOEKIT_REQUIRE_SM90();
  const int n = static_cast<int>(cuda_expert_gemm_tactics().size());
  uint32_t salt = 250;
  for (int64_t t : {1, 5, 300}) {
    for (int g1 = 0; g1 < n; ++g1) {
      for (int g2 : {0, 3, 5}) {
        Case c;
        c.cfg = reduced(find_preset("llama4-scout").experts);
        ASSERT_TRUE(c.cfg.routing_weight_on_input);
        c.cfg.top_k = 2;
        c.tokens = t;
        c.b13 = c.b2 = t == 5;
        c.tactic = {g1, g2};
        check_case(c, salt++);
      }
    }
  }
  for (GateUpLayout l : {GateUpLayout::interleaved, GateUpLayout::gate_first}) {  // the fused gated epilogues
    Case c;
    c.cfg = reduced(find_preset("llama4-scout").experts);
    c.cfg.gate_up = l;
    c.cfg.intermediate = 256;  // a multiple of 128: gate-first takes the halves form of the fused epilogue
    c.cfg.num_experts = 8;
    c.cfg.top_k = 2;
    c.cfg.local_num_experts = 3;
    c.cfg.local_expert_offset = 2;
    c.tokens = 200;
    c.tactic = {4, 4};
    check_case(c, salt++);
  }
}

TEST(CudaExperts, ActivationsLayoutsBiases) {
  MOEKIT_REQUIRE_SM90();
  uint32_t salt = 300;
  for (Activation a : {Activation::silu_gated, Activation::swiglu_clamped, Activation::gelu_gated}) {
    for (GateUpLayout l : {GateUpLayout::gate_first, GateUpLayout::up_first, GateUpLayout::interleaved}) {
      for (DType bias : {DType::f32, DType::bf16}) {
        for (ExpertTactic tactic : {ExpertTactic{0, 0}, ExpertTactic{2, 2}, ExpertTactic{5, 5}}) {
          Case c;
          c.cfg = reduced(find_preset("gpt-oss-120b").experts);
          c.cfg.activation = a;
          c.cfg.gate_up = l;
          c.cfg.act = ActivationParams{1.5f, 0.75f, 2.0f};  // a small limit so the clamp is exercised
          c.tokens = 37;
          c.b13 = c.b2 = true;
          c.bias_dtype = bias;
          c.tactic = tactic;
          check_case(c, salt++);
        }
      }
    }
  }
}

// GEMM1 tactic `gemm1` with the gated activation in its epilogue on the layer config_for(t) gives at t tokens:
// every activation at 1, 7, 64 and 1000 tokens with a fused shared expert, b13 / b2 in fp32, bf16 (T = 64), absent
// (T = 7) and only 4-byte aligned (T = 1000), GEMM2 on tactic 1 at T = 64; then a rank holding 3 of 8 routed experts
// at 200 tokens (groups of other ranks' experts are empty, the bias index is the local expert's).
template <class ConfigFor>
void check_gated_epilogue(int gemm1, ConfigFor config_for, uint32_t& salt) {
  for (Activation a : {Activation::silu_gated, Activation::swiglu_clamped, Activation::gelu_gated}) {
    for (int64_t t : {1, 7, 64, 1000}) {
      Case c;
      c.cfg = config_for(t);
      c.cfg.activation = a;
      c.cfg.act = ActivationParams{1.5f, 0.75f, 2.0f};  // a small limit so the clamp is exercised
      c.cfg.num_shared_experts = 1;
      c.tokens = t;
      c.b13 = c.b2 = t != 7;
      c.bias_dtype = t == 64 ? DType::bf16 : DType::f32;
      c.bias_offset = t == 1000 ? 4 : 0;
      c.tactic = {gemm1, t == 64 ? 1 : gemm1};
      check_case(c, salt++);
    }
  }
  Case c;
  c.cfg = config_for(200);
  c.cfg.num_experts = 8;
  c.cfg.top_k = 2;
  c.cfg.local_num_experts = 3;
  c.cfg.local_expert_offset = 4;
  c.tokens = 200;
  c.b13 = c.b2 = true;
  c.tactic = {gemm1, gemm1};
  check_case(c, salt++);
}

// GEMM1 tactic `gemm1` before every GEMM2 tactic at 300 tokens on config_for(300) with a fused shared expert and
// biases: the GEMV, the plain grouped tiles and the swapped ones, whose act rows are their B operand (their A operand
// is w2, which GEMM1's epilogue must not write).
template <class ConfigFor>
void check_before_every_gemm2(int gemm1, ConfigFor config_for, uint32_t& salt) {
  const int n = static_cast<int>(cuda_expert_gemm_tactics().size());
  for (int gemm2 = 0; gemm2 < n; ++gemm2) {
    Case c;
    c.cfg = config_for(300);
    c.cfg.num_shared_experts = 1;
    c.tokens = 300;
    c.b13 = c.b2 = true;
    c.tactic = {gemm1, gemm2};
    check_case(c, salt++);
  }
}

// The cooperative tiles (tactics 2 and 3: 128 rows, each consumer warpgroup 64 of them) on experts of 1, 63, 64,
// 65, 127, 128, 129, 192 and 193 rows (last row tiles on either side of one warpgroup's rows) and one empty, GEMM1
// plain (gate-first, then the activation pass) and gated (interleaved, tactic 3), with and without a shared expert
// of all 962 rows (last tile 66 rows).
TEST(CudaExperts, CooperativeTilesAroundHalfATile) {
  MOEKIT_REQUIRE_SM90();
  uint32_t salt = 900;
  const std::vector<int> counts = {1, 63, 64, 0, 65, 127, 128, 129, 192, 193};
  for (GateUpLayout l : {GateUpLayout::gate_first, GateUpLayout::interleaved}) {
    for (ExpertTactic tactic : {ExpertTactic{2, 2}, ExpertTactic{3, 3}, ExpertTactic{3, 2}}) {
      for (int shared : {0, 1}) {
        Case c;
        c.cfg = reduced(find_preset("qwen3-30b-a3b").experts);
        c.cfg.num_experts = static_cast<int>(counts.size());
        c.cfg.top_k = 1;
        c.cfg.num_shared_experts = shared;
        c.cfg.gate_up = l;
        c.tokens = std::accumulate(counts.begin(), counts.end(), int64_t{0});
        c.routing = Routing::counts;
        c.counts = counts;
        c.b13 = c.b2 = shared == 1;
        c.tactic = tactic;
        check_case(c, salt++);
      }
    }
  }
}

// Every grouped tactic on 256 experts of 0-330 rows (K = 1, H = 136), so that each CTA of the persistent grid runs
// many tiles across many groups: interleaved w13 with I = 136 (the gated epilogue on tactics 3, 4 and 5) and
// gate-first w13 with I = 256 (the halves main loop on tactics 4 and 5).
TEST(CudaExperts, EveryGroupedTacticWithSeveralTilesPerCta) {
  MOEKIT_REQUIRE_SM90();
  uint32_t salt = 950;
  std::vector<int> counts(256);
  for (int e = 0; e < 256; ++e) counts[e] = e * 97 % 331;
  const std::span<const GemmTacticInfo> tactics = cuda_expert_gemm_tactics();
  for (GateUpLayout l : {GateUpLayout::interleaved, GateUpLayout::gate_first}) {
    for (int g = 0; g < static_cast<int>(tactics.size()); ++g) {
      if (tactics[g].kind != GemmKernelKind::grouped) continue;
      Case c;
      c.cfg = reduced(find_preset("gpt-oss-120b").experts);
      c.cfg.num_experts = 256;
      c.cfg.top_k = 1;
      c.cfg.gate_up = l;
      c.cfg.hidden = 136;
      c.cfg.intermediate = l == GateUpLayout::interleaved ? 136 : 256;
      c.tokens = std::accumulate(counts.begin(), counts.end(), int64_t{0});
      c.routing = Routing::counts;
      c.counts = counts;
      c.tactic = {g, g};
      check_case(c, salt++);
    }
  }
}

// Interleaved w13 on tactics 3, 4 and 5 (GEMM1 with the gated activation in its epilogue: cooperative 128x256,
// pingpong 64x256 and swapped 32x128), ragged rows per expert.
TEST(CudaExperts, GatedEpilogue) {
  MOEKIT_REQUIRE_SM90();
  uint32_t salt = 370;
  auto interleaved = [](int64_t) {
    ExpertConfig cfg = reduced(find_preset("gpt-oss-120b").experts);
    cfg.gate_up = GateUpLayout::interleaved;
    return cfg;
  };
  for (int gemm1 : {3, 4, 5}) check_gated_epilogue(gemm1, interleaved, salt);
  for (int gemm1 : {3, 4, 5}) check_before_every_gemm2(gemm1, interleaved, salt);
}

// Gate-first and up-first w13 with I a multiple of 128: tactics 4 and 5 run GEMM1 with the gated activation in its
// epilogue (the weights' tiles half from each block: B's on the pingpong 64x256 tile, A's on the swapped 32x128
// one, whose halves lie in different warpgroups), tactic 3 GEMM1 and the activation pass on the same weights.
// I = 256 and 384 (two and three 256-column tiles, so the second block starts one or one and a half tiles on; four
// and six 128-row swapped tiles), H with a K tail.
TEST(CudaExperts, GatedEpilogueHalves) {
  MOEKIT_REQUIRE_SM90();
  uint32_t salt = 700;
  for (GateUpLayout l : {GateUpLayout::gate_first, GateUpLayout::up_first}) {
    auto halves = [l](int64_t tokens) {
      ExpertConfig cfg = reduced(find_preset("qwen3-30b-a3b").experts);
      cfg.gate_up = l;
      cfg.intermediate = tokens == 64 || tokens == 200 ? 384 : 256;
      return cfg;
    };
    for (int gemm1 : {3, 4, 5}) check_gated_epilogue(gemm1, halves, salt);
    for (int gemm1 : {3, 4, 5}) check_before_every_gemm2(gemm1, halves, salt);
  }
}

// Weight rows of at most 512 elements in both GEMMs (H = 264, I = 136): the decode GEMV gives each warp two column
// pairs; every layout, with biases, at 1 to 8 rows per block (each rows-per-pass kernel) and on more rows than that.
TEST(CudaExperts, DecodeShortRows) {
  MOEKIT_REQUIRE_SM90();
  uint32_t salt = 350;
  for (GateUpLayout l : {GateUpLayout::gate_first, GateUpLayout::up_first, GateUpLayout::interleaved}) {
    for (int64_t t : {1, 2, 3, 8, 40}) {
      Case c;
      c.cfg = reduced(find_preset("qwen3-30b-a3b").experts);
      c.cfg.hidden = 264;
      c.cfg.intermediate = 136;
      c.cfg.num_shared_experts = 1;
      c.cfg.gate_up = l;
      c.tokens = t;
      c.b13 = c.b2 = true;
      c.tactic = {0, 0};
      check_case(c, salt++);
    }
  }
}

// The decode GEMV without shared experts at a routed load of at most one row per expert: at T = 1 the one-row kernels
// that hold a k-step's x vectors (one column pair per warp at k = 520, two at k = 200, 136, 264); from T = 2 on two
// rows per pass with one column pair per warp (H = 520, I = 520) and one row with two pairs (I = 200, 136: GEMM2, and
// GEMM1 at H = 264): blocks of one row, of a few (random routing at T = 4: 32 slots on 32 experts) and of every token
// (one hot expert), which take several passes. At T = 1 the one-row kernels find their rows without the plan's
// offsets and slots (also with another rank's experts, whose blocks they skip); with blocks of one row (B = 1) at
// T = 2 and 4 the same kernels look them up.
TEST(CudaExperts, DecodeRoutedOnly) {
  MOEKIT_REQUIRE_SM90();
  uint32_t salt = 360;
  const std::pair<int64_t, int64_t> sizes[] = {{520, 520}, {520, 200}, {264, 136}};
  for (const auto& [h, in] : sizes) {
    for (int64_t t : {1, 2, 4}) {
      for (int block : {64, 1}) {
        if (t == 1 && block == 1) continue;
        for (Routing r : {Routing::random, Routing::one_hot}) {
          Case c;
          c.cfg = reduced(find_preset("qwen3-30b-a3b").experts);  // E = 32, K = 8, S = 0
          c.cfg.hidden = h;
          c.cfg.intermediate = in;
          c.tokens = t;
          c.block = block;
          c.routing = r;
          c.b13 = c.b2 = t == 2;
          c.tactic = {0, 0};
          check_case(c, salt++);
          if (t == 1) {  // this rank holds experts 8..23 of 32
            c.cfg.local_num_experts = 16;
            c.cfg.local_expert_offset = 8;
            check_case(c, salt++);
          }
        }
      }
    }
  }
}

// Biases only 4-byte aligned (the kernels fall back from 16-byte loads), on the decode and the grouped path.
TEST(CudaExperts, MisalignedBiases) {
  MOEKIT_REQUIRE_SM90();
  uint32_t salt = 400;
  for (GateUpLayout l : {GateUpLayout::gate_first, GateUpLayout::interleaved}) {
    for (DType bias : {DType::f32, DType::bf16}) {
      for (ExpertTactic tactic : {ExpertTactic{0, 0}, ExpertTactic{2, 2}}) {
        Case c;
        c.cfg = reduced(find_preset("gpt-oss-120b").experts);
        c.cfg.gate_up = l;
        c.tokens = 19;
        c.b13 = c.b2 = true;
        c.bias_dtype = bias;
        c.bias_offset = 4;
        c.tactic = tactic;
        check_case(c, salt++);
      }
    }
  }
}

TEST(CudaExperts, SkewedRoutingAndExpertParallelism) {
  MOEKIT_REQUIRE_SM90();
  uint32_t salt = 400;
  for (Routing r : {Routing::one_hot, Routing::half_empty}) {
    for (ExpertTactic tactic :
         {ExpertTactic{0, 0}, ExpertTactic{1, 1}, ExpertTactic{3, 2}, ExpertTactic{5, 5}, ExpertTactic{6, 6}}) {
      Case c;
      c.cfg = reduced(find_preset("deepseek-v3").experts);  // 1 shared expert
      c.cfg.num_shared_experts = 2;
      c.tokens = 200;
      c.routing = r;
      c.tactic = tactic;
      check_case(c, salt++);
      // This rank holds experts 8..23 of 32: other slots contribute nothing.
      c.cfg.local_num_experts = 16;
      c.cfg.local_expert_offset = 8;
      check_case(c, salt++);
    }
  }
}

TEST(CudaExperts, GraphCaptureReplaysNewData) {
  MOEKIT_REQUIRE_SM90();
  Case c;
  c.cfg = reduced(find_preset("qwen3-next-80b").experts);
  const int64_t h = c.cfg.hidden;
  const Device dev = Device::cuda(0);
  // T = 1 on the GEMV: the one-row kernels, whose rows come from the block alone
  const std::pair<ExpertTactic, int64_t> runs[] = {{{0, 0}, 64}, {{1, 2}, 64}, {{5, 5}, 64}, {{0, 0}, 1}};
  for (const auto& [tactic, tokens] : runs) {
    c.tactic = tactic;
    c.tokens = tokens;
    const int64_t t = c.tokens;
    SCOPED_TRACE(describe(c));
    std::mt19937 rng(test_seed() ^ 0x5eed);
    Problem first(c, rng);
    DeviceWeights dw(first, 0);
    RoutePlan dplan(first.plan.shape(), dev);
    copy_plan(first.plan, dplan);
    DeviceBuffer dh(t * h * 2), dout(t * h * 2);
    upload(dh, first.hidden);
    CudaExperts layer({c.cfg, dw.view, t, c.block, dev});
    const TensorView hv = TensorView::contiguous(dh.data(), DType::bf16, {t, h}, dev);
    const TensorView ov = TensorView::contiguous(dout.data(), DType::bf16, {t, h}, dev);

    cudaStream_t stream;
    MOEKIT_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    MOEKIT_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    layer.run(dplan, hv, ov, stream, tactic);
    MOEKIT_CUDA_OK(cudaStreamEndCapture(stream, &graph));
    MOEKIT_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));

    // New routing, hidden states (same weights): rebuild a problem from a new stream of random numbers and keep
    // the first problem's weights so the device weights stay valid.
    for (int round = 0; round < 2; ++round) {
      Problem next(c, rng);
      next.w13 = first.w13;
      next.w2 = first.w2;
      next.host_weights = first.host_weights;
      copy_plan(next.plan, dplan);
      upload(dh, next.hidden);
      fill_device_bytes(dout.data(), 0xff, t * h * 2);
      MOEKIT_CUDA_OK(cudaGraphLaunch(exec, stream));
      MOEKIT_CUDA_OK(cudaStreamSynchronize(stream));
      std::vector<uint16_t> got(t * h), want(t * h);
      MOEKIT_CUDA_OK(cudaMemcpy(got.data(), dout.data(), t * h * 2, cudaMemcpyDeviceToHost));
      experts_reference(c.cfg, first.host_weights, TensorView::contiguous(next.hidden.data(), DType::bf16, {t, h}),
                        next.plan.view(), TensorView::contiguous(want.data(), DType::bf16, {t, h}));
      const double err = rel_frobenius(got, want);
      EXPECT_LE(err, 1e-2) << "replay " << round << ": relative Frobenius error " << err;
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
}

TEST(CudaExperts, RejectsBadArguments) {
  MOEKIT_REQUIRE_SM90();
  Case c;
  c.cfg = reduced(find_preset("qwen3-30b-a3b").experts);
  c.tokens = 5;
  std::mt19937 rng(test_seed());
  Problem prob(c, rng);
  const Device dev = Device::cuda(0);
  DeviceWeights dw(prob, c.bias_offset);
  RoutePlan dplan(prob.plan.shape(), dev);
  copy_plan(prob.plan, dplan);
  const int64_t t = c.tokens, h = c.cfg.hidden;
  DeviceBuffer dh(t * h * 2), dout(t * h * 2);
  CudaExperts layer({c.cfg, dw.view, t, c.block, dev});
  const TensorView hv = TensorView::contiguous(dh.data(), DType::bf16, {t, h}, dev);
  const TensorView ov = TensorView::contiguous(dout.data(), DType::bf16, {t, h}, dev);
  try {
    layer.run(dplan, hv, ov, nullptr, {9, 0});
    ADD_FAILURE() << "no exception for tactic 9";
  } catch (const NotSupported& e) {
    EXPECT_EQ(std::string(e.what()),
              "moekit::experts: gemm1 tactic (9) must be one of: 0: gemv_8rows, 1: sm90_pingpong_64x128x64, "
              "2: sm90_cooperative_128x128x64, 3: sm90_cooperative_128x256x64, 4: sm90_pingpong_64x256x64, "
              "5: sm90_swap_ab_cooperative_32x128x64, 6: sm90_swap_ab_cooperative_96x256x64");
  }
  const TensorView wrong = TensorView::contiguous(dh.data(), DType::f16, {t, h}, dev);
  try {
    layer.run(dplan, wrong, ov);
    ADD_FAILURE() << "no exception for fp16 hidden";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()),
              "moekit::experts: hidden ([5, 520] fp16 cuda:0) must be [T, H] = [5, 520] "
              "bf16 contiguous on cuda:0");
  }
  // A view 16 bytes into hidden (rejected before any kernel runs, so it may reach past the buffer).
  const TensorView shifted = TensorView::contiguous(static_cast<uint16_t*>(dh.data()) + 8, DType::bf16, {t, h}, dev);
  try {
    layer.run(dplan, hv, shifted);
    ADD_FAILURE() << "no exception for an out that overlaps hidden";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()),
              "moekit::experts: out ([5, 520] bf16 cuda:0) must be hidden itself (in place) or share no byte with "
              "it; it starts 16 bytes after hidden");
  }
  CudaExpertsArgs bad{c.cfg, dw.view, 0, c.block, dev};
  try {
    CudaExperts l2(bad);
    ADD_FAILURE() << "no exception for max_tokens 0";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()), "moekit::experts: max_tokens (0) must be >= 1");
  }
  bad.max_tokens = 4;  // the plan holds 5 tokens
  CudaExperts small(bad);
  try {
    small.run(dplan, hv, ov);
    ADD_FAILURE() << "no exception for T > max_tokens";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()), "moekit::experts: plan tokens (5) must be <= max_tokens (4)");
  }
  // A moved-from object owns nothing and says so; the one it moved into keeps the workspace.
  CudaExperts moved_into(std::move(small));
  try {
    small.run(dplan, hv, ov);
    ADD_FAILURE() << "no exception from a moved-from object";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()), "moekit::experts: this CudaExperts owns no workspace (it was moved from)");
  }
  EXPECT_EQ(moved_into.max_tokens(), 4);
}

TEST(CudaExperts, DefaultTacticIsDeterministicAndValid) {
  MOEKIT_REQUIRE_SM90();
  Case c;
  c.cfg = reduced(find_preset("mixtral-8x7b").experts);
  std::mt19937 rng(test_seed());
  c.tokens = 1;
  Problem prob(c, rng);
  DeviceWeights dw(prob, c.bias_offset);
  CudaExperts layer({c.cfg, dw.view, 16384, 64, Device::cuda(0)});
  const int n = static_cast<int>(cuda_expert_gemm_tactics().size());
  for (int64_t t : {1, 16, 64, 256, 1024, 4096, 16384}) {
    const ExpertTactic a = layer.default_tactic(t);
    EXPECT_EQ(a, cuda_expert_default_tactic(c.cfg, t, layer.tactic_gpu()));  // the free heuristic on its config
    EXPECT_TRUE(a.gemm1 >= 0 && a.gemm1 < n && a.gemm2 >= 0 && a.gemm2 < n) << t;
  }
  EXPECT_EQ(layer.tactic_gpu(), tactic_gpu_of(device_info(0)));
  // Decode sizes (<= 4 tokens at ~1 row per expert) take the GEMV, large batches a grouped GEMM.
  EXPECT_EQ(cuda_expert_gemm_tactics()[layer.default_tactic(1).gemm1].kind, GemmKernelKind::gemv);
  EXPECT_EQ(cuda_expert_gemm_tactics()[layer.default_tactic(4096).gemm1].kind, GemmKernelKind::grouped);
}

// The default heuristic's picks on the real presets: the rules of cuda_experts.cpp as fitted to the H200 sweeps in
// docs/benchmarks.md (host code only: runs without a GPU).
TEST(CudaExpertsHeuristic, PresetsGetTheMeasuredTactics) {
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

// Where paired runs on an H100 favoured other tiles, its picks differ from the H200's; elsewhere they are the same
// (host code only).
TEST(CudaExpertsHeuristic, H100RulesOverrideOnlyWhereMeasured) {
  const std::span<const GemmTacticInfo> tactics = cuda_expert_gemm_tactics();
  auto names = [&](const char* preset, int64_t tokens, TacticGpu gpu) {
    const ExpertTactic t = cuda_expert_default_tactic(find_preset(preset).experts, tokens, gpu);
    return std::string(tactics[t.gemm1].name) + " / " + std::string(tactics[t.gemm2].name);
  };
  const std::string large = "sm90_cooperative_128x256x64 / sm90_cooperative_128x256x64";
  const std::string small = "sm90_pingpong_64x256x64 / sm90_pingpong_64x256x64";
  const std::string swap96 = "sm90_swap_ab_cooperative_96x256x64 / sm90_swap_ab_cooperative_96x256x64";
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
      // where the H200 takes swapped 96x256.
      {"gpt-oss-120b", 1760, small, small},   // 55 rows
      {"gpt-oss-120b", 1761, large, small},   // 56 rows
      {"gpt-oss-120b", 2048, large, small},   // 64 rows
      {"gpt-oss-120b", 2304, large, swap96},  // 72 rows
      {"gpt-oss-120b", 2305, small, swap96},  // 73 rows
      {"gpt-oss-120b", 2880, small, swap96},  // 90 rows
      {"gpt-oss-120b", 2881, small, small},   // 91 rows
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

// Which GEMM1 tactics apply b13 + the activation themselves, per w13 arrangement (host code only): the GEMV always,
// the tiles with a fused gated epilogue for that arrangement, and none of the grouped tiles for gate-first /
// up-first w13 whose I is no multiple of 128.
TEST(CudaExpertsHeuristic, ActivationInGemm1WhereAFusedFormExists) {
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

}  // namespace
}  // namespace moekit

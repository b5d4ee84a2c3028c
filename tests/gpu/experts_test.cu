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

}  // namespace
}  // namespace moekit

// The expert-parallel layer on W GPUs (one thread each, run_on_gpus) against the CPU reference of the whole layer
// (route + experts_reference, fp32) over the same W*T tokens: relative Frobenius error <= 1e-2 for
// every rank, both modes, W = 1 and W = 2 (and every visible GPU when more), uneven partitions, E - L < K, bf16
// logits, one token; in place (out = hidden); CUDA-graph capture of forward() then replay with new data; a
// communicator made from a unique id and a borrowed one. Inputs are random with a printed seed (MOEKIT_TEST_SEED
// replays one). Cases needing more GPUs than are visible skip with a message.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "gpu/gpu_test.h"
#include "moekit/device.h"
#include "moekit/error.h"
#include "moekit/expert_parallel.h"
#include "moekit/experts.h"
#include "moekit/plan.h"

namespace moekit {
namespace {

uint32_t test_seed() {
  return test::run_seed("gpu ep_test");
}

// Why W GPUs cannot run this test, or "" when they can.
std::string missing_gpus(int W) {
  const int n = cuda_device_count();
  if (n < W) return "needs " + std::to_string(W) + " GPU(s), " + std::to_string(n) + " visible";
  for (int d = 0; d < W; ++d)
    if (!device_is_sm90(d)) return "device " + std::to_string(d) + " is not an sm90 GPU";
  return "";
}

// Skips where the machine has fewer than W sm90 GPUs; one GPU is required where test::gpu_required() says so.
#define MOEKIT_REQUIRE_GPUS(W)                                           \
  do {                                                                   \
    const std::string why = missing_gpus(W);                             \
    if (!why.empty() && (W) == 1 && test::gpu_required()) FAIL() << why; \
    if (!why.empty()) GTEST_SKIP() << why;                               \
  } while (0)

struct GpuCase {
  std::string name;
  RoutingConfig routing;
  int hidden = 128, intermediate = 64;
  int64_t tokens = 37;
  int block = 16;
  bool bias = false;
  DType logits_dtype = DType::f32;
  bool weight_on_input = false;  // ExpertConfig::routing_weight_on_input
};

std::vector<GpuCase> gpu_cases() {
  return {
      {"dsv3-like sigmoid_grouped E16 K4 S1 bias",
       make_routing_config(RoutingMethod::sigmoid_grouped, 16, 4, 1, true, 4, 2, 2.5f), 256, 128, 200, 64, true},
      {"softmax_topk E13 K3 uneven, bf16 logits", make_routing_config(RoutingMethod::softmax_topk, 13, 3, 0, true),
       128, 64, 64, 16, false, DType::bf16},
      {"softmax_topk E4 K3 (E - L < K)", make_routing_config(RoutingMethod::softmax_topk, 4, 3, 0, true), 128, 64, 19,
       16},
      {"topk_softmax E8 K2 S1 one token", make_routing_config(RoutingMethod::topk_softmax, 8, 2, 1, true), 128, 64, 1,
       16},
      {"llama4 E8 K1 S1 weight on input", make_routing_config(RoutingMethod::llama4, 8, 1, 1, false), 128, 64, 45, 16,
       false, DType::f32, true},
  };
}

std::vector<uint16_t> random_bf16(std::mt19937& rng, int64_t n, float scale) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<uint16_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = float_to_bf16(u(rng));
  return v;
}

// Host data of one layer for W ranks: whole weights, and `sets` input sets of W*T tokens.
struct Layer {
  GpuCase c;
  int W;
  ExpertConfig global{};
  std::vector<uint16_t> w13, w2;
  std::vector<float> bias;
  std::vector<std::vector<uint16_t>> hidden;    // per set [W*T, H]
  std::vector<std::vector<char>> logits;        // per set [W*T, E] in c.logits_dtype
  std::vector<std::vector<uint16_t>> expected;  // per set [W*T, H]: the CPU reference

  Layer(const GpuCase& gc, int world, int sets, uint32_t seed) : c(gc), W(world) {
    std::mt19937 rng(seed);
    const int E = c.routing.num_experts, S = c.routing.num_shared_experts;
    const int64_t H = c.hidden, I = c.intermediate, N = W * c.tokens;
    global.num_experts = E;
    global.top_k = c.routing.top_k;
    global.hidden = c.hidden;
    global.intermediate = c.intermediate;
    global.num_shared_experts = S;
    global.routing_weight_on_input = c.weight_on_input;
    w13 = random_bf16(rng, (E + S) * 2 * I * H, 1.0f / std::sqrt(float(H)));
    w2 = random_bf16(rng, (E + S) * H * I, 1.0f / std::sqrt(float(I)));
    std::normal_distribution<float> nd(0.0f, 2.0f);
    for (int e = 0; e < E; ++e) bias.push_back(0.05f * nd(rng));
    for (int s = 0; s < sets; ++s) {
      hidden.push_back(random_bf16(rng, N * H, 1.0f));
      std::vector<char> l(static_cast<size_t>(N * E * dtype_size(c.logits_dtype)));
      for (int64_t i = 0; i < N * E; ++i) {
        const float v = nd(rng);
        if (c.logits_dtype == DType::bf16)
          reinterpret_cast<uint16_t*>(l.data())[i] = float_to_bf16(v);
        else
          reinterpret_cast<float*>(l.data())[i] = v;
      }
      logits.push_back(std::move(l));
    }
  }

  // The CPU reference of the whole layer (route + experts_reference, fp32) for every input set.
  void compute_expected() {
    const int E = c.routing.num_experts, S = c.routing.num_shared_experts;
    const int64_t H = c.hidden, I = c.intermediate, N = W * c.tokens;
    ExpertWeights w;
    w.w13 = TensorView::contiguous(w13.data(), DType::bf16, {E + S, 2 * I, H});
    w.w2 = TensorView::contiguous(w2.data(), DType::bf16, {E + S, H, I});
    RoutePlan plan(PlanShape{N, E, c.routing.top_k, S, c.block}, Device::cpu());
    for (size_t s = 0; s < hidden.size(); ++s) {
      route(c.routing, TensorView::contiguous(logits[s].data(), c.logits_dtype, {N, E}),
            c.bias ? TensorView::contiguous(bias.data(), DType::f32, {E}) : TensorView{}, plan);
      expected.emplace_back(static_cast<size_t>(N * H));
      experts_reference(global, w, TensorView::contiguous(hidden[s].data(), DType::bf16, {N, H}), plan.view(),
                        TensorView::contiguous(expected.back().data(), DType::bf16, {N, H}));
    }
  }
};

// Runs the EP layer on W GPUs for every input set (set 0 eager; with `graph`, set 1 by replaying a graph captured
// on set 0's buffers after new data was copied in) and returns the error of every (set, rank).
std::vector<double> run_ep(const Layer& L, EpMode mode, bool graph) {
  const int W = L.W, E = L.c.routing.num_experts, S = L.c.routing.num_shared_experts;
  const int64_t H = L.c.hidden, I = L.c.intermediate, T = L.c.tokens;
  const int64_t lsz = dtype_size(L.c.logits_dtype);
  // Per set and rank; a last row for set 0 run again in place (out = hidden).
  std::vector<double> errors((L.hidden.size() + 1) * W, -1.0);
  run_on_gpus(W, [&](int r, Communicator& comm) {
    const Device dev = Device::cuda(r);
    const ExpertPartition p = expert_partition(E, W, r);
    const int64_t n13 = 2 * I * H, n2 = H * I, Lr = p.count;
    DeviceBuffer d13((Lr + S) * n13 * 2, r), d2((Lr + S) * n2 * 2, r), db(E * 4, r), dh(T * H * 2, r),
        dl(T * E * lsz, r), dout(T * H * 2, r);
    // This rank's experts, then the shared ones.
    copy_to_device(d13.data(), L.w13.data() + p.offset * n13, Lr * n13 * 2);
    copy_to_device(static_cast<uint16_t*>(d13.data()) + Lr * n13, L.w13.data() + E * n13, S * n13 * 2);
    copy_to_device(d2.data(), L.w2.data() + p.offset * n2, Lr * n2 * 2);
    copy_to_device(static_cast<uint16_t*>(d2.data()) + Lr * n2, L.w2.data() + E * n2, S * n2 * 2);
    db.upload(L.bias.data(), E * 4);
    EpLayerArgs a;
    a.experts = L.global;
    a.routing = L.c.routing;
    a.weights.w13 = TensorView::contiguous(d13.data(), DType::bf16, {Lr + S, 2 * I, H}, dev);
    a.weights.w2 = TensorView::contiguous(d2.data(), DType::bf16, {Lr + S, H, I}, dev);
    a.routing_bias = L.c.bias ? TensorView::contiguous(db.data(), DType::f32, {E}, dev) : TensorView{};
    a.mode = mode;
    a.max_tokens = T;
    a.block = L.c.block;
    EpLayer layer(a, comm);
    cudaStream_t s;
    if (cudaStreamCreate(&s) != cudaSuccess) throw CudaError("test", "cudaStreamCreate failed");
    const TensorView hv = TensorView::contiguous(dh.data(), DType::bf16, {T, H}, dev);
    const TensorView lv = TensorView::contiguous(dl.data(), L.c.logits_dtype, {T, E}, dev);
    const TensorView ov = TensorView::contiguous(dout.data(), DType::bf16, {T, H}, dev);
    auto load = [&](size_t set) {
      dh.upload(L.hidden[set].data() + r * T * H, T * H * 2);
      dl.upload(L.logits[set].data() + r * T * E * lsz, T * E * lsz);
    };
    auto check = [&](size_t set, size_t row) {
      std::vector<uint16_t> got(static_cast<size_t>(T * H));
      dout.download(got.data(), got.size() * 2);
      errors[row * W + r] = relative_frobenius_bf16(got.data(), L.expected[set].data() + r * T * H, T * H);
    };
    load(0);
    layer.forward(hv, lv, ov, s);
    if (cudaStreamSynchronize(s) != cudaSuccess) throw CudaError("test", "forward failed");
    check(0, 0);
    dout.upload(L.hidden[0].data() + r * T * H, T * H * 2);
    layer.forward(ov, lv, ov, s);
    if (cudaStreamSynchronize(s) != cudaSuccess) throw CudaError("test", "in-place forward failed");
    check(0, L.hidden.size());
    for (size_t set = 1; set < L.hidden.size(); ++set) {
      cudaGraph_t g = nullptr;
      cudaGraphExec_t ge = nullptr;
      if (graph) {  // capture on the same buffers, then replay with the new set's data in them
        // Relaxed: NCCL may set up connections or register buffers on the host while the capture is open.
        if (cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) != cudaSuccess)
          throw CudaError("test", "cudaStreamBeginCapture failed");
        layer.forward(hv, lv, ov, s);
        if (cudaStreamEndCapture(s, &g) != cudaSuccess) throw CudaError("test", "cudaStreamEndCapture failed");
        if (cudaGraphInstantiate(&ge, g, 0) != cudaSuccess) throw CudaError("test", "cudaGraphInstantiate failed");
      }
      load(set);
      if (graph) {
        if (cudaGraphLaunch(ge, s) != cudaSuccess) throw CudaError("test", "cudaGraphLaunch failed");
      } else {
        layer.forward(hv, lv, ov, s);
      }
      if (cudaStreamSynchronize(s) != cudaSuccess) throw CudaError("test", "replay failed");
      check(set, set);
      if (ge) cudaGraphExecDestroy(ge);
      if (g) cudaGraphDestroy(g);
    }
    cudaStreamDestroy(s);
  });
  return errors;
}

void expect_close(const std::vector<double>& errors, int W, const std::string& what) {
  for (size_t i = 0; i < errors.size(); ++i) {
    const std::string run = i / W + 1 == errors.size() / W ? "set 0 in place" : "set " + std::to_string(i / W);
    EXPECT_GE(errors[i], 0.0) << what << ": " << run << " rank " << i % W << " was not checked";
    EXPECT_LE(errors[i], 1e-2) << what << ": " << run << " rank " << i % W;
  }
}

void run_world(int W, bool graph) {
  uint32_t seed = test_seed();
  for (const GpuCase& c : gpu_cases()) {
    if (W > c.routing.num_experts) continue;
    Layer L(c, W, 2, ++seed);
    L.compute_expected();
    for (EpMode mode : {EpMode::all_gather, EpMode::all_to_all}) {
      const std::string what = c.name + ", W " + std::to_string(W) + ", " + std::string(ep_mode_name(mode)) +
                               (graph ? ", graph replay" : "") + ", seed " + std::to_string(seed);
      std::printf("%s\n", what.c_str());
      expect_close(run_ep(L, mode, graph), W, what);
    }
  }
}

TEST(GpuEp, OneGpuMatchesTheReference) {
  MOEKIT_REQUIRE_GPUS(1);
  run_world(1, false);
}

TEST(GpuEp, TwoGpusMatchTheReference) {
  MOEKIT_REQUIRE_GPUS(2);
  run_world(2, false);
}

TEST(GpuEp, EveryGpuMatchesTheReference) {
  const int n = cuda_device_count();
  if (n <= 2) GTEST_SKIP() << "needs more than 2 GPUs (the W = 1 and W = 2 tests cover " << n << ")";
  MOEKIT_REQUIRE_GPUS(n);
  run_world(n, false);
}

TEST(GpuEp, GraphReplayOneGpu) {
  MOEKIT_REQUIRE_GPUS(1);
  run_world(1, true);
}

TEST(GpuEp, GraphReplayTwoGpus) {
  MOEKIT_REQUIRE_GPUS(2);
  run_world(2, true);
}

TEST(GpuEp, UniqueIdAndBorrowedCommunicators) {
  MOEKIT_REQUIRE_GPUS(1);
  const CommUniqueId id = Communicator::unique_id();
  Communicator owned = Communicator::init_rank(id, 1, 0, 0);
  ASSERT_TRUE(owned.valid());
  EXPECT_EQ(owned.world_size(), 1);
  EXPECT_EQ(owned.rank(), 0);
  EXPECT_EQ(owned.device(), 0);
  Communicator borrowed = Communicator::borrow(owned.handle());
  EXPECT_EQ(borrowed.world_size(), 1);
  EXPECT_EQ(borrowed.rank(), 0);
  EXPECT_EQ(borrowed.device(), 0);

  // The EP layer on the unique-id communicator matches the reference.
  const GpuCase c = gpu_cases()[0];
  Layer L(c, 1, 1, test_seed() + 100);
  L.compute_expected();
  const int E = c.routing.num_experts, S = c.routing.num_shared_experts;
  const int64_t H = c.hidden, I = c.intermediate, T = c.tokens;
  const Device dev = Device::cuda(0);
  DeviceBuffer d13(L.w13.size() * 2, 0), d2(L.w2.size() * 2, 0), db(E * 4, 0), dh(T * H * 2, 0),
      dl(L.logits[0].size(), 0), dout(T * H * 2, 0);
  d13.upload(L.w13.data(), L.w13.size() * 2);
  d2.upload(L.w2.data(), L.w2.size() * 2);
  db.upload(L.bias.data(), E * 4);
  dh.upload(L.hidden[0].data(), T * H * 2);
  dl.upload(L.logits[0].data(), L.logits[0].size());
  EpLayerArgs a;
  a.experts = L.global;
  a.routing = c.routing;
  a.weights.w13 = TensorView::contiguous(d13.data(), DType::bf16, {E + S, 2 * I, H}, dev);
  a.weights.w2 = TensorView::contiguous(d2.data(), DType::bf16, {E + S, H, I}, dev);
  a.routing_bias = c.bias ? TensorView::contiguous(db.data(), DType::f32, {E}, dev) : TensorView{};
  a.max_tokens = T;
  a.block = c.block;
  EpLayer layer(a, borrowed);
  layer.forward(TensorView::contiguous(dh.data(), DType::bf16, {T, H}, dev),
                TensorView::contiguous(dl.data(), c.logits_dtype, {T, E}, dev),
                TensorView::contiguous(dout.data(), DType::bf16, {T, H}, dev));
  std::vector<uint16_t> got(static_cast<size_t>(T * H));
  dout.download(got.data(), got.size() * 2);
  EXPECT_LE(relative_frobenius_bf16(got.data(), L.expected[0].data(), T * H), 1e-2);
}

TEST(GpuEp, ArgumentChecks) {
  MOEKIT_REQUIRE_GPUS(1);
  Communicator empty;
  EpLayerArgs a;
  a.experts.num_experts = 4;
  a.experts.top_k = 1;
  a.experts.hidden = 8;
  a.experts.intermediate = 8;
  a.routing = make_routing_config(RoutingMethod::softmax_topk, 4, 1, 0, false);
  a.max_tokens = 4;
  try {
    EpLayer layer(a, empty);
    ADD_FAILURE() << "an empty communicator was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "moekit::ep: comm (empty) must hold an NCCL communicator");
  }
  try {
    Communicator::init_all(cuda_device_count() + 1);
    ADD_FAILURE() << "more ranks than devices were accepted";
  } catch (const InvalidArgument& e) {
    const std::string want = "moekit::ep: world_size (" + std::to_string(cuda_device_count() + 1) +
                             ") must be <= visible CUDA devices (" + std::to_string(cuda_device_count()) + ")";
    EXPECT_EQ(std::string(e.what()), want);
  }
  // A rank whose weights hold the whole layer instead of its share is rejected by the weight validation.
  std::vector<Communicator> comms = Communicator::init_all(1);
  a.routing = make_routing_config(RoutingMethod::softmax_topk, 4, 1, 0, false);
  DeviceBuffer d13(4 * 16 * 8 * 2, 0), d2(4 * 8 * 8 * 2, 0);
  a.weights.w13 = TensorView::contiguous(d13.data(), DType::bf16, {3, 16, 8}, Device::cuda(0));
  a.weights.w2 = TensorView::contiguous(d2.data(), DType::bf16, {3, 8, 8}, Device::cuda(0));
  EXPECT_THROW(EpLayer(a, comms[0]), InvalidArgument);
  if (!device_is_sm90(0)) return;  // the layer below needs the experts' sm90 kernels
  // An out that overlaps hidden without being it (here 16 bytes into it) is rejected before anything runs.
  a.weights.w13 = TensorView::contiguous(d13.data(), DType::bf16, {4, 16, 8}, Device::cuda(0));
  a.weights.w2 = TensorView::contiguous(d2.data(), DType::bf16, {4, 8, 8}, Device::cuda(0));
  EpLayer layer(a, comms[0]);
  DeviceBuffer dh(3 * 8 * 2, 0), dl(2 * 4 * 4, 0);
  const TensorView h = TensorView::contiguous(dh.data(), DType::bf16, {2, 8}, Device::cuda(0));
  const TensorView shifted =
      TensorView::contiguous(static_cast<uint16_t*>(dh.data()) + 8, DType::bf16, {2, 8}, Device::cuda(0));
  const TensorView l = TensorView::contiguous(dl.data(), DType::f32, {2, 4}, Device::cuda(0));
  try {
    layer.forward(h, l, shifted);
    ADD_FAILURE() << "an out that overlaps hidden was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(),
                 "moekit::ep: out ([2, 8] bf16 cuda:0) must be hidden itself (in place) or share no byte with it; "
                 "it starts 16 bytes after hidden");
  }
}

}  // namespace
}  // namespace moekit

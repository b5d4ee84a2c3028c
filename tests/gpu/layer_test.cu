// MoELayer on the GPU through the "cuda_bf16" runner (fused router + grouped-GEMM experts) against the same layer
// on the CPU "reference" runner with the same weights: relative Frobenius error <= 1e-2 for reduced-size versions
// of every preset at T in {1, 64, 1000}, every tactic pair, CUDA-graph capture of forward() replayed with new
// logits and hidden states, the runner lifecycle on the GPU (errors, idempotent build, rebuild), synthetic weights
// equal to the reference runner's, the tuner in a TuningScope producing a cache entry, and tuning on given logits
// (the row copy into the runner's timing inputs checked byte for byte). Fresh random inputs per run (the seed is
// printed; MOEKIT_TEST_SEED replays one). Skips without an sm90 GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "error_of.h"
#include "gpu/gpu_test.h"
#include "moekit/cuda_experts.h"
#include "moekit/device.h"
#include "moekit/error.h"
#include "moekit/layer.h"
#include "moekit/presets.h"
#include "moekit/tuner.h"
#include "runtime/cuda_fill.h"

namespace moekit {
namespace {

#define MOEKIT_REQUIRE_SM90() MOEKIT_SKIP_WITHOUT_SM90("the cuda_bf16 runner needs an H100/H200 (and a CUDA build)")

uint32_t test_seed() {
  return test::run_seed("layer_test");
}

using testing::error_of;

// A reduced version of a preset: same routing rules, K, S, activation, layout and biases; at most 32 experts
// (a multiple of n_group), H = 264 and I = 136 (not multiples of 64: K and N tails in both GEMMs).
LayerSpec reduced_spec(const Preset& p) {
  LayerSpec s = preset_layer_spec(p);
  const int e = std::min(p.routing.num_experts, 32);
  s.routing.num_experts = s.experts.num_experts = e;
  s.experts.hidden = 264;
  s.experts.intermediate = 136;
  s.validate();
  return s;
}

// One layer's tensors on the host and their copies on the GPU.
struct LayerData {
  std::vector<uint16_t> w13, w2;
  std::vector<float> b13, b2, bias;
  LayerWeights host, gpu;
  std::vector<DeviceBuffer> keep;

  LayerData(const LayerSpec& s, std::mt19937& rng) {
    const ExpertConfig& e = s.experts;
    const int64_t ew = e.weight_experts(), h = e.hidden, i = e.intermediate;
    w13 = random_bf16(rng, ew * 2 * i * h, 1.0f / std::sqrt(float(h)));
    w2 = random_bf16(rng, ew * h * i, 1.0f / std::sqrt(float(i)));
    host.experts.w13 = TensorView::contiguous(w13.data(), DType::bf16, {ew, 2 * i, h});
    host.experts.w2 = TensorView::contiguous(w2.data(), DType::bf16, {ew, h, i});
    gpu.experts.w13 = to_gpu(w13, DType::bf16, {ew, 2 * i, h});
    gpu.experts.w2 = to_gpu(w2, DType::bf16, {ew, h, i});
    if (s.expert_biases) {
      b13 = random_f32(rng, ew * 2 * i, 0.2f);
      b2 = random_f32(rng, ew * h, 0.2f);
      host.experts.b13 = TensorView::contiguous(b13.data(), DType::f32, {ew, 2 * i});
      host.experts.b2 = TensorView::contiguous(b2.data(), DType::f32, {ew, h});
      gpu.experts.b13 = to_gpu(b13, DType::f32, {ew, 2 * i});
      gpu.experts.b2 = to_gpu(b2, DType::f32, {ew, h});
    }
    if (s.routing_bias) {
      bias = random_f32(rng, s.routing.num_experts, 0.5f);
      host.routing_bias = TensorView::contiguous(bias.data(), DType::f32, {s.routing.num_experts});
      gpu.routing_bias = to_gpu(bias, DType::f32, {s.routing.num_experts});
    }
  }

  static std::vector<uint16_t> random_bf16(std::mt19937& rng, int64_t n, float scale) {
    std::uniform_real_distribution<float> u(-scale, scale);
    std::vector<uint16_t> v(static_cast<size_t>(n));
    for (auto& x : v) x = float_to_bf16(u(rng));
    return v;
  }
  static std::vector<float> random_f32(std::mt19937& rng, int64_t n, float scale) {
    std::uniform_real_distribution<float> u(-scale, scale);
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = u(rng);
    return v;
  }
  template <class T>
  TensorView to_gpu(const std::vector<T>& v, DType dt, std::initializer_list<int64_t> shape) {
    keep.emplace_back(v.size() * sizeof(T));
    keep.back().upload(v.data(), v.size() * sizeof(T));
    return TensorView::contiguous(keep.back().data(), dt, shape, Device::cuda(0));
  }
};

// One forward call's inputs on the host and a GPU copy (hidden, logits, out) for up to `max_tokens` tokens.
struct Inputs {
  int64_t h, e;
  std::vector<uint16_t> hidden;
  std::vector<float> logits;
  DeviceBuffer d_hidden, d_logits, d_out;

  Inputs(const LayerSpec& s, int64_t max_tokens)
      : h(s.experts.hidden),
        e(s.routing.num_experts),
        d_hidden(static_cast<size_t>(max_tokens * h * 2)),
        d_logits(static_cast<size_t>(max_tokens * e * 4)),
        d_out(static_cast<size_t>(max_tokens * h * 2)) {}

  // Fresh random data for t tokens, uploaded.
  void refill(std::mt19937& rng, int64_t t) {
    hidden = LayerData::random_bf16(rng, t * h, 1.0f);
    logits = LayerData::random_f32(rng, t * e, 3.0f);
    d_hidden.upload(hidden.data(), hidden.size() * 2);
    d_logits.upload(logits.data(), logits.size() * 4);
  }
  TensorView gpu_hidden(int64_t t) const {
    return TensorView::contiguous(d_hidden.data(), DType::bf16, {t, h}, Device::cuda(0));
  }
  TensorView gpu_logits(int64_t t) const {
    return TensorView::contiguous(d_logits.data(), DType::f32, {t, e}, Device::cuda(0));
  }
  TensorView gpu_out(int64_t t) const {
    return TensorView::contiguous(d_out.data(), DType::bf16, {t, h}, Device::cuda(0));
  }
  // Poisons the GPU output (0xFFFF is a bf16 NaN), so an unwritten element fails the comparison.
  void poison_out(int64_t t) {
    const std::vector<uint16_t> nan(static_cast<size_t>(t * h), 0xFFFF);
    d_out.upload(nan.data(), nan.size() * 2);
  }
  std::vector<uint16_t> download_out(int64_t t) const {
    std::vector<uint16_t> out(static_cast<size_t>(t * h));
    device_synchronize();
    d_out.download(out.data(), out.size() * 2);
    return out;
  }
  // The reference layer's output on the host copies.
  std::vector<uint16_t> reference(MoELayer& ref, int64_t t) {
    std::vector<uint16_t> out(static_cast<size_t>(t * h));
    ref.forward(TensorView::contiguous(hidden.data(), DType::bf16, {t, h}),
                TensorView::contiguous(logits.data(), DType::f32, {t, e}),
                TensorView::contiguous(out.data(), DType::bf16, {t, h}));
    return out;
  }
};

// Relative Frobenius error of a layer output (NaN, an unwritten or broken element, fails every <= check).
double relative_error(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want) {
  if (got.size() != want.size()) return std::nan("");  // fails every <= check
  return relative_frobenius_bf16(got.data(), want.data(), static_cast<int64_t>(want.size()));
}

LayerOptions options(const std::string& backend, int64_t max_tokens, Autotuner* tuner) {
  LayerOptions o;
  o.backends = {backend};
  o.max_tokens = max_tokens;
  o.tuner = tuner;
  return o;
}

class GpuLayer : public ::testing::Test {
 protected:
  void SetUp() override {
    register_cuda_runners();
    rng_.seed(test_seed() + salt_++);
  }
  std::mt19937 rng_;
  Autotuner tuner_{CacheMetadata::current()};
  static inline uint32_t salt_ = 0;
};

TEST_F(GpuLayer, ReducedPresetsMatchTheReferenceLayer) {
  MOEKIT_REQUIRE_SM90();
  for (const Preset& p : presets()) {
    const LayerSpec s = reduced_spec(p);
    LayerData w(s, rng_);
    MoELayer gpu(s.experts, s.routing, s.quant, w.gpu, options("auto", 1000, &tuner_));
    MoELayer ref(s.experts, s.routing, s.quant, w.host, options("reference", 1000, &tuner_));
    ASSERT_EQ(gpu.backend(), "cuda_bf16") << p.name;
    Inputs in(s, 1000);
    for (int64_t t : {1, 64, 1000}) {
      in.refill(rng_, t);
      in.poison_out(t);
      gpu.forward(in.gpu_hidden(t), in.gpu_logits(t), in.gpu_out(t));
      const double err = relative_error(in.download_out(t), in.reference(ref, t));
      EXPECT_LE(err, 1e-2) << p.name << " T=" << t << " tactics " << gpu.choice(t).tactics.gemm1 << "/"
                           << gpu.choice(t).tactics.gemm2;
    }
  }
}

TEST_F(GpuLayer, EveryTacticPairMatchesTheReference) {
  MOEKIT_REQUIRE_SM90();
  // gpt-oss-120b: interleaved w13, so the GEMM1 tactics with the gated epilogue meet every GEMM2 tactic on one
  // layer's weights (a pair that wrote into them would fail every pair after it).
  for (const char* name : {"qwen3-30b-a3b", "deepseek-v3", "gpt-oss-120b"}) {
    const LayerSpec s = reduced_spec(find_preset(name));
    LayerData w(s, rng_);
    MoELayer gpu(s.experts, s.routing, s.quant, w.gpu, options("cuda_bf16", 64, &tuner_));
    MoELayer ref(s.experts, s.routing, s.quant, w.host, options("reference", 64, &tuner_));
    Runner& r = gpu.runner();
    ASSERT_EQ(r.gemm1_tactics().size(), cuda_expert_gemm_tactics().size());
    for (int64_t t : {5, 64}) {
      Inputs in(s, t);
      in.refill(rng_, t);
      const std::vector<uint16_t> want = in.reference(ref, t);
      for (int a = 0; a < static_cast<int>(r.gemm1_tactics().size()); ++a)
        for (int b = 0; b < static_cast<int>(r.gemm2_tactics().size()); ++b) {
          EXPECT_EQ(r.gemm1_tactics()[a].name, cuda_expert_gemm_tactics()[a].name);
          in.poison_out(t);
          r.execute({in.gpu_hidden(t), in.gpu_logits(t), in.gpu_out(t), {}}, {a, b});
          EXPECT_LE(relative_error(in.download_out(t), want), 1e-2)
              << name << " T=" << t << " pair " << a << "/" << b;
        }
    }
  }
}

// out may be hidden itself: every tactic pair reads hidden (the gather, or the first GEMV) before the combine writes
// out, so in place gives the bytes that separate buffers give. An out that overlaps hidden otherwise is rejected.
TEST_F(GpuLayer, InPlaceGivesTheSameBytesForEveryTacticPair) {
  MOEKIT_REQUIRE_SM90();
  const LayerSpec s = reduced_spec(find_preset("qwen3-30b-a3b"));
  LayerData w(s, rng_);
  MoELayer gpu(s.experts, s.routing, s.quant, w.gpu, options("cuda_bf16", 1000, &tuner_));
  Runner& r = gpu.runner();
  Inputs in(s, 1000);
  for (int64_t t : {1, 5, 64, 1000}) {
    in.refill(rng_, t);
    for (int a = 0; a < static_cast<int>(r.gemm1_tactics().size()); ++a)
      for (int b = 0; b < static_cast<int>(r.gemm2_tactics().size()); ++b) {
        in.poison_out(t);
        r.execute({in.gpu_hidden(t), in.gpu_logits(t), in.gpu_out(t), {}}, {a, b});
        const std::vector<uint16_t> apart = in.download_out(t);
        in.d_out.upload(in.hidden.data(), in.hidden.size() * 2);
        r.execute({in.gpu_out(t), in.gpu_logits(t), in.gpu_out(t), {}}, {a, b});
        EXPECT_EQ(in.download_out(t), apart) << "T=" << t << " pair " << a << "/" << b;
      }
  }
  const TensorView h = in.gpu_hidden(4);
  const TensorView shifted = TensorView::contiguous(static_cast<uint16_t*>(in.d_hidden.data()) + 264, DType::bf16,
                                                    {4, 264}, Device::cuda(0));
  EXPECT_EQ(error_of([&] { gpu.forward(h, in.gpu_logits(4), shifted); }),
            "moekit::layer: out ([4, 264] bf16 cuda:0) must be hidden itself (in place) or share no byte with it; "
            "it starts 528 bytes after hidden");
}

TEST_F(GpuLayer, GraphCaptureReplaysWithNewData) {
  MOEKIT_REQUIRE_SM90();
  const LayerSpec s = reduced_spec(find_preset("deepseek-v3"));
  LayerData w(s, rng_);
  MoELayer gpu(s.experts, s.routing, s.quant, w.gpu, options("cuda_bf16", 256, &tuner_));
  MoELayer ref(s.experts, s.routing, s.quant, w.host, options("reference", 256, &tuner_));
  const int64_t t = 48;
  Inputs in(s, 256);
  in.refill(rng_, t);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  gpu.forward(in.gpu_hidden(t), in.gpu_logits(t), in.gpu_out(t), stream);  // looks the tactic choice up once
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  gpu.forward(in.gpu_hidden(t), in.gpu_logits(t), in.gpu_out(t), stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int replay = 0; replay < 3; ++replay) {
    in.refill(rng_, t);  // new routing and hidden states in the captured buffers
    in.poison_out(t);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_LE(relative_error(in.download_out(t), in.reference(ref, t)), 1e-2) << "replay " << replay;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST_F(GpuLayer, LifecycleOnTheGpu) {
  MOEKIT_REQUIRE_SM90();
  const LayerSpec s = reduced_spec(find_preset("qwen3-30b-a3b"));
  LayerData w(s, rng_);
  std::unique_ptr<Runner> r = make_runner("cuda_bf16");
  Inputs in(s, 128);
  in.refill(rng_, 16);
  const LayerInputs args{in.gpu_hidden(16), in.gpu_logits(16), in.gpu_out(16), {}};
  EXPECT_EQ(error_of<InvalidArgument>([&] {
              r->execute(args, {0, 0});
            }),
            "moekit::layer: runner 'cuda_bf16': execute() called before check_support()");

  Support cpu = r->check_support(s, Device::cpu());
  EXPECT_FALSE(cpu.ok);
  EXPECT_EQ(cpu.reason, "runs on CUDA devices only (device cpu)");
  LayerSpec fp8 = s;
  fp8.quant.weight_format = WeightFormat::fp8_e4m3_block;
  Support f = r->check_support(fp8, Device::cuda(0));
  EXPECT_FALSE(f.ok);
  EXPECT_EQ(f.reason, "weight_format (fp8_e4m3_block) is not supported (bf16 only)");
  EXPECT_EQ(error_of<NotSupported>([&] { r->build(w.gpu, 16); }),
            "moekit::layer: runner 'cuda_bf16': build() called after check_support() failed (weight_format "
            "(fp8_e4m3_block) is not supported (bf16 only))");
  Support ok = r->check_support(s, Device::cuda(0));
  ASSERT_TRUE(ok.ok) << ok.reason;
  EXPECT_EQ(error_of<InvalidArgument>([&] {
              r->execute(args, {0, 0});
            }),
            "moekit::layer: runner 'cuda_bf16': execute() called before build()");
  EXPECT_EQ(error_of<InvalidArgument>([&] {
              r->time_tactics({0, 0}, 1);
            }),
            "moekit::layer: runner 'cuda_bf16': time_tactics() called before build()");
  EXPECT_EQ(error_of<InvalidArgument>([&] { r->build(w.host, 16); }).rfind("moekit::", 0), 0u);  // host weights

  // A graph captured after the first build must still run after an identical build(): nothing was reallocated.
  MoELayer ref(s.experts, s.routing, s.quant, w.host, options("reference", 128, &tuner_));
  r->build(w.gpu, 16);
  const TacticPair pair = r->default_tactics(16);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  r->execute(args, pair, stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  r->build(w.gpu, 16);
  in.poison_out(16);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_LE(relative_error(in.download_out(16), in.reference(ref, 16)), 1e-2);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);

  // More tokens than built for is an error; a rebuild for more tokens serves them.
  in.refill(rng_, 128);
  const LayerInputs big{in.gpu_hidden(128), in.gpu_logits(128), in.gpu_out(128), {}};
  EXPECT_EQ(error_of<InvalidArgument>([&] { r->execute(big, pair); }),
            "moekit::layer: tokens (128) must be <= max_tokens (16)");
  r->build(w.gpu, 128);
  in.poison_out(128);
  r->execute(big, r->default_tactics(128));
  EXPECT_LE(relative_error(in.download_out(128), in.reference(ref, 128)), 1e-2);
  EXPECT_EQ(error_of<InvalidArgument>([&] {
              r->execute(big, {0, 99});
            }),
            "moekit::layer: runner 'cuda_bf16': tactics.gemm2 (99) must be in [0, " +
                std::to_string(cuda_expert_gemm_tactics().size()) + ")");
  EXPECT_GT(r->time_tactics(pair, 64), 0.0);

  // Rows that do not start on 16 bytes are refused before route() writes anything: the replay rows stay as they
  // were. (bf16 rows 2 bytes in are valid views with elements aligned to their size.)
  DeviceBuffer replay_buf(16 * s.routing.top_k * 2);
  const std::vector<int16_t> marks(static_cast<size_t>(16 * s.routing.top_k), int16_t{-7});
  replay_buf.upload(marks.data(), marks.size() * 2);
  const TensorView replay =
      TensorView::contiguous(replay_buf.data(), DType::i16, {16, s.routing.top_k}, Device::cuda(0));
  char* shifted = static_cast<char*>(in.gpu_hidden(16).data) + 2;
  LayerInputs misaligned{TensorView::contiguous(shifted, DType::bf16, {15, s.experts.hidden}, Device::cuda(0)),
                         in.gpu_logits(15), in.gpu_out(15), replay};
  auto refusal = [](const char* name, const void* p) {  // the library formats the address as fmt's {:#x}
    char address[32];
    std::snprintf(address, sizeof address, "%#llx", static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(p)));
    return std::string("moekit::layer: ") + name + ".data (" + address +
           ") must be 16-byte aligned (runner 'cuda_bf16')";
  };
  EXPECT_EQ(error_of<InvalidArgument>([&] { r->execute(misaligned, pair); }), refusal("hidden", shifted));
  char* shifted_out = static_cast<char*>(in.gpu_out(16).data) + 2;
  misaligned.hidden = in.gpu_hidden(15);
  misaligned.out = TensorView::contiguous(shifted_out, DType::bf16, {15, s.experts.hidden}, Device::cuda(0));
  EXPECT_EQ(error_of<InvalidArgument>([&] { r->execute(misaligned, pair); }), refusal("out", shifted_out));
  std::vector<int16_t> after(marks.size());
  replay_buf.download(after.data(), after.size() * 2);
  EXPECT_EQ(after, marks);
}

TEST_F(GpuLayer, DefaultTacticsBeforeAndAfterBuildAgree) {
  MOEKIT_REQUIRE_SM90();
  for (const Preset& p : presets()) {
    const LayerSpec s = reduced_spec(p);
    LayerData w(s, rng_);
    std::unique_ptr<Runner> r = make_runner("cuda_bf16");
    ASSERT_TRUE(r->check_support(s, Device::cuda(0)).ok);
    std::vector<TacticPair> before;
    for (int64_t t = 1; t <= 20000; t += (t < 300 ? 1 : 37)) before.push_back(r->default_tactics(t));
    r->build(w.gpu, 8);
    CudaExperts experts({s.experts, w.gpu.experts, 8, 64, Device::cuda(0)});
    size_t i = 0;
    for (int64_t t = 1; t <= 20000; t += (t < 300 ? 1 : 37), ++i) {
      const ExpertTactic want = experts.default_tactic(t);
      EXPECT_EQ(before[i], (TacticPair{want.gemm1, want.gemm2})) << p.name << " T=" << t;
      EXPECT_EQ(r->default_tactics(t), (TacticPair{want.gemm1, want.gemm2})) << p.name << " T=" << t;
    }
  }
}

TEST_F(GpuLayer, SyntheticWeightsEqualTheReferenceRunners) {
  MOEKIT_REQUIRE_SM90();
  // Same seed: the device fill must produce the reference runner's host weights, so both runners compute the same
  // layer on the same inputs.
  const LayerSpec s = reduced_spec(find_preset("gpt-oss-120b"));  // expert biases too
  std::unique_ptr<Runner> gpu = make_runner("cuda_bf16"), ref = make_runner("reference");
  ASSERT_TRUE(gpu->check_support(s, Device::cuda(0)).ok);
  ASSERT_TRUE(ref->check_support(s, Device::cpu()).ok);
  gpu->build_synthetic(64, 7);
  ref->build_synthetic(64, 7);
  Inputs in(s, 64);
  in.refill(rng_, 64);
  in.poison_out(64);
  gpu->execute({in.gpu_hidden(64), in.gpu_logits(64), in.gpu_out(64), {}}, gpu->default_tactics(64));
  std::vector<uint16_t> want(static_cast<size_t>(64 * s.experts.hidden));
  ref->execute({TensorView::contiguous(in.hidden.data(), DType::bf16, {64, s.experts.hidden}),
                TensorView::contiguous(in.logits.data(), DType::f32, {64, s.routing.num_experts}),
                TensorView::contiguous(want.data(), DType::bf16, {64, s.experts.hidden}),
                {}},
               {0, 0});
  EXPECT_LE(relative_error(in.download_out(64), want), 1e-2);
}

TEST_F(GpuLayer, TuningScopeTunesTheGpuRunnerIntoTheCache) {
  MOEKIT_REQUIRE_SM90();
  const LayerSpec s = reduced_spec(find_preset("qwen3-30b-a3b"));
  LayerData w(s, rng_);
  MoELayer gpu(s.experts, s.routing, s.quant, w.gpu, options("cuda_bf16", 512, &tuner_));
  MoELayer ref(s.experts, s.routing, s.quant, w.host, options("reference", 512, &tuner_));
  const int64_t t = 50;  // bucket 64
  Inputs in(s, 512);
  in.refill(rng_, t);
  EXPECT_FALSE(gpu.choice(t).tuned);
  gpu.forward(in.gpu_hidden(t), in.gpu_logits(t), in.gpu_out(t));  // outside a scope: nothing is timed
  EXPECT_EQ(tuner_.size(), 0u);
  {
    TuningScope scope;
    in.poison_out(t);
    gpu.forward(in.gpu_hidden(t), in.gpu_logits(t), in.gpu_out(t));
  }
  EXPECT_LE(relative_error(in.download_out(t), in.reference(ref, t)), 1e-2);
  ASSERT_EQ(tuner_.size(), 1u);
  const std::string key = tuning_key(gpu.runner(), gpu.spec(), t);
  EXPECT_NE(key.find("runner=cuda_bf16@" + std::string(gpu.runner().version()) + " "), std::string::npos) << key;
  EXPECT_NE(key.find(" T=64"), std::string::npos) << key;
  const std::optional<TuningEntry> e = tuner_.find(key);
  ASSERT_TRUE(e.has_value());
  EXPECT_GT(e->seconds, 0.0);
  EXPECT_GT(e->default_seconds, 0.0);
  EXPECT_EQ(e->tokens, 64);
  EXPECT_EQ(e->gemm1_shortlist.size(), 2u);
  EXPECT_EQ(e->gemm2_shortlist.size(), 2u);
  const TacticChoice c = gpu.choice(t);
  EXPECT_TRUE(c.tuned);
  EXPECT_EQ(gpu.runner().gemm1_tactics()[c.tactics.gemm1].name, e->gemm1);
  EXPECT_EQ(gpu.runner().gemm2_tactics()[c.tactics.gemm2].name, e->gemm2);

  // The entry persists and reloads into a fresh tuner.
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("moekit_layer_test_" + std::to_string(test_seed()) + ".json");
  tuner_.save(path);
  Autotuner again{CacheMetadata::current()};
  EXPECT_EQ(again.load(path).loaded, 1u);
  EXPECT_EQ(again.find(key), e);
  std::filesystem::remove(path);
  std::filesystem::remove(path.string() + ".lock");
}

// A forward() that would tune while its stream captures a graph throws before it issues anything, so the caller's
// capture ends cleanly (an empty graph); warmed up eagerly in the scope, the bucket then captures and replays.
TEST_F(GpuLayer, TuningInsideACaptureIsRefusedAndLeavesTheCaptureIntact) {
  MOEKIT_REQUIRE_SM90();
  const LayerSpec s = reduced_spec(find_preset("qwen3-30b-a3b"));
  LayerData w(s, rng_);
  MoELayer gpu(s.experts, s.routing, s.quant, w.gpu, options("cuda_bf16", 64, &tuner_));
  MoELayer ref(s.experts, s.routing, s.quant, w.host, options("reference", 64, &tuner_));
  const int64_t t = 20;  // bucket 32
  Inputs in(s, 64);
  in.refill(rng_, t);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  cudaGraph_t graph = nullptr;
  {
    TuningScope scope;  // ends before the reference layer runs, which would tune on the CPU otherwise
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
    EXPECT_EQ(
        error_of([&] { gpu.forward(in.gpu_hidden(t), in.gpu_logits(t), in.gpu_out(t), stream); }),
        "moekit::layer: forward() of 20 tokens must not tune inside a CUDA-graph capture: bucket 32 has no tuned "
        "entry and a TuningScope is active; run forward() once before capturing (inside the scope: it tunes the "
        "bucket), or capture outside the scope");
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    size_t nodes = 1;
    ASSERT_EQ(cudaGraphGetNodes(graph, nullptr, &nodes), cudaSuccess);
    EXPECT_EQ(nodes, 0u);
    cudaGraphDestroy(graph);
    EXPECT_EQ(tuner_.size(), 0u);

    gpu.forward(in.gpu_hidden(t), in.gpu_logits(t), in.gpu_out(t), stream);  // tunes bucket 32
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(tuner_.size(), 1u);
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
    gpu.forward(in.gpu_hidden(t), in.gpu_logits(t), in.gpu_out(t), stream);
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  }
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  in.refill(rng_, t);
  in.poison_out(t);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_LE(relative_error(in.download_out(t), in.reference(ref, t)), 1e-2);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST_F(GpuLayer, TimingLogitsAreCopiedRowByRowInCycles) {
  MOEKIT_REQUIRE_SM90();
  // n source rows of `width` bytes, `pitch` bytes apart, into `rows` packed rows: dst row r = src row r mod n.
  for (const auto& [n, rows, width, pitch] :
       {std::array<int64_t, 4>{3, 11, 20, 28}, {1, 16, 8, 8}, {5, 5, 12, 16}, {4, 1000, 64, 64}, {7, 9, 4, 12}}) {
    std::vector<uint8_t> src(static_cast<size_t>(n * pitch));
    for (uint8_t& b : src) b = static_cast<uint8_t>(rng_());
    DeviceBuffer d_src(src.size()), d_dst(static_cast<size_t>(rows * width));
    d_src.upload(src.data(), src.size());
    const std::vector<uint8_t> poison(static_cast<size_t>(rows * width), 0xAB);
    d_dst.upload(poison.data(), poison.size());
    detail::cycle_rows_device(d_dst.data(), rows, d_src.data(), n, width, pitch, nullptr);
    std::vector<uint8_t> got(static_cast<size_t>(rows * width));
    device_synchronize();
    d_dst.download(got.data(), got.size());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t b = 0; b < width; ++b)
        ASSERT_EQ(got[r * width + b], src[(r % n) * pitch + b]) << "n=" << n << " rows=" << rows << " row " << r;
  }
}

TEST_F(GpuLayer, TunesOnGivenLogits) {
  MOEKIT_REQUIRE_SM90();
  const LayerSpec s = reduced_spec(find_preset("mixtral-8x7b"));
  const int64_t e = s.routing.num_experts;
  LayerData w(s, rng_);
  std::unique_ptr<Runner> r = make_runner("cuda_bf16");
  ASSERT_TRUE(r->check_support(s, Device::cuda(0)).ok);
  r->build(w.gpu, 256);
  // Three bf16 rows, 2E apart, that send every token to experts 0 and 1: fewer rows than the timed tokens.
  std::vector<uint16_t> rows(static_cast<size_t>(3 * 2 * e), float_to_bf16(-4.0f));
  for (int row = 0; row < 3; ++row) rows[row * 2 * e] = rows[row * 2 * e + 1] = float_to_bf16(4.0f);
  DeviceBuffer d_rows(rows.size() * 2);
  d_rows.upload(rows.data(), rows.size() * 2);
  TensorView hot = TensorView::contiguous(d_rows.data(), DType::bf16, {3, e}, Device::cuda(0));
  hot.strides[0] = 2 * e;
  const int64_t tokens[] = {256, 16};
  const std::vector<TuneResult> res = tuner_.tune(*r, s, tokens, {.logits = hot});
  ASSERT_EQ(res.size(), 2u);
  for (const TuneResult& t : res) {
    EXPECT_EQ(t.entry.routing, "given");
    EXPECT_GT(t.timed_configs, 0);
    EXPECT_GT(t.entry.seconds, 0.0);
    EXPECT_GT(t.entry.default_seconds, 0.0);
  }
  // Host logits are not the runner's device; the runner still runs on its synthetic logits afterwards.
  std::vector<float> host(static_cast<size_t>(e), 0.0f);
  EXPECT_EQ(error_of<InvalidArgument>([&] {
              r->set_timing_logits(TensorView::contiguous(host.data(), DType::f32, {1, e}));
            }),
            "moekit::route: logits.device (cpu) must be the routing device (cuda:0)");
  EXPECT_GT(r->time_tactics(r->default_tactics(256), 256), 0.0);
  r->set_timing_logits(hot);
  EXPECT_GT(r->time_tactics(r->default_tactics(64), 64), 0.0);
  r->set_timing_logits({});
  EXPECT_GT(r->time_tactics(r->default_tactics(64), 64), 0.0);
}

TEST_F(GpuLayer, TimesEveryEntryOfASchedule) {
  MOEKIT_REQUIRE_SM90();
  const LayerSpec s = reduced_spec(find_preset("mixtral-8x7b"));
  LayerData w(s, rng_);
  std::unique_ptr<Runner> r = make_runner("cuda_bf16");
  ASSERT_TRUE(r->check_support(s, Device::cuda(0)).ok);
  r->build(w.gpu, 256);
  const int n = static_cast<int>(r->gemm1_tactics().size());
  for (int64_t t : {1, 64, 256}) {
    const TacticPair def = r->default_tactics(t);
    // Repeated pairs; the GEMV and grouped tiles at every T, up to max_tokens.
    const std::vector<TacticPair> order{def, {0, 0}, def, {3, 3}, {n - 1, n - 1}, {0, 0}, def};
    size_t ticks = 0;
    const std::vector<double> seconds = r->time_schedule(order, t, [&] { ++ticks; });
    ASSERT_EQ(seconds.size(), order.size()) << "T=" << t;
    EXPECT_EQ(ticks, order.size()) << "T=" << t;
    for (size_t i = 0; i < seconds.size(); ++i) {
      EXPECT_TRUE(std::isfinite(seconds[i])) << "T=" << t << " entry " << i;
      EXPECT_GT(seconds[i], 0.0) << "T=" << t << " entry " << i;
      EXPECT_LT(seconds[i], 1.0) << "T=" << t << " entry " << i;  // a reduced layer: milliseconds at most
    }
  }
  EXPECT_EQ(error_of<InvalidArgument>([&] {
              r->time_schedule(std::vector<TacticPair>{{0, 0}, {n, 0}}, 16);
            }),
            "moekit::layer: runner 'cuda_bf16': order[1] (" + std::to_string(n) + ", 0) must be in [0, " +
                std::to_string(n) + ") x [0, " + std::to_string(n) + ")");
  // The runner still runs correctly after its timings.
  MoELayer ref(s.experts, s.routing, s.quant, w.host, options("reference", 64, &tuner_));
  Inputs in(s, 64);
  in.refill(rng_, 7);
  in.poison_out(7);
  r->execute({in.gpu_hidden(7), in.gpu_logits(7), in.gpu_out(7), {}}, r->default_tactics(7), nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_LE(relative_error(in.download_out(7), in.reference(ref, 7)), 1e-2);
}

}  // namespace
}  // namespace moekit

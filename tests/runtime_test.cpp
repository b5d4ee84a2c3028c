// Runtime: the runner lifecycle and its error messages, the registry and backend selection, config validation in
// MoELayer, tactic choice and tuning scopes in forward(), and MoELayer on the reference runner against a direct
// computation of the layer written out in this file.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <utility>

#include "error_of.h"
#include "fake_runner.h"
#include "moekit/device.h"
#include "moekit/error.h"
#include "moekit/layer.h"
#include "moekit/plan.h"
#include "moekit/presets.h"
#include "moekit/routing.h"
#include "runtime/synthetic.h"
#include "tuner_test_util.h"

namespace moekit {
namespace {

using testing::FakeRunner;
using testing::FakeRunnerConfig;
using testing::small_spec;

using testing::error_of;

// Host bf16 weights for a spec, all zero (shapes are what matter to the lifecycle).
struct HostWeights {
  std::vector<uint16_t> w13, w2;
  LayerWeights views;
  explicit HostWeights(const LayerSpec& s) {
    const int64_t e = s.experts.weight_experts(), h = s.experts.hidden, i = s.experts.intermediate;
    w13.assign(static_cast<size_t>(e * 2 * i * h), 0);
    w2.assign(static_cast<size_t>(e * h * i), 0);
    views.experts.w13 = TensorView::contiguous(w13.data(), DType::bf16, {e, 2 * i, h});
    views.experts.w2 = TensorView::contiguous(w2.data(), DType::bf16, {e, h, i});
  }
};

// Inputs of T tokens for small_spec() (contents irrelevant to the fake runner).
struct HostInputs {
  std::vector<uint16_t> hidden, out;
  std::vector<float> logits;
  LayerInputs views;
  HostInputs(const LayerSpec& s, int64_t t) {
    const int64_t h = s.experts.hidden, e = s.routing.num_experts;
    hidden.assign(static_cast<size_t>(t * h), 0);
    out.assign(static_cast<size_t>(std::max<int64_t>(t, 1) * h), 0);
    logits.assign(static_cast<size_t>(t * e), 0.0f);
    views.hidden = TensorView::contiguous(hidden.data(), DType::bf16, {t, h});
    views.out = TensorView::contiguous(out.data(), DType::bf16, {t, h});
    views.logits = TensorView::contiguous(logits.data(), DType::f32, {t, e});
  }
};

// ---- lifecycle
// ------------------------------------------------------------------------------------------------------

TEST(Lifecycle, OutOfOrderStepsNameTheRunnerAndTheMissingStep) {
  const LayerSpec spec = small_spec();
  HostWeights w(spec);
  HostInputs in(spec, 2);
  FakeRunner r;
  EXPECT_EQ(error_of<InvalidArgument>([&] { r.execute(in.views, {}); }),
            "moekit::layer: runner 'fake': execute() called before check_support()");
  EXPECT_EQ(error_of<InvalidArgument>([&] { r.build(w.views, 8); }),
            "moekit::layer: runner 'fake': build() called before check_support()");
  EXPECT_EQ(error_of<InvalidArgument>([&] { r.default_tactics(8); }),
            "moekit::layer: runner 'fake': default_tactics() called before check_support()");
  ASSERT_TRUE(r.check_support(spec, Device::cpu()).ok);
  EXPECT_EQ(error_of<InvalidArgument>([&] { r.execute(in.views, {}); }),
            "moekit::layer: runner 'fake': execute() called before build()");
  EXPECT_EQ(error_of<InvalidArgument>([&] { r.time_tactics({}, 1); }),
            "moekit::layer: runner 'fake': time_tactics() called before build()");
  r.build(w.views, 8);
  r.execute(in.views, {1, 2});
  ASSERT_EQ(r.executed.size(), 1u);
  EXPECT_EQ(r.executed[0], (TacticPair{1, 2}));
  // A new check undoes the build.
  ASSERT_TRUE(r.check_support(spec, Device::cpu()).ok);
  EXPECT_EQ(error_of<InvalidArgument>([&] { r.execute(in.views, {}); }),
            "moekit::layer: runner 'fake': execute() called before build()");
}

TEST(Lifecycle, BuildAfterAFailedCheckIsNotSupported) {
  FakeRunner r({.decline = "needs a GPU"});
  Support s = r.check_support(small_spec(), Device::cpu());
  EXPECT_FALSE(s.ok);
  EXPECT_EQ(s.reason, "needs a GPU");
  HostWeights w(small_spec());
  EXPECT_EQ(error_of<NotSupported>([&] { r.build(w.views, 8); }),
            "moekit::layer: runner 'fake': build() called after check_support() failed (needs a GPU)");
  EXPECT_EQ(error_of<NotSupported>([&] { r.build_synthetic(8); }),
            "moekit::layer: runner 'fake': build_synthetic() called after check_support() failed (needs a GPU)");
}

TEST(Lifecycle, TacticNamesMustBeDistinctAndTimingsPositive) {
  // The tuning cache stores tactics by name: a runner whose names are empty or repeated is a runner bug.
  FakeRunner unnamed({.names1 = {"a", ""}});
  EXPECT_EQ(error_of<Internal>([&] { unnamed.check_support(small_spec(), Device::cpu()); }),
            "moekit::layer: runner 'fake': GEMM1 tactic 1 has no name");
  FakeRunner repeated({.names1 = {"a", "b", "a"}});
  EXPECT_EQ(error_of<Internal>([&] { repeated.check_support(small_spec(), Device::cpu()); }),
            "moekit::layer: runner 'fake': GEMM1 tactics 0 and 2 share the name 'a'");
  // A timing the tuner cannot compare or persist is the runner's error, not a result.
  for (double bad : {0.0, -1.0, std::nan("")}) {
    FakeRunner r({.cost = [bad](TacticPair) { return bad; }});
    ASSERT_TRUE(r.check_support(small_spec(), Device::cpu()).ok);
    r.build_synthetic(8);
    EXPECT_EQ(error_of<Internal>([&] {
                r.time_tactics({1, 2}, 4);
              }),
              fmt::format("moekit::layer: runner 'fake': timing tactics (1, 2) on 4 tokens gave {} seconds, which "
                          "must be finite and > 0",
                          bad));
  }
}

TEST(Lifecycle, ATimeScheduleTimesEveryEntryInOrderAndChecksItsArguments) {
  FakeRunner r;  // cost 1 + gemm1 + gemm2
  const std::vector<TacticPair> order{{1, 0}, {0, 2}, {1, 0}};
  ASSERT_TRUE(r.check_support(small_spec(), Device::cpu()).ok);
  EXPECT_EQ(error_of<InvalidArgument>([&] { r.time_schedule(order, 4); }),
            "moekit::layer: runner 'fake': time_schedule() called before build()");
  r.build_synthetic(8);
  std::vector<size_t> timed_before;  // how many entries the runner had timed at each on_timed call
  EXPECT_EQ(r.time_schedule(order, 4, [&] { timed_before.push_back(r.timed.size()); }),
            (std::vector<double>{2.0, 3.0, 2.0}));
  EXPECT_EQ(timed_before, (std::vector<size_t>{1, 2, 3}));
  EXPECT_EQ(r.timed, order);
  EXPECT_EQ(r.timed_tokens, (std::vector<int64_t>{4, 4, 4}));
  EXPECT_EQ(r.schedules, (std::vector<size_t>{3}));
  EXPECT_TRUE(r.time_schedule({}, 4).empty());  // nothing to time: the runner is not asked
  EXPECT_EQ(error_of<InvalidArgument>([&] {
              r.time_schedule(std::vector<TacticPair>{{0, 0}, {0, 3}}, 4);
            }),
            "moekit::layer: runner 'fake': order[1] (0, 3) must be in [0, 3) x [0, 3)");
  EXPECT_EQ(error_of<InvalidArgument>([&] { r.time_schedule(order, 9); }),
            "moekit::layer: runner 'fake': tokens (9) must be in [1, max_tokens (8)]");
  EXPECT_EQ(r.schedules.size(), 1u);  // a rejected order times nothing
  // What the runner returns must be one finite, positive time per entry.
  FakeRunner shorter({.drop_last_timing = true});
  ASSERT_TRUE(shorter.check_support(small_spec(), Device::cpu()).ok);
  shorter.build_synthetic(8);
  EXPECT_EQ(error_of<Internal>([&] { shorter.time_schedule(order, 4); }),
            "moekit::layer: runner 'fake': timing a schedule of 3 entries gave 2 timings");
  FakeRunner zero({.cost = [](TacticPair p) { return p.gemm2 == 2 ? 0.0 : 1.0; }});
  ASSERT_TRUE(zero.check_support(small_spec(), Device::cpu()).ok);
  zero.build_synthetic(8);
  EXPECT_EQ(error_of<Internal>([&] { zero.time_schedule(order, 4); }),
            "moekit::layer: runner 'fake': timing order[1] (0, 2) on 4 tokens gave 0 seconds, which must be finite "
            "and > 0");
}

TEST(Lifecycle, ReferenceRunnerNamesItself) {
  std::unique_ptr<Runner> r = make_runner("reference");
  ASSERT_TRUE(r->check_support(small_spec(), Device::cpu()).ok);
  HostInputs in(small_spec(), 2);
  EXPECT_EQ(error_of<InvalidArgument>([&] { r->execute(in.views, {}); }),
            "moekit::layer: runner 'reference': execute() called before build()");
  EXPECT_EQ(r->gemm1_tactics().size(), 1u);
  EXPECT_EQ(r->gemm2_tactics().size(), 1u);
  EXPECT_EQ(r->check_support(small_spec(), Device::cuda(0)).reason, "runs on the CPU only (device cuda:0)");
}

TEST(Lifecycle, BuildIsIdempotent) {
  const LayerSpec spec = small_spec();
  HostWeights w(spec);
  FakeRunner r;
  ASSERT_TRUE(r.check_support(spec, Device::cpu()).ok);
  r.build(w.views, 8);
  r.build(w.views, 8);
  EXPECT_EQ(r.builds, 1);
  r.build(w.views, 16);  // a larger workspace is a real rebuild
  EXPECT_EQ(r.builds, 2);
  EXPECT_EQ(r.max_tokens(), 16);
}

TEST(Lifecycle, ChecksArgumentsOfEveryStep) {
  const LayerSpec spec = small_spec();
  HostWeights w(spec);
  FakeRunner r;
  LayerSpec bad = spec;
  bad.experts.top_k = bad.routing.top_k = 9;
  EXPECT_EQ(error_of<InvalidArgument>([&] { r.check_support(bad, Device::cpu()); }),
            "moekit::experts: top_k (9) must be <= num_experts (8)");
  ASSERT_TRUE(r.check_support(spec, Device::cpu()).ok);
  EXPECT_EQ(error_of<InvalidArgument>([&] { r.build(w.views, 0); }), "moekit::layer: max_tokens (0) must be >= 1");
  std::vector<float> b13(static_cast<size_t>(8 * 16), 0.0f);
  LayerWeights with_bias = w.views;
  with_bias.experts.b13 = TensorView::contiguous(b13.data(), DType::f32, {8, 16});
  EXPECT_EQ(error_of<InvalidArgument>([&] { r.build(with_bias, 8); }),
            "moekit::layer: expert biases present in the weights (true) must match spec.expert_biases (false)");
  r.build(w.views, 4);
  HostInputs in(spec, 2);
  EXPECT_EQ(error_of<InvalidArgument>([&] {
              r.execute(in.views, {3, 0});
            }),
            "moekit::layer: runner 'fake': tactics.gemm1 (3) must be in [0, 3)");
  EXPECT_EQ(error_of<InvalidArgument>([&] {
              r.execute(in.views, {0, -1});
            }),
            "moekit::layer: runner 'fake': tactics.gemm2 (-1) must be in [0, 3)");
  HostInputs five(spec, 5);
  EXPECT_EQ(error_of<InvalidArgument>([&] { r.execute(five.views, {}); }),
            "moekit::layer: tokens (5) must be <= max_tokens (4)");
  EXPECT_EQ(error_of<InvalidArgument>([&] { r.time_tactics({}, 5); }),
            "moekit::layer: runner 'fake': tokens (5) must be in [1, max_tokens (4)]");
  HostInputs none(spec, 0);
  r.execute(none.views, {});  // T = 0 does nothing
  EXPECT_TRUE(r.executed.empty());
}

TEST(Lifecycle, ChecksTheRoutingBiasAgainstTheSpec) {
  LayerSpec spec = small_spec();
  HostWeights w(spec);
  std::vector<float> bias(16, 0.0f);
  FakeRunner r;
  ASSERT_TRUE(r.check_support(spec, Device::cpu()).ok);
  LayerWeights with = w.views;
  with.routing_bias = TensorView::contiguous(bias.data(), DType::f32, {8});
  EXPECT_EQ(error_of<InvalidArgument>([&] { r.build(with, 4); }),
            "moekit::layer: routing_bias present in the weights (true) must match spec.routing_bias (false)");
  spec.routing_bias = true;
  ASSERT_TRUE(r.check_support(spec, Device::cpu()).ok);
  EXPECT_EQ(error_of<InvalidArgument>([&] { r.build(w.views, 4); }),
            "moekit::layer: routing_bias present in the weights (false) must match spec.routing_bias (true)");
  LayerWeights bad = with;
  bad.routing_bias = TensorView::contiguous(bias.data(), DType::f32, {4});
  EXPECT_EQ(error_of<InvalidArgument>([&] { r.build(bad, 4); }),
            "moekit::layer: routing_bias must be a 1-D [E] fp32 or bf16 tensor with E = num_experts (8), got [4] "
            "fp32 cpu");
  bad.routing_bias = TensorView::contiguous(bias.data(), DType::i32, {8});
  EXPECT_EQ(error_of<InvalidArgument>([&] { r.build(bad, 4); }),
            "moekit::layer: routing_bias must be a 1-D [E] fp32 or bf16 tensor with E = num_experts (8), got [8] "
            "int32 cpu");
  bad.routing_bias = TensorView::contiguous(bias.data(), DType::f32, {8});
  bad.routing_bias.strides[0] = 2;
  EXPECT_EQ(error_of<InvalidArgument>([&] { r.build(bad, 4); }),
            "moekit::layer: routing_bias ([8] fp32 cpu) must be contiguous");
  bad.routing_bias = TensorView::contiguous(bias.data(), DType::f32, {8}, Device::cuda(0));
  EXPECT_EQ(error_of<InvalidArgument>([&] { r.build(bad, 4); }),
            "moekit::layer: routing_bias.device (cuda:0) must be the layer device (cpu)");
  bad.routing_bias = TensorView::contiguous(nullptr, DType::f32, {8});
  EXPECT_EQ(error_of<InvalidArgument>([&] { r.build(bad, 4); }),
            "moekit::layer: routing_bias.data (null) must be non-null");
  char* misaligned = reinterpret_cast<char*>(bias.data()) + 2;
  bad.routing_bias = TensorView::contiguous(misaligned, DType::f32, {8});
  EXPECT_EQ(error_of<InvalidArgument>([&] { r.build(bad, 4); }),
            fmt::format("moekit::layer: routing_bias.data ({:#x}) must be 4-byte aligned (its fp32 elements)",
                        reinterpret_cast<uintptr_t>(misaligned)));
  EXPECT_EQ(r.builds, 0);
  r.build(with, 4);
  EXPECT_EQ(r.builds, 1);
}

TEST(Lifecycle, ChecksTheRowsOfEveryCall) {
  const LayerSpec spec = small_spec();
  HostWeights w(spec);
  FakeRunner r;
  ASSERT_TRUE(r.check_support(spec, Device::cpu()).ok);
  r.build(w.views, 4);
  HostInputs in(spec, 2);
  LayerInputs bad = in.views;
  bad.hidden = TensorView{};
  EXPECT_EQ(error_of<InvalidArgument>([&] { r.execute(bad, {}); }),
            "moekit::layer: hidden must be a 2-D [T, H] bf16 tensor, got none");
  bad.hidden = TensorView::contiguous(in.hidden.data(), DType::bf16, {2, 4, 4});
  EXPECT_EQ(error_of<InvalidArgument>([&] { r.execute(bad, {}); }),
            "moekit::layer: hidden must be a 2-D [T, H] bf16 tensor, got [2, 4, 4] bf16 cpu");
  bad.hidden = TensorView::contiguous(in.hidden.data(), DType::f32, {2, 16});
  EXPECT_EQ(error_of<InvalidArgument>([&] { r.execute(bad, {}); }),
            "moekit::layer: hidden must be a 2-D [T, H] bf16 tensor, got [2, 16] fp32 cpu");
  bad.hidden = TensorView::contiguous(in.hidden.data(), DType::bf16, {2, 8});
  EXPECT_EQ(error_of<InvalidArgument>([&] { r.execute(bad, {}); }),
            "moekit::layer: hidden shape ([2, 8]) must be [T, H] = [2, 16]");
  bad.hidden = TensorView::contiguous(in.hidden.data(), DType::bf16, {2, 16}, Device::cuda(0));
  EXPECT_EQ(error_of<InvalidArgument>([&] { r.execute(bad, {}); }),
            "moekit::layer: hidden.device (cuda:0) must be the layer device (cpu)");
  bad = in.views;
  bad.out = TensorView::contiguous(in.out.data(), DType::bf16, {3, 16});
  EXPECT_EQ(error_of<InvalidArgument>([&] { r.execute(bad, {}); }),
            "moekit::layer: out shape ([3, 16]) must be [T, H] = [2, 16]");
  bad.out = TensorView::contiguous(in.out.data(), DType::bf16, {2, 16});
  bad.out.strides[0] = 32;
  EXPECT_EQ(error_of<InvalidArgument>([&] { r.execute(bad, {}); }),
            "moekit::layer: out ([2, 16] bf16 cpu) must be contiguous");
  bad.out = TensorView::contiguous(nullptr, DType::bf16, {2, 16});
  EXPECT_EQ(error_of<InvalidArgument>([&] { r.execute(bad, {}); }),
            "moekit::layer: out.data (null) must be non-null");
  HostInputs three(spec, 3);
  bad = in.views;
  bad.logits = three.views.logits;
  EXPECT_EQ(error_of<InvalidArgument>([&] { r.execute(bad, {}); }),
            "moekit::layer: logits.shape[0] (3) must equal hidden.shape[0] (2)");
  EXPECT_TRUE(r.executed.empty());
  r.execute(in.views, {});
  EXPECT_EQ(r.executed.size(), 1u);
}

TEST(Lifecycle, ABrokenRunnerIsAnInternalErrorNamingIt) {
  const LayerSpec spec = small_spec();
  FakeRunner silent({.name = "silent", .decline_silently = true});
  EXPECT_EQ(error_of<Internal>([&] { silent.check_support(spec, Device::cpu()); }),
            "moekit::layer: runner 'silent' declined the layer without a reason");
  FakeRunner empty({.name = "empty", .n2 = 0});
  EXPECT_EQ(error_of<Internal>([&] { empty.check_support(spec, Device::cpu()); }),
            "moekit::layer: runner 'empty' supports the layer but lists no tactics (3 GEMM1, 0 GEMM2)");
  FakeRunner stray({.name = "stray", .default_pair = {0, 3}});
  ASSERT_TRUE(stray.check_support(spec, Device::cpu()).ok);
  EXPECT_EQ(error_of<Internal>([&] { stray.default_tactics(1); }),
            "moekit::layer: runner 'stray': default tactics (0, 3) are out of range");
  HostWeights w(spec);
  stray.build(w.views, 4);
  EXPECT_EQ(error_of<InvalidArgument>([&] {
              stray.time_tactics({3, 0}, 1);
            }),
            "moekit::layer: runner 'stray': tactics (3, 0) must be in [0, 3) x [0, 3)");
  EXPECT_TRUE(stray.timed.empty());
}

// ---- registry and selection
// ----------------------------------------------------------------------------------------

TEST(Registry, ReferenceIsAlwaysThereAndLast) {
  std::vector<std::string> names = registered_runners();
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(names.back(), "reference");
  register_cuda_runners();
  register_cuda_runners();  // twice is harmless
  names = registered_runners();
  EXPECT_EQ(std::count(names.begin(), names.end(), "cuda_bf16"), 1);
  EXPECT_EQ(names.back(), "reference");
  // Preference order; a low preference still comes before the reference.
  register_runner({"fake_low", -5, [] {
                     return std::make_unique<FakeRunner>(
                         FakeRunnerConfig{.name = "fake_low", .decline = "declines in tests"});
                   }});
  register_runner({"fake_high", 50, [] {
                     return std::make_unique<FakeRunner>(
                         FakeRunnerConfig{.name = "fake_high", .decline = "declines in tests"});
                   }});
  names = registered_runners();
  auto pos = [&](const char* n) { return std::find(names.begin(), names.end(), n) - names.begin(); };
  EXPECT_LT(pos("cuda_bf16"), pos("fake_high"));
  EXPECT_LT(pos("fake_high"), pos("fake_low"));
  EXPECT_LT(pos("fake_low"), pos("reference"));
}

TEST(Registry, RejectsBadRegistrationsAndUnknownNames) {
  auto factory = [] { return std::make_unique<FakeRunner>(); };
  EXPECT_EQ(error_of<InvalidArgument>([&] {
              register_runner({"auto", 0, factory});
            }),
            "moekit::layer: runner name ('auto') is reserved");
  EXPECT_EQ(error_of<InvalidArgument>([&] {
              register_runner({"reference", 0, factory});
            }),
            "moekit::layer: runner name ('reference') is reserved");
  EXPECT_EQ(error_of<InvalidArgument>([&] {
              register_runner({"", 0, factory});
            }),
            "moekit::layer: runner name must not be empty");
  EXPECT_EQ(error_of<InvalidArgument>([&] {
              register_runner({"x", 0, nullptr});
            }),
            "moekit::layer: runner 'x' factory must not be empty");
  std::string names;
  for (const std::string& n : registered_runners()) names += (names.empty() ? "" : ", ") + n;
  EXPECT_EQ(error_of<InvalidArgument>([&] { make_runner("nope"); }),
            "moekit::layer: backend 'nope' must be 'auto' or a registered runner (" + names + ")");
  // A factory that makes a runner of another name is a bug in the registration.
  register_runner({"misnamed", 0, factory});
  EXPECT_EQ(error_of<Internal>([&] { make_runner("misnamed"); }),
            "moekit::layer: the factory of runner 'misnamed' made runner 'fake'");
  EXPECT_TRUE(unregister_runner("misnamed"));
  EXPECT_FALSE(unregister_runner("misnamed"));
  EXPECT_EQ(error_of<InvalidArgument>([&] { unregister_runner("reference"); }),
            "moekit::layer: runner 'reference' cannot be unregistered");
}

TEST(Registry, CudaRunnerSaysWhyItCannotRun) {
  register_cuda_runners();
  std::unique_ptr<Runner> r = make_runner("cuda_bf16");
  for (Device d : {Device::cpu(), Device::cuda(0)}) {
    Support s = r->check_support(small_spec(), d);
    if (d.is_cuda() && built_with_cuda() && device_is_sm90(0)) {
      EXPECT_TRUE(s.ok) << s.reason;  // the one case it serves
      continue;
    }
    EXPECT_FALSE(s.ok);
    if (!built_with_cuda())
      EXPECT_EQ(s.reason, "moekit was built without CUDA");
    else
      EXPECT_FALSE(s.reason.empty());
  }
}

TEST(Selection, NoBackendFitsListsEveryReason) {
  register_cuda_runners();
  LayerSpec spec = small_spec();
  spec.quant.weight_format = WeightFormat::fp8_e4m3_block;
  const std::vector<std::string> backends{"cuda_bf16", "reference"};
  const std::string msg = error_of<NotSupported>([&] { select_runner(spec, Device::cpu(), backends); });
  if (!built_with_cuda())
    EXPECT_EQ(msg,
              "moekit::layer: no backend supports this layer on cpu: cuda_bf16: moekit was built without "
              "CUDA; reference: weight_format (fp8_e4m3_block) is not supported (bf16 only)");
  else
    EXPECT_NE(msg.find("; reference: weight_format (fp8_e4m3_block) is not supported (bf16 only)"), std::string::npos)
        << msg;
  // "auto" tries every registered runner in order, repeats once, and stops at the first that fits.
  const std::vector<std::string> auto_twice{"auto", "reference", "auto"};
  RunnerSelection sel = select_runner(small_spec(), Device::cpu(), auto_twice);
  ASSERT_TRUE(sel.runner);
  EXPECT_EQ(sel.runner->name(), "reference");
  std::vector<std::string> tried;
  for (const BackendVerdict& v : sel.verdicts) tried.push_back(v.name);
  EXPECT_EQ(tried, registered_runners());  // none before the reference fits a CPU layer here
  EXPECT_EQ(error_of<InvalidArgument>([&] { select_runner(small_spec(), Device::cpu(), {}); }),
            "moekit::layer: backends must not be empty (use {\"auto\"})");
}

// ---- configs
// --------------------------------------------------------------------------------------------------------

TEST(QuantConfig, NamesAndRules) {
  for (WeightFormat f : {WeightFormat::bf16, WeightFormat::fp8_e4m3_block, WeightFormat::fp8_e4m3_tensor,
                         WeightFormat::fp8_e4m3_channel, WeightFormat::int4_group, WeightFormat::mxfp4})
    EXPECT_EQ(parse_weight_format(weight_format_name(f)), f);
  for (ActivationFormat f :
       {ActivationFormat::bf16, ActivationFormat::fp8_e4m3_token_block, ActivationFormat::fp8_e4m3_tensor})
    EXPECT_EQ(parse_activation_format(activation_format_name(f)), f);
  EXPECT_EQ(error_of<InvalidArgument>([] { parse_weight_format("fp4"); }),
            "moekit::quant: unknown weight_format 'fp4' (expected one of: bf16, fp8_e4m3_block, fp8_e4m3_tensor, "
            "fp8_e4m3_channel, int4_group, mxfp4)");
  QuantConfig q;
  q.validate();
  q.block_n = 100;
  EXPECT_EQ(error_of<InvalidArgument>([&] { q.validate(); }),
            "moekit::quant: block_n (100) must be a power of 2 in 16..1024");
  q = {};
  q.activation_format = ActivationFormat::fp8_e4m3_tensor;
  EXPECT_EQ(error_of<InvalidArgument>([&] { q.validate(); }),
            "moekit::quant: activation_format (fp8_e4m3_tensor) must be bf16 unless weight_format is fp8 "
            "(weight_format is bf16)");
  q.weight_format = WeightFormat::mxfp4;
  EXPECT_EQ(error_of<InvalidArgument>([&] { q.validate(); }),
            "moekit::quant: activation_format (fp8_e4m3_tensor) must be bf16 unless weight_format is fp8 "
            "(weight_format is mxfp4, a weight-only format)");
  q.weight_format = WeightFormat::fp8_e4m3_channel;
  q.validate();
  q = {};
  q.weight_format = static_cast<WeightFormat>(17);
  EXPECT_EQ(error_of<InvalidArgument>([&] { q.validate(); }),
            "moekit::quant: weight_format (17) must be a known weight format");
  q = {};
  q.activation_format = static_cast<ActivationFormat>(255);
  EXPECT_EQ(error_of<InvalidArgument>([&] { q.validate(); }),
            "moekit::quant: activation_format (255) must be a known activation format");
}

// A moved-from layer holds nothing: every call names that instead of dereferencing it; the layer it moved into runs.
TEST(MoELayerConfig, AMovedFromLayerRefusesEveryCall) {
  const LayerSpec spec = small_spec();
  HostWeights w(spec);
  HostInputs in(spec, 2);
  Autotuner tuner(CacheMetadata{"0.1.0", "cpu", 1, 0});
  MoELayer from(spec.experts, spec.routing, spec.quant, w.views,
                {.backends = {"reference"}, .max_tokens = 8, .tuner = &tuner});
  MoELayer to(std::move(from));
  const std::string moved = "moekit::layer: this MoELayer holds no runner (it was moved from)";
  EXPECT_EQ(error_of<InvalidArgument>([&] { from.forward(in.views.hidden, in.views.logits, in.views.out); }), moved);
  EXPECT_EQ(error_of<InvalidArgument>([&] { from.choice(2); }), moved);
  EXPECT_EQ(error_of<InvalidArgument>([&] { from.spec(); }), moved);
  EXPECT_EQ(error_of<InvalidArgument>([&] { from.runner(); }), moved);
  EXPECT_EQ(error_of<InvalidArgument>([&] { from.backend(); }), moved);
  EXPECT_EQ(error_of<InvalidArgument>([&] { from.verdicts(); }), moved);
  EXPECT_EQ(error_of<InvalidArgument>([&] { from.max_tokens(); }), moved);
  const int64_t tokens[] = {2};
  EXPECT_EQ(error_of<InvalidArgument>([&] { from.tune(tokens); }), moved);
  to.forward(in.views.hidden, in.views.logits, in.views.out);
  EXPECT_EQ(to.backend(), "reference");
  EXPECT_EQ(to.max_tokens(), 8);
  from = std::move(to);  // assigning to a moved-from layer makes it whole again
  EXPECT_EQ(from.backend(), "reference");
}

TEST(MoELayerConfig, ContractErrorsAreNeverHiddenByBackendFiltering) {
  LayerSpec spec = small_spec();
  HostWeights w(spec);
  const LayerOptions only_cuda{.backends = {"cuda_bf16"}, .max_tokens = 8};
  register_cuda_runners();
  ExpertConfig bad = spec.experts;
  bad.top_k = 9;
  RoutingConfig bad_routing = spec.routing;
  bad_routing.top_k = 9;
  EXPECT_EQ(error_of<InvalidArgument>([&] { MoELayer l(bad, bad_routing, spec.quant, w.views, only_cuda); }),
            "moekit::experts: top_k (9) must be <= num_experts (8)");
  RoutingConfig other = spec.routing;
  other.num_experts = 16;
  EXPECT_EQ(error_of<InvalidArgument>([&] { MoELayer l(spec.experts, other, spec.quant, w.views, only_cuda); }),
            "moekit::layer: routing num_experts (16) must equal the expert config's num_experts (8)");
  QuantConfig q;
  q.block_k = 3;
  EXPECT_EQ(error_of<InvalidArgument>([&] { MoELayer l(spec.experts, spec.routing, q, w.views, only_cuda); }),
            "moekit::quant: block_k (3) must be a power of 2 in 16..1024");
  LayerWeights short_w = w.views;
  short_w.experts.w2.shape[1] = 8;
  const std::string bad_weights =
      error_of<InvalidArgument>([&] { MoELayer l(spec.experts, spec.routing, spec.quant, short_w, only_cuda); });
  EXPECT_EQ(bad_weights.rfind("moekit::experts: w2 ", 0), 0u) << bad_weights;
  EXPECT_EQ(error_of<InvalidArgument>([&] {
              MoELayer l(spec.experts, spec.routing, spec.quant, w.views, {.backends = {"auto"}, .max_tokens = 0});
            }),
            "moekit::layer: max_tokens (0) must be in [1, 2147483647]");
  const std::string unknown = error_of<InvalidArgument>(
      [&] { MoELayer l(spec.experts, spec.routing, spec.quant, w.views, {.backends = {"cuda"}, .max_tokens = 8}); });
  EXPECT_EQ(unknown.rfind("moekit::layer: backend 'cuda' must be 'auto' or a registered runner (", 0), 0u) << unknown;
  // A valid layer no backend serves: NotSupported naming each backend.
  QuantConfig fp8;
  fp8.weight_format = WeightFormat::fp8_e4m3_block;
  const std::string none = error_of<NotSupported>(
      [&] { MoELayer l(spec.experts, spec.routing, fp8, w.views, {.backends = {"auto"}, .max_tokens = 8}); });
  EXPECT_EQ(none.rfind("moekit::layer: no backend supports this layer on cpu: ", 0), 0u) << none;
  for (const std::string& name : registered_runners()) EXPECT_NE(none.find(name + ": "), std::string::npos) << none;
}

// ---- MoELayer with a fake runner: tactic choice and tuning scopes
// --------------------------------------------------

constexpr const char* kLayerFake = "fake_layer";

void register_layer_fake() {
  register_runner({kLayerFake, 0, [] {
                     return std::make_unique<FakeRunner>(
                         FakeRunnerConfig{.name = kLayerFake, .default_pair = {2, 2}, .cost = [](TacticPair p) {
                                            return 10.0 - p.gemm1 - 2.0 * (p.gemm2 == 1);
                                          }});
                   }});
}

// A MoELayer for small_spec() on the fake layer runner, with a tuner of its own.
struct FakeLayer {
  LayerSpec spec = small_spec();
  HostWeights w{spec};
  Autotuner tuner{CacheMetadata{"0.1.0", "Test GPU", 1, 0}};
  MoELayer layer{make()};

  MoELayer make() {
    register_layer_fake();
    return MoELayer(spec.experts, spec.routing, spec.quant, w.views,
                    {.backends = {kLayerFake}, .max_tokens = 64, .tuner = &tuner});
  }
};

TEST(MoELayerTactics, ForwardRunsTheDefaultOutsideATuningScopeAndTunesInsideOne) {
  FakeLayer f;
  const LayerSpec& spec = f.spec;
  Autotuner& tuner = f.tuner;
  MoELayer& layer = f.layer;
  EXPECT_EQ(layer.backend(), kLayerFake);
  ASSERT_EQ(layer.verdicts().size(), 1u);
  EXPECT_TRUE(layer.verdicts()[0].support.ok);
  auto& fake = dynamic_cast<FakeRunner&>(layer.runner());
  auto run = [&](int64_t t) {
    HostInputs x(spec, t);
    layer.forward(x.views.hidden, x.views.logits, x.views.out);
    return TacticPair{static_cast<int>(x.out[0]), static_cast<int>(x.out[1])};
  };
  EXPECT_EQ(run(5), (TacticPair{2, 2}));  // the default heuristic
  EXPECT_TRUE(fake.timed.empty());
  {
    TuningScope scope;
    EXPECT_NE(TuningScope::active(), nullptr);
    EXPECT_EQ(run(5), (TacticPair{2, 1}));  // bucket 8 tuned first: cheapest GEMM1 is 2, GEMM2 is 1
    EXPECT_EQ(fake.timed.size(),
              22u);  // 3 + 3 in the stages, 3 rounds of the default and 4 shortlist pairs, the default
    EXPECT_EQ(run(7), (TacticPair{2, 1}));  // same bucket: no timing
    EXPECT_EQ(fake.timed.size(), 22u);
    run(9);  // bucket 16
    EXPECT_EQ(fake.timed.size(), 44u);
  }
  EXPECT_EQ(TuningScope::active(), nullptr);
  run(17);  // bucket 32: outside the scope, nothing is timed
  EXPECT_EQ(fake.timed.size(), 44u);
  EXPECT_FALSE(layer.choice(17).tuned);
  // A new cache entry reaches forward() (memoized choices are dropped when the tuner changes).
  tuner.insert(tuning_key(fake, spec, 8), {"g1_0", "g2_0", {"g1_0"}, {"g2_0"}, 1.0, 1.0, 8});
  EXPECT_EQ(run(6), (TacticPair{0, 0}));
  // Clearing the tuner drops every entry, and forward() is back on the default for every bucket.
  const uint64_t before_clear = tuner.generation();
  tuner.clear();
  EXPECT_EQ(tuner.size(), 0u);
  EXPECT_GT(tuner.generation(), before_clear);
  EXPECT_EQ(run(6), (TacticPair{2, 2}));
  EXPECT_EQ(run(9), (TacticPair{2, 2}));
  EXPECT_FALSE(layer.choice(9).tuned);
  // Explicit tuning through the layer.
  const int64_t tokens[] = {40};
  std::vector<TuneResult> res = layer.tune(tokens);
  EXPECT_EQ(res[0].bucket, 64);
  EXPECT_EQ(run(40), (TacticPair{2, 1}));
  EXPECT_EQ(layer.max_tokens(), 64);
}

// Inside a tuning scope an untuned bucket is tuned on the forward() call's own logits, or on the scope's where it
// names some; the runner is back on its synthetic logits afterwards.
TEST(MoELayerTactics, ATuningScopeTunesOnTheCallsLogitsUnlessItNamesSome) {
  FakeLayer f;
  const LayerSpec& spec = f.spec;
  Autotuner& tuner = f.tuner;
  MoELayer& layer = f.layer;
  auto& fake = dynamic_cast<FakeRunner&>(layer.runner());
  HostInputs x(spec, 5);
  {
    TuningScope scope;
    layer.forward(x.views.hidden, x.views.logits, x.views.out);
  }
  EXPECT_EQ(fake.timing_logits_sets, (std::vector<const void*>{x.views.logits.data, nullptr}));
  ASSERT_EQ(fake.timed_logits.size(), 22u);
  for (const void* p : fake.timed_logits) EXPECT_EQ(p, x.views.logits.data);
  EXPECT_EQ(tuner.find(tuning_key(fake, spec, 5))->routing, "given");

  std::vector<float> own(2 * 8, 1.0f);
  HostInputs y(spec, 9);  // bucket 16
  {
    TuningScope scope({.logits = TensorView::contiguous(own.data(), DType::f32, {2, 8})});
    layer.forward(y.views.hidden, y.views.logits, y.views.out);
  }
  EXPECT_EQ(fake.timing_logits_sets, (std::vector<const void*>{x.views.logits.data, nullptr, own.data(), nullptr}));
  EXPECT_EQ(fake.timing_logits, nullptr);
}

// Without a cache entry, or with one whose winner is the default where it was timed, the layer runs the runner's
// default for T itself, which may differ inside one bucket (T = 9 and 13 share bucket 16); a bucket whose winner is
// another pair runs that winner for every T.
TEST(MoELayerTactics, UntunedBucketsRunTheDefaultForEachTokenCount) {
  constexpr const char* kName = "fake_layer_by_tokens";
  register_runner({kName, 0, [] {
                     return std::make_unique<FakeRunner>(
                         FakeRunnerConfig{.name = kName, .default_for = [](int64_t t) {
                                            return TacticPair{t <= 12 ? 0 : 1, 2};
                                          }});
                   }});
  const LayerSpec spec = small_spec();
  HostWeights w(spec);
  Autotuner tuner(CacheMetadata{"0.1.0", "Test GPU", 1, 0});
  MoELayer layer(spec.experts, spec.routing, spec.quant, w.views,
                 {.backends = {kName}, .max_tokens = 64, .tuner = &tuner});
  auto run = [&](int64_t t) {
    HostInputs x(spec, t);
    layer.forward(x.views.hidden, x.views.logits, x.views.out);
    return TacticPair{static_cast<int>(x.out[0]), static_cast<int>(x.out[1])};
  };
  EXPECT_EQ(run(9), (TacticPair{0, 2}));
  EXPECT_EQ(run(13), (TacticPair{1, 2}));  // same bucket, memoized as untuned: still the default for 13
  EXPECT_EQ(run(12), (TacticPair{0, 2}));
  EXPECT_EQ(layer.choice(13).tactics, (TacticPair{1, 2}));
  EXPECT_FALSE(layer.choice(13).tuned);
  // An entry whose winner is the default where it was timed (T = 16) confirms the heuristic: still per T.
  tuner.insert(tuning_key(layer.runner(), spec, 16), {"g1_1", "g2_2", {"g1_1"}, {"g2_2"}, 1.0, 1.0, 16});
  EXPECT_EQ(run(9), (TacticPair{0, 2}));
  EXPECT_EQ(run(13), (TacticPair{1, 2}));
  EXPECT_TRUE(layer.choice(9).tuned);
  EXPECT_TRUE(layer.choice(9).per_token);
  tuner.insert(tuning_key(layer.runner(), spec, 16), {"g1_2", "g2_1", {"g1_2"}, {"g2_1"}, 1.0, 2.0, 16});
  EXPECT_EQ(run(9), (TacticPair{2, 1}));
  EXPECT_EQ(run(13), (TacticPair{2, 1}));
  EXPECT_TRUE(layer.choice(9).tuned);
  EXPECT_EQ(run(5), (TacticPair{0, 2}));  // bucket 8 has no entry
}

// ---- MoELayer on the reference runner ---------------------------------------------------------------------------

float bf16_value(uint16_t b) {
  return bf16_to_float(b);
}

// Values exactly representable in bf16, from a small deterministic sequence.
std::vector<uint16_t> bf16_values(size_t n, int seed, float scale) {
  std::vector<uint16_t> v(n);
  for (size_t i = 0; i < n; ++i) {
    const int k = static_cast<int>((i * 37 + static_cast<size_t>(seed) * 101) % 61) - 30;
    v[i] = float_to_bf16(scale * static_cast<float>(k) / 30.0f);
  }
  return v;
}

struct ReferenceCase {
  int shared = 0;
  bool biases = false;
};

class MoELayerReference : public ::testing::TestWithParam<ReferenceCase> {};

// softmax_topk with renormalization, silu_gated, gate rows first: the layer written out directly in double.
TEST_P(MoELayerReference, MatchesADirectComputation) {
  const ReferenceCase c = GetParam();
  constexpr int E = 4, K = 2, H = 8, I = 8, T = 3;
  const int S = c.shared, Ew = E + S;
  ExpertConfig ec;
  ec.num_experts = E;
  ec.top_k = K;
  ec.hidden = H;
  ec.intermediate = I;
  ec.num_shared_experts = S;
  RoutingConfig rc;
  rc.method = RoutingMethod::softmax_topk;
  rc.num_experts = E;
  rc.top_k = K;
  rc.num_shared_experts = S;
  rc.renormalize = true;

  std::vector<uint16_t> w13 = bf16_values(static_cast<size_t>(Ew) * 2 * I * H, 1, 0.5f);
  std::vector<uint16_t> w2 = bf16_values(static_cast<size_t>(Ew) * H * I, 2, 0.5f);
  std::vector<float> b13(static_cast<size_t>(Ew) * 2 * I), b2(static_cast<size_t>(Ew) * H);
  for (size_t i = 0; i < b13.size(); ++i) b13[i] = 0.01f * static_cast<float>(i % 7);
  for (size_t i = 0; i < b2.size(); ++i) b2[i] = -0.02f * static_cast<float>(i % 5);
  std::vector<uint16_t> hidden = bf16_values(static_cast<size_t>(T) * H, 3, 1.0f);
  // Distinct logits per token so the top-2 has no ties: token t prefers experts in the order of this table.
  const float logits[T][E] = {{0.1f, 2.0f, -1.0f, 1.5f}, {3.0f, 0.0f, 0.5f, -2.0f}, {-0.5f, -0.25f, 1.0f, 0.75f}};

  LayerWeights w;
  w.experts.w13 = TensorView::contiguous(w13.data(), DType::bf16, {Ew, 2 * I, H});
  w.experts.w2 = TensorView::contiguous(w2.data(), DType::bf16, {Ew, H, I});
  if (c.biases) {
    w.experts.b13 = TensorView::contiguous(b13.data(), DType::f32, {Ew, 2 * I});
    w.experts.b2 = TensorView::contiguous(b2.data(), DType::f32, {Ew, H});
  }
  Autotuner tuner(CacheMetadata{"0.1.0", "cpu", 1, 0});
  MoELayer layer(ec, rc, QuantConfig{}, w, {.backends = {"reference"}, .max_tokens = 8, .tuner = &tuner});
  EXPECT_EQ(layer.backend(), "reference");

  std::vector<uint16_t> out(static_cast<size_t>(T) * H, 0);
  std::vector<int16_t> replay(static_cast<size_t>(8) * K, -7);
  layer.forward(TensorView::contiguous(hidden.data(), DType::bf16, {T, H}),
                TensorView::contiguous(const_cast<float*>(&logits[0][0]), DType::f32, {T, E}),
                TensorView::contiguous(out.data(), DType::bf16, {T, H}), nullptr,
                TensorView::contiguous(replay.data(), DType::i16, {8, K}));

  for (int t = 0; t < T; ++t) {
    // Routing: top-2 logits (distinct), softmax over all E, renormalized over the two.
    std::vector<int> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[t][a] > logits[t][b]; });
    double denom = 0;
    for (int e = 0; e < E; ++e) denom += std::exp(static_cast<double>(logits[t][e]));
    double p[K], psum = 0;
    for (int j = 0; j < K; ++j) psum += p[j] = std::exp(static_cast<double>(logits[t][order[j]])) / denom;
    std::vector<std::pair<int, double>> slots;  // (weight row, routing weight)
    for (int j = 0; j < K; ++j) {
      slots.push_back({order[j], p[j] / psum});
      EXPECT_EQ(replay[static_cast<size_t>(t) * K + j], order[j]) << "t=" << t << " j=" << j;
    }
    for (int s = 0; s < S; ++s) slots.push_back({E + s, 1.0});
    for (int h = 0; h < H; ++h) {
      double expected = 0;
      for (auto [e, weight] : slots) {
        double y = c.biases ? b2[static_cast<size_t>(e) * H + h] : 0.0;
        for (int i = 0; i < I; ++i) {
          double gate = c.biases ? b13[static_cast<size_t>(e) * 2 * I + i] : 0.0;
          double up = c.biases ? b13[static_cast<size_t>(e) * 2 * I + I + i] : 0.0;
          for (int k = 0; k < H; ++k) {
            const double x = bf16_value(hidden[static_cast<size_t>(t) * H + k]);
            gate += bf16_value(w13[(static_cast<size_t>(e) * 2 * I + i) * H + k]) * x;
            up += bf16_value(w13[(static_cast<size_t>(e) * 2 * I + I + i) * H + k]) * x;
          }
          const double act = gate / (1.0 + std::exp(-gate)) * up;
          y += bf16_value(w2[(static_cast<size_t>(e) * H + h) * I + i]) * act;
        }
        expected += weight * y;
      }
      const double got = bf16_value(out[static_cast<size_t>(t) * H + h]);
      // One bf16 rounding at the end (relative 2^-8) plus fp32 accumulation noise.
      EXPECT_NEAR(got, expected, std::abs(expected) / 256.0 + 1e-4) << "t=" << t << " h=" << h;
    }
  }
  // Replay rows past T are untouched.
  for (size_t i = static_cast<size_t>(T) * K; i < replay.size(); ++i) EXPECT_EQ(replay[i], -7);

  // In place (out is hidden) gives the same output; an out that overlaps hidden otherwise is rejected.
  std::vector<uint16_t> in_place = hidden;
  const TensorView io = TensorView::contiguous(in_place.data(), DType::bf16, {T, H});
  const TensorView l = TensorView::contiguous(const_cast<float*>(&logits[0][0]), DType::f32, {T, E});
  layer.forward(io, l, io);
  EXPECT_EQ(in_place, out);
  std::vector<uint16_t> wide(static_cast<size_t>(T + 1) * H);
  const TensorView lower = TensorView::contiguous(wide.data(), DType::bf16, {T, H});
  const TensorView upper = TensorView::contiguous(wide.data() + H, DType::bf16, {T, H});
  EXPECT_EQ(error_of<InvalidArgument>([&] { layer.forward(lower, l, upper); }),
            "moekit::layer: out ([3, 8] bf16 cpu) must be hidden itself (in place) or share no byte with it; it "
            "starts 16 bytes after hidden");
  // Routing writes replay before the experts read hidden and write out: replay shares no byte with either.
  std::vector<uint16_t> other(static_cast<size_t>(T) * H);
  const TensorView o = TensorView::contiguous(other.data(), DType::bf16, {T, H});
  const TensorView replay_in_hidden = TensorView::contiguous(wide.data(), DType::i16, {T, K});
  EXPECT_EQ(error_of<InvalidArgument>([&] { layer.forward(lower, l, o, nullptr, replay_in_hidden); }),
            "moekit::layer: replay ([3, 2] int16 cpu) must share no byte with hidden");
  EXPECT_EQ(error_of<InvalidArgument>([&] { layer.forward(o, l, lower, nullptr, replay_in_hidden); }),
            "moekit::layer: replay ([3, 2] int16 cpu) must share no byte with out");
}

INSTANTIATE_TEST_SUITE_P(Cases, MoELayerReference, ::testing::Values(ReferenceCase{0, false}, ReferenceCase{1, true}),
                         [](const auto& info) {
                           return std::string(info.param.shared ? "shared_expert_and_biases" : "plain");
                         });

TEST(MoELayerReferenceTuning, TunesTheSingleTacticItHas) {
  const LayerSpec spec = small_spec();
  std::unique_ptr<Runner> r = make_runner("reference");
  ASSERT_TRUE(r->check_support(spec, Device::cpu()).ok);
  r->build_synthetic(16);
  Autotuner tuner(CacheMetadata{"0.1.0", "cpu", 1, 0});
  const int64_t tokens[] = {1, 16};
  std::vector<TuneResult> res = tuner.tune(*r, spec, tokens);
  ASSERT_EQ(res.size(), 2u);
  for (const TuneResult& t : res) {
    EXPECT_EQ(t.timed_configs, 1);
    EXPECT_EQ(t.best, (TacticPair{0, 0}));
    EXPECT_GT(t.entry.seconds, 0.0);
  }
}

// Synthetic weights are a function of the seed alone, and where the spec has expert biases and a routing bias the
// runner generates those too (what tuning a GPT-OSS or DeepSeek layer without its checkpoint runs on).
TEST(MoELayerReferenceTuning, SyntheticWeightsFollowTheSeedAndTheSpecsBiases) {
  LayerSpec biased = small_spec();
  biased.expert_biases = true;
  biased.routing_bias = true;
  constexpr int64_t T = 5;
  std::vector<uint16_t> hidden = bf16_values(static_cast<size_t>(T) * 16, 4, 1.0f);
  std::vector<float> logits(static_cast<size_t>(T) * 8);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = 0.25f * static_cast<float>((i * 5) % 9);
  auto run = [&](const LayerSpec& spec, uint64_t seed) {
    std::unique_ptr<Runner> r = make_runner("reference");
    EXPECT_TRUE(r->check_support(spec, Device::cpu()).ok);
    r->build_synthetic(8, seed);
    std::vector<uint16_t> out(hidden.size(), 0xFFFF);
    r->execute({TensorView::contiguous(hidden.data(), DType::bf16, {T, 16}),
                TensorView::contiguous(logits.data(), DType::f32, {T, 8}),
                TensorView::contiguous(out.data(), DType::bf16, {T, 16}),
                {}},
               {0, 0});
    for (uint16_t b : out) EXPECT_TRUE(std::isfinite(bf16_value(b)));
    return out;
  };
  const std::vector<uint16_t> a = run(biased, 7);
  EXPECT_EQ(run(biased, 7), a);
  EXPECT_NE(run(biased, 8), a);
  EXPECT_NE(run(small_spec(), 7), a);  // same w13 and w2, no biases
}

// The routing the runners time on without a caller's logits (their synthetic logits and, for deepseek-v3, their
// synthetic selection bias of build_synthetic()'s default seed) sends rows to every expert, as a trained
// load-balancing bias does; a bias as large as the sigmoid keys' spread would leave most experts idle, and the
// tuner would time a layer that reads a fraction of the weights.
TEST(MoELayerReferenceTuning, TheSyntheticRoutingReachesEveryExpert) {
  const Preset& p = find_preset("deepseek-v3");
  const int64_t T = 4096, E = p.routing.num_experts;
  std::vector<float> logits(static_cast<size_t>(T * E)), bias(static_cast<size_t>(E));
  detail::fill_uniform_f32(logits, detail::kTimingLogits.seed, detail::kTimingLogits.scale);
  const detail::SyntheticStream stream = detail::synthetic_routing_bias(1);  // build_synthetic()'s default seed
  auto counts = [&](float bias_scale) {
    detail::fill_uniform_f32(bias, stream.seed, bias_scale);
    RoutePlan plan({.max_tokens = T,
                    .num_experts = p.routing.num_experts,
                    .top_k = p.routing.top_k,
                    .num_shared_experts = p.routing.num_shared_experts,
                    .block = p.block},
                   Device::cpu());
    route(p.routing, TensorView::contiguous(logits.data(), DType::f32, {T, E}),
          TensorView::contiguous(bias.data(), DType::f32, {E}), plan);
    const int32_t* c = plan.view().expert_counts;
    return std::vector<int32_t>(c, c + E);
  };
  const std::vector<int32_t> synthetic = counts(stream.scale);
  const int64_t mean = T * p.routing.top_k / E;
  EXPECT_EQ(std::count(synthetic.begin(), synthetic.end(), 0), 0);
  EXPECT_LE(*std::max_element(synthetic.begin(), synthetic.end()), 2 * mean);
  const std::vector<int32_t> large = counts(0.5f);  // the scale the runners used before
  EXPECT_GT(std::count(large.begin(), large.end(), 0), E / 2);
}

TEST(MoELayerReferenceTuning, TimesOnGivenLogitsOfEitherDtypeAndAnyRowPitch) {
  const LayerSpec spec = small_spec();
  std::unique_ptr<Runner> r = make_runner("reference");
  ASSERT_TRUE(r->check_support(spec, Device::cpu()).ok);
  r->build_synthetic(16);
  // Three rows of 8 logits, 10 apart (fewer rows than the 16 timed tokens: they repeat).
  std::vector<uint16_t> bf16(30, float_to_bf16(-1.0f));
  std::vector<float> f32(30, -1.0f);
  for (int row = 0; row < 3; ++row) {
    bf16[row * 10 + row] = float_to_bf16(4.0f);
    f32[row * 10 + row] = 4.0f;
  }
  TensorView strided_bf16 = TensorView::contiguous(bf16.data(), DType::bf16, {3, 8});
  TensorView strided_f32 = TensorView::contiguous(f32.data(), DType::f32, {3, 8});
  strided_bf16.strides[0] = strided_f32.strides[0] = 10;
  for (const TensorView& v : {strided_bf16, strided_f32}) {
    Autotuner tuner(CacheMetadata{"0.1.0", "cpu", 1, 0});
    const int64_t tokens[] = {16};
    const std::vector<TuneResult> res = tuner.tune(*r, spec, tokens, {.logits = v});
    ASSERT_EQ(res.size(), 1u);
    EXPECT_EQ(res[0].timed_configs, 1);
    EXPECT_GT(res[0].entry.seconds, 0.0);
  }
  EXPECT_GT(r->time_tactics({0, 0}, 16), 0.0);  // back on the synthetic logits
}

// ---- moekit tune on the CPU backend -------------------------------------------------------------------------------

struct Command {
  int status = -1;
  std::string output;  // stdout and stderr
};

Command run_cli(const std::string& args) {
  Command c;
  std::FILE* p = popen((std::string(MOEKIT_CLI_PATH) + " " + args + " 2>&1").c_str(), "r");
  if (!p) return c;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) c.output.append(buf, n);
  const int status = pclose(p);
  c.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return c;
}

TEST(TuneCommand, TunesAPresetOnTheReferenceRunnerAndShowsTheCache) {
  if (!std::filesystem::exists(MOEKIT_CLI_PATH)) GTEST_SKIP() << "moekit CLI not built at " << MOEKIT_CLI_PATH;
  namespace fs = std::filesystem;
  const fs::path dir = testing::temp_dir();
  const std::string cache = (dir / "tune.json").string();
  Command tune = run_cli("tune --preset qwen3-30b-a3b --tokens 1,2,3 --cache " + cache +
                         " --device cpu --backend reference --progress lines");
  ASSERT_EQ(tune.status, 0) << tune.output;
  EXPECT_NE(tune.output.find("with runner reference@1 (1 GEMM1 x 1 GEMM2 tactics)"), std::string::npos)
      << tune.output;
  EXPECT_NE(tune.output.find("saved 3 entries to " + cache), std::string::npos) << tune.output;  // buckets 1, 2, 4
  Command show = run_cli("tune --show " + cache);
  ASSERT_EQ(show.status, 0) << show.output;
  EXPECT_NE(show.output.find("3 entries"), std::string::npos) << show.output;
  EXPECT_NE(show.output.find("runner=reference@1 E=128 local=128@0 K=8 S=0 H=2048 I=768 act=silu_gated "
                             "gate_up=gate_first bias=0 routing=topk_softmax groups=1/1 w=bf16 a=bf16 "
                             "blocks=128x128/128 T=4\n"),
            std::string::npos)
      << show.output;
  // Again: every bucket is cached, nothing is timed.
  Command again = run_cli("tune --preset qwen3-30b-a3b --tokens 2 --cache " + cache + " --device cpu");
  ASSERT_EQ(again.status, 0) << again.output;
  EXPECT_NE(again.output.find("cached"), std::string::npos) << again.output;
  // A corrupted cache is reported and left as it was.
  const fs::path bad = dir / "bad.json";
  std::ofstream(bad) << "{\"entries\": [";
  Command broken = run_cli("tune --preset qwen3-30b-a3b --tokens 1 --device cpu --cache " + bad.string());
  EXPECT_EQ(broken.status, 1);
  EXPECT_NE(broken.output.find("error: moekit::tuner: cache file '" + bad.string() + "' is not valid JSON: "),
            std::string::npos)
      << broken.output;
  EXPECT_EQ(testing::read_all(bad), "{\"entries\": [");
  // Routing logits from a file (3 rows of E = 128): the timings route them; a bad file fails before any timing.
  const fs::path logits = dir / "logits.txt";
  {
    std::ofstream out(logits);
    for (int i = 0; i < 3 * 128; ++i) out << (i % 128 == i / 128 ? 4.0 : -1.0) << (i % 128 == 127 ? "\n" : " ");
  }
  Command routed = run_cli("tune --preset qwen3-30b-a3b --tokens 8 --mode full --device cpu --cache " + cache +
                           " --logits " + logits.string());
  ASSERT_EQ(routed.status, 0) << routed.output;
  EXPECT_NE(routed.output.find("routing 3 rows of logits from " + logits.string()), std::string::npos)
      << routed.output;
  Command shown = run_cli("tune --show " + cache);
  EXPECT_NE(shown.output.find("timed at T=8 on given routing logits"), std::string::npos) << shown.output;
  EXPECT_NE(shown.output.find("timed at T=4 on synthetic routing logits"), std::string::npos) << shown.output;
  std::ofstream(dir / "short.txt") << "1 2 3 4 5";
  Command short_file = run_cli("tune --preset qwen3-30b-a3b --tokens 8 --device cpu --cache " + cache + " --logits " +
                               (dir / "short.txt").string());
  EXPECT_EQ(short_file.status, 1);
  EXPECT_NE(short_file.output.find("error: moekit::tune: logits file '" + (dir / "short.txt").string() +
                                   "' holds 5 values, which must be a positive multiple of num_experts (128)"),
            std::string::npos)
      << short_file.output;
  Command usage = run_cli("tune --tokens 1 --cache " + cache);
  EXPECT_EQ(usage.status, 1);
  EXPECT_NE(usage.output.find("moekit::tune: --preset is required (or --show PATH)"), std::string::npos)
      << usage.output;
  fs::remove_all(dir);
}

// A cache written on another machine is ignored (its entries are said to be), then replaced by this machine's.
TEST(TuneCommand, ACacheFromAnotherMachineIsIgnoredAndReplaced) {
  if (!std::filesystem::exists(MOEKIT_CLI_PATH)) GTEST_SKIP() << "moekit CLI not built at " << MOEKIT_CLI_PATH;
  namespace fs = std::filesystem;
  const fs::path dir = testing::temp_dir();
  const std::string cache = (dir / "tune.json").string();
  Command first = run_cli("tune --preset qwen3-30b-a3b --tokens 1,2 --cache " + cache + " --device cpu");
  ASSERT_EQ(first.status, 0) << first.output;
  // The file names this machine's device ("cpu", or the GPU's name where one is present): another's replaces it.
  const std::string name = CacheMetadata::current().device_name;
  const std::string here = "\"device_name\": \"" + name + "\"";
  std::string text = testing::read_all(cache);
  const size_t at = text.find(here);
  ASSERT_NE(at, std::string::npos) << text;
  text.replace(at, here.size(), "\"device_name\": \"Another GPU\"");
  std::ofstream(cache) << text;
  Command second = run_cli("tune --preset qwen3-30b-a3b --tokens 1 --cache " + cache + " --device cpu");
  ASSERT_EQ(second.status, 0) << second.output;
  EXPECT_NE(second.output.find("ignoring 2 entries of " + cache + ": metadata differs: device_name ('" + name +
                               "' vs 'Another GPU') (this machine vs the file)"),
            std::string::npos)
      << second.output;
  EXPECT_NE(
      second.output.find("saved 1 entries to " + cache + " (0 kept from the file, 2 dropped: metadata mismatch)"),
      std::string::npos)
      << second.output;
  const std::string after = testing::read_all(cache);
  EXPECT_NE(after.find(here), std::string::npos) << after;
  EXPECT_EQ(after.find("Another GPU"), std::string::npos) << after;
  fs::remove_all(dir);
}

TEST(TuneCommand, OptionValuesOutsideTheirChoicesAreNamed) {
  if (!std::filesystem::exists(MOEKIT_CLI_PATH)) GTEST_SKIP() << "moekit CLI not built at " << MOEKIT_CLI_PATH;
  const std::pair<std::string, std::string> cases[] = {
      {"--device gpu", "moekit::tune: --device ('gpu') must be auto, cpu, cuda or cuda:N"},
      {"--device cuda:x", "moekit::tune: --device ('cuda:x') must be auto, cpu, cuda or cuda:N"},
      {"--mode fast", "moekit::tune: --mode ('fast') must be skip, shortlist or full"},
      {"--progress dots", "moekit::tune: --progress ('dots') must be auto, bar, lines or none"},
      {"--tokens 1,x", "token list entry 'x' must be a positive integer (list: '1,x')"},
      {"--tokens 0", "token list entry '0' must be a positive integer (list: '0')"},
  };
  for (const auto& [option, message] : cases) {
    const std::string tokens = option.rfind("--tokens", 0) == 0 ? "" : " --tokens 1";
    Command c = run_cli("tune --preset qwen3-30b-a3b --cache /nonexistent/t.json " + option + tokens);
    EXPECT_EQ(c.status, 1) << option << ": " << c.output;
    EXPECT_NE(c.output.find(message), std::string::npos) << option << ": " << c.output;
  }
  Command both = run_cli("tune --show /nonexistent/t.json --preset qwen3-30b-a3b");
  EXPECT_EQ(both.status, 1) << both.output;
  EXPECT_NE(both.output.find("moekit::tune: --show PATH prints a cache and takes no --preset, --tokens or --cache"),
            std::string::npos)
      << both.output;
}

}  // namespace
}  // namespace moekit

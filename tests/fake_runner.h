// A runner for CPU tests of the lifecycle, the registry, MoELayer and the autotuner: its tactics have costs the
// test chooses (a function of the pair), it records every pair it timed or executed, the length of every timed
// schedule and the timing logits each timing saw, and its execute() writes the tactic indices into `out` so a test
// can see which pair a layer ran. No real compute.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "moekit/layer.h"

namespace moekit::testing {

struct FakeRunnerConfig {
  std::string name = "fake";
  std::string version = "1";
  int n1 = 3;                       // GEMM1 tactics g1_0, g1_1, ...
  int n2 = 3;                       // GEMM2 tactics g2_0, ...
  std::vector<std::string> names1;  // set: the GEMM1 tactics' names instead (n1 is then ignored)
  TacticPair default_pair{0, 0};
  std::function<TacticPair(int64_t)> default_for;  // set: the default pair for T (else default_pair for every T)
  std::function<double(TacticPair)> cost = [](TacticPair p) { return 1.0 + p.gemm1 + p.gemm2; };
  std::string decline;            // non-empty: check_support() says no with this reason
  bool decline_silently = false;  // check_support() says no without a reason (a broken runner)
  bool drop_last_timing = false;  // do_time_schedule() returns one timing too few (a broken runner)
};

class FakeRunner final : public Runner {
 public:
  explicit FakeRunner(FakeRunnerConfig cfg = {}) : cfg_(std::move(cfg)) {
    for (int i = 0; i < cfg_.n1; ++i) t1_.push_back({"g1_" + std::to_string(i), "fake GEMM1 tactic"});
    if (!cfg_.names1.empty()) t1_.clear();
    for (const std::string& n : cfg_.names1) t1_.push_back({n, "fake GEMM1 tactic"});
    for (int j = 0; j < cfg_.n2; ++j) t2_.push_back({"g2_" + std::to_string(j), "fake GEMM2 tactic"});
  }

  std::string_view name() const override { return cfg_.name; }
  std::string_view version() const override { return cfg_.version; }
  std::span<const Tactic> gemm1_tactics() const override { return t1_; }
  std::span<const Tactic> gemm2_tactics() const override { return t2_; }

  std::vector<TacticPair> timed;  // every time_tactics() call, in order
  std::vector<int64_t> timed_tokens;
  std::vector<TacticPair> executed;  // every execute() call
  std::vector<size_t> schedules;     // the length of every do_time_schedule() call's order
  int builds = 0;                    // do_build() calls
  // The data of the logits set by set_timing_logits() (nullptr: synthetic), now, at each set and at each timing.
  const void* timing_logits = nullptr;
  std::vector<const void*> timing_logits_sets;
  std::vector<const void*> timed_logits;

 protected:
  Support do_check_support(const LayerSpec&, Device) override {
    if (cfg_.decline_silently) return Support::no("");
    return cfg_.decline.empty() ? Support::yes() : Support::no(cfg_.decline);
  }
  void do_build(const LayerWeights&, int64_t) override {
    ++builds;
    timing_logits = nullptr;
  }
  LayerWeights make_synthetic_weights(uint64_t) override {
    const ExpertConfig& e = spec().experts;
    const int64_t ew = e.weight_experts(), h = e.hidden, i = e.intermediate;
    w13_.assign(static_cast<size_t>(ew * 2 * i * h), 0);
    w2_.assign(static_cast<size_t>(ew * h * i), 0);
    LayerWeights w;
    w.experts.w13 = TensorView::contiguous(w13_.data(), DType::bf16, {ew, 2 * i, h});
    w.experts.w2 = TensorView::contiguous(w2_.data(), DType::bf16, {ew, h, i});
    return w;
  }
  void do_execute(const LayerInputs& in, const TacticPair& t, Stream) override {
    executed.push_back(t);
    auto* out = in.out.as<uint16_t>();
    out[0] = static_cast<uint16_t>(t.gemm1);
    out[1] = static_cast<uint16_t>(t.gemm2);
  }
  double do_time_tactics(const TacticPair& t, int64_t tokens) override {
    timed.push_back(t);
    timed_tokens.push_back(tokens);
    timed_logits.push_back(timing_logits);
    return cfg_.cost(t);
  }
  std::vector<double> do_time_schedule(std::span<const TacticPair> order, int64_t tokens,
                                       const std::function<void()>& on_timed) override {
    schedules.push_back(order.size());
    std::vector<double> seconds = Runner::do_time_schedule(order, tokens, on_timed);  // do_time_tactics() in turn
    if (cfg_.drop_last_timing) seconds.pop_back();
    return seconds;
  }
  void do_set_timing_logits(const TensorView& logits) override {
    timing_logits = logits.present() ? logits.data : nullptr;
    timing_logits_sets.push_back(timing_logits);
  }
  TacticPair do_default_tactics(int64_t tokens) const override {
    return cfg_.default_for ? cfg_.default_for(tokens) : cfg_.default_pair;
  }

 private:
  FakeRunnerConfig cfg_;
  std::vector<Tactic> t1_, t2_;
  std::vector<uint16_t> w13_, w2_;
};

/// A small valid layer: E=8, K=2, H=16, I=8, softmax_topk, bf16.
inline LayerSpec small_spec() {
  LayerSpec s;
  s.experts.num_experts = 8;
  s.experts.top_k = 2;
  s.experts.hidden = 16;
  s.experts.intermediate = 8;
  s.routing.num_experts = 8;
  s.routing.top_k = 2;
  return s;
}

}  // namespace moekit::testing

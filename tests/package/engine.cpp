// An engine's first use of moekit, built as a shared object as an engine's Python extension module is: route three
// tokens with the CPU backend through the public headers and compare the ids, the weights and the plan's counts
// with values worked out by hand.
#include <cmath>
#include <vector>

#include "moekit/plan.h"
#include "moekit/routing.h"
#include "moekit/version.h"

// The library's version, "0.1.0" (kVersion views a string literal, so its data is terminated).
extern "C" const char* moekit_consumer_version() {
  return moekit::kVersion.data();
}

extern "C" int moekit_consumer_differences() {
  using namespace moekit;
  // softmax_topk, E = 4, K = 2, renormalized: each token's two largest logits, weights e^l / (e^a + e^b).
  const RoutingConfig cfg = make_routing_config(RoutingMethod::softmax_topk, 4, 2, 0, true);
  std::vector<float> logits = {0.0f,  2.0f, 1.0f, -1.0f,  //
                               3.0f,  3.0f, 0.0f, 0.0f,   // a tie: the lower id first
                               -1.0f, 0.0f, 0.0f, 5.0f};
  const TensorView view = TensorView::contiguous(logits.data(), DType::f32, {3, 4});
  RoutePlan plan(PlanShape{.max_tokens = 8, .num_experts = 4, .top_k = 2, .block = 1}, Device::cpu());
  route(cfg, view, {}, plan);
  const RoutePlanView& p = plan.view();
  const int ids[6] = {1, 2, 0, 1, 3, 1};
  const float w0 = 1.0f / (1.0f + std::exp(-1.0f)), w2 = 1.0f / (1.0f + std::exp(-5.0f));
  const float weights[6] = {w0, 1.0f - w0, 0.5f, 0.5f, w2, 1.0f - w2};
  const int counts[4] = {1, 3, 1, 1};
  int differences = 0;
  for (int i = 0; i < 6; ++i) {
    if (p.topk_ids[i] != ids[i]) ++differences;
    if (!(std::fabs(p.topk_weights[i] - weights[i]) <= 1e-6f)) ++differences;  // NaN counts as a difference
  }
  for (int e = 0; e < 4; ++e)
    if (p.expert_counts[e] != counts[e]) ++differences;
  return differences;
}

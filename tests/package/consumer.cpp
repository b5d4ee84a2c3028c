// An engine's first use of moekit, through its public headers only: route three tokens with the CPU backend and
// check the ids, the weights and the plan's counts against values worked out by hand. Exits 1 on any difference.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "moekit/plan.h"
#include "moekit/routing.h"
#include "moekit/version.h"

int main() {
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
  int bad = 0;
  for (int i = 0; i < 6; ++i) {
    if (p.topk_ids[i] != ids[i]) ++bad;
    if (std::fabs(p.topk_weights[i] - weights[i]) > 1e-6f) ++bad;
  }
  for (int e = 0; e < 4; ++e)
    if (p.expert_counts[e] != counts[e]) ++bad;
  std::printf("moekit %s consumer: %s\n", std::string(kVersion).c_str(), bad == 0 ? "ok" : "WRONG");
  return bad == 0 ? 0 : 1;
}

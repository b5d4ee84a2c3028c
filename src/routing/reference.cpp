// CPU reference top-k routing (the contract in moekit/routing.h). Per token: selection keys (method key + bias),
// for sigmoid_grouped the kept groups, the K best experts by routing_math::packed_key (a total order: higher key,
// then lower id, NaN last), then the weights, optional renormalization, scaling and the fused shared slots.
// Every exp/sigmoid and every key comparison goes through routing_math, so a GPU kernel using the same functions
// gets bitwise-identical keys and therefore identical ids. Tokens are independent: large T is split into
// contiguous token ranges over std::threads, which changes nothing in the results. Scratch lives on the stack.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "moekit/error.h"
#include "moekit/routing.h"
#include "routing/routing_math.h"

namespace moekit {
namespace {

namespace rm = routing_math;

// Below this many tokens the thread start-up costs more than the routing itself.
constexpr int64_t kMinParallelTokens = 256;
constexpr int64_t kMinTokensPerThread = 128;

struct RouteArgs {
  const RoutingConfig* cfg = nullptr;
  const void* logits = nullptr;  // [T, row_stride] fp32 or bf16
  bool logits_bf16 = false;
  int64_t row_stride = 0;
  const float* bias = nullptr;  // [E] fp32, or null
  int32_t* ids = nullptr;       // [T, K+S] int32
  float* weights = nullptr;     // [T, K+S] fp32
  int16_t* replay = nullptr;    // [R, K] int16, or null
};

float load_logit(const RouteArgs& a, int64_t t, int e) {
  const int64_t i = t * a.row_stride + e;
  return a.logits_bf16 ? bf16_to_float(static_cast<const uint16_t*>(a.logits)[i])
                       : static_cast<const float*>(a.logits)[i];
}

// The softmax term exp(l - max) with the conventions of this reference (NaN-aware):
//  - the max is taken over the non-NaN logits only (starting from -inf);
//  - a NaN logit counts as probability 0 (it also ranks below every number, consistently);
//  - a logit equal to the max contributes exp(0) = 1, which keeps +inf logits finite (they share the mass) and
//    makes a row of all -inf uniform over its -inf entries;
//  - a row of only NaN has max -inf and every term 0; its sum is 0 and its weights are defined as 0.
float softmax_term(float logit, float max) {
  if (logit != logit) return 0.0f;
  return logit == max ? 1.0f : rm::exp(rm::add(logit, -max));
}

// A NaN b leaves a unchanged, so NaN logits never become the max.
float nan_aware_max(float a, float b) {
  return b > a ? b : a;
}

// w[j] = the softmax over the K selected logits logit[ids[j]], summed in slot order.
void softmax_of_selected(const float* logit, const int32_t* ids, int K, float* w) {
  float max = -INFINITY;
  for (int j = 0; j < K; ++j) max = nan_aware_max(max, logit[ids[j]]);
  float sum = 0.0f;
  for (int j = 0; j < K; ++j) sum = rm::add(sum, softmax_term(logit[ids[j]], max));
  for (int j = 0; j < K; ++j) w[j] = sum != 0.0f ? rm::div(softmax_term(logit[ids[j]], max), sum) : 0.0f;
}

// Selects the topk_group best groups into `kept` (kept[g] = true). Group score: sum of the group's two best keys
// by packed order (its one key when a group has a single expert); groups are ordered by packed_key(score, g).
void keep_groups(const RoutingConfig& cfg, const float* key, bool* kept) {
  const int size = cfg.num_experts / cfg.n_group;
  uint64_t group_keys[kMaxExperts];
  for (int g = 0; g < cfg.n_group; ++g) {
    uint64_t best = 0, second = 0;
    for (int e = g * size; e < (g + 1) * size; ++e) {
      const uint64_t p = rm::packed_key(key[e], e);
      if (p > best) {
        second = best;
        best = p;
      } else if (p > second) {
        second = p;
      }
    }
    float score = key[rm::packed_expert(best)];
    if (size > 1) score = rm::add(score, key[rm::packed_expert(second)]);
    group_keys[g] = rm::packed_key(score, g);
    kept[g] = false;
  }
  std::partial_sort(group_keys, group_keys + cfg.topk_group, group_keys + cfg.n_group, std::greater<>());
  for (int i = 0; i < cfg.topk_group; ++i) kept[rm::packed_expert(group_keys[i])] = true;
}

void route_token(const RouteArgs& a, int64_t t) {
  const RoutingConfig& cfg = *a.cfg;
  const int E = cfg.num_experts, K = cfg.top_k, S = cfg.num_shared_experts;
  const RoutingMethod m = cfg.method;
  float logit[kMaxExperts];
  float key[kMaxExperts];
  for (int e = 0; e < E; ++e) {
    logit[e] = load_logit(a, t, e);
    // softmax_topk, topk_softmax, llama4: the logit (softmax is monotonic); pre_scored: the score itself.
    key[e] = m == RoutingMethod::sigmoid_grouped ? rm::sigmoid(logit[e]) : logit[e];
    if (a.bias) key[e] = rm::add(key[e], a.bias[e]);
  }

  // Candidates: every expert, or only those of the kept groups.
  bool kept[kMaxExperts];
  const bool grouped = m == RoutingMethod::sigmoid_grouped && cfg.n_group > 1;
  if (grouped) keep_groups(cfg, key, kept);
  const int group_size = E / cfg.n_group;
  uint64_t cand[kMaxExperts];
  int n = 0;
  for (int e = 0; e < E; ++e)
    if (!grouped || kept[e / group_size]) cand[n++] = rm::packed_key(key[e], e);
  std::partial_sort(cand, cand + K, cand + n, std::greater<>());

  int32_t* ids = a.ids + t * cfg.slots();
  float* w = a.weights + t * cfg.slots();
  for (int j = 0; j < K; ++j) ids[j] = rm::packed_expert(cand[j]);

  switch (m) {
    case RoutingMethod::softmax_topk: {
      // Renormalized, the weights are the softmax over the K selected logits (topk_softmax's arithmetic): the same
      // value in exact arithmetic, with no term lost to an underflow against a max the bias left unselected.
      if (cfg.renormalize) {
        softmax_of_selected(logit, ids, K, w);
        break;
      }
      float max = -INFINITY;
      for (int e = 0; e < E; ++e) max = nan_aware_max(max, logit[e]);
      // The oracle sums the E terms in double, rounded once: a sequential fp32 sum over 512 terms drifts by
      // ~1e-6 relative, as much as the tolerance GPU weights are held to.
      double wide = 0.0;
      for (int e = 0; e < E; ++e) wide += static_cast<double>(softmax_term(logit[e], max));
      const float sum = static_cast<float>(wide);
      for (int j = 0; j < K; ++j) w[j] = sum != 0.0f ? rm::div(softmax_term(logit[ids[j]], max), sum) : 0.0f;
      break;
    }
    case RoutingMethod::topk_softmax:
      softmax_of_selected(logit, ids, K, w);
      break;
    case RoutingMethod::sigmoid_grouped:
    case RoutingMethod::llama4:
      for (int j = 0; j < K; ++j) w[j] = rm::sigmoid(logit[ids[j]]);
      break;
    case RoutingMethod::pre_scored:
      for (int j = 0; j < K; ++j) w[j] = logit[ids[j]];
      break;
  }

  // Softmax weights are normalized already and llama4 (K = 1) keeps its raw sigmoid, so renormalize leaves them be.
  const bool renormalize = cfg.renormalize && (m == RoutingMethod::sigmoid_grouped || m == RoutingMethod::pre_scored);
  if (renormalize) {
    float sum = 0.0f;  // slot order
    for (int j = 0; j < K; ++j) sum = rm::add(sum, w[j]);
    if (sum != 0.0f)
      for (int j = 0; j < K; ++j) w[j] = rm::div(w[j], sum);
  }
  for (int j = 0; j < K; ++j) w[j] = rm::mul(w[j], cfg.routed_scaling_factor);

  for (int s = 0; s < S; ++s) {
    ids[K + s] = E + s;
    w[K + s] = 1.0f;
  }
  if (a.replay)
    for (int j = 0; j < K; ++j) a.replay[t * K + j] = static_cast<int16_t>(ids[j]);
}

void route_range(const RouteArgs& a, int64_t begin, int64_t end) {
  for (int64_t t = begin; t < end; ++t) route_token(a, t);
}

}  // namespace

void route_topk_reference(const RoutingConfig& cfg, const TensorView& logits, const TensorView& bias,
                          int32_t* topk_ids, float* topk_weights, const TensorView& replay) {
  const int64_t tokens = logits.ndim == 2 ? logits.shape[0] : 0;
  validate_route_args(cfg, logits, bias, replay, tokens, Device::cpu());
  if (tokens == 0) return;
  if (topk_ids == nullptr) throw InvalidArgument("route", "topk_ids (null) must be non-null");
  if (topk_weights == nullptr) throw InvalidArgument("route", "topk_weights (null) must be non-null");

  // The bias is converted once; it is read by every token.
  float bias_f32[kMaxExperts];
  if (bias.present())
    for (int e = 0; e < cfg.num_experts; ++e)
      bias_f32[e] =
          bias.dtype == DType::bf16 ? bf16_to_float(bias.as<const uint16_t>()[e]) : bias.as<const float>()[e];

  RouteArgs a;
  a.cfg = &cfg;
  a.logits = logits.data;
  a.logits_bf16 = logits.dtype == DType::bf16;
  a.row_stride = logits.stride(0);
  a.bias = bias.present() ? bias_f32 : nullptr;
  a.ids = topk_ids;
  a.weights = topk_weights;
  a.replay = replay.present() ? replay.as<int16_t>() : nullptr;

  const int64_t hw = std::max<int64_t>(1, std::thread::hardware_concurrency());
  const int64_t workers = tokens < kMinParallelTokens ? 1 : std::min(hw, tokens / kMinTokensPerThread);
  if (workers <= 1) {
    route_range(a, 0, tokens);
    return;
  }
  // Contiguous token ranges; each token writes only its own rows, so the result does not depend on scheduling.
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(workers - 1));
  const int64_t per = (tokens + workers - 1) / workers;
  try {
    for (int64_t w = 1; w < workers; ++w) {
      const int64_t begin = std::min(tokens, w * per), end = std::min(tokens, (w + 1) * per);
      threads.emplace_back(route_range, std::cref(a), begin, end);
    }
  } catch (...) {  // a thread failed to start: join the started ones before unwinding
    for (std::thread& th : threads) th.join();
    throw;
  }
  route_range(a, 0, std::min(tokens, per));
  for (std::thread& th : threads) th.join();
}

}  // namespace moekit

// Fuzz target for moekit::ep_simulate(), the CPU simulation of expert parallelism whose dispatch tables, scores and
// combine rules the GPU kernels share: a layer (every routing method, shared experts, expert biases, activations,
// gate/up layouts), 1-32 ranks, the tokens per rank, the exchange mode and the plan block are decoded from the input
// bytes. Every rank's output must match the experts' contract (experts_oracle.h) for the layer routed on all ranks'
// tokens at once, within the bf16 roundings of the per-rank partial sums; ranks with unequal token counts must be
// rejected with InvalidArgument.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "experts_oracle.h"
#include "fuzz_targets.h"
#include "moekit/dtype.h"
#include "moekit/error.h"
#include "moekit/expert_parallel.h"
#include "moekit/experts.h"
#include "moekit/plan.h"
#include "moekit/routing.h"
#include "moekit/tensor.h"

namespace {

using namespace moekit;
using fuzz::Bytes;
using fuzz::require;
using fuzz::small_value;

void run_case(Bytes& in) {
  static const int kExperts[] = {1, 2, 3, 4, 5, 6, 8, 12, 32, 33};
  const int E = kExperts[in.chance(90) ? in.pick(8) : 8 + in.pick(2)];
  const int W = 1 + in.pick(std::min({E, kMaxWorldSize, in.chance(80) ? 4 : 32}));
  const int K = 1 + in.pick(std::min(E, 4)), S = in.pick(3);
  RoutingConfig routing = make_routing_config(static_cast<RoutingMethod>(in.pick(5)), E, K, S, in.chance(50));
  if (routing.method == RoutingMethod::llama4) routing.top_k = 1;
  if (routing.method == RoutingMethod::sigmoid_grouped && E % 2 == 0 && E / 2 >= routing.top_k && in.chance(50)) {
    routing.n_group = 2;
    routing.topk_group = 1 + in.pick(2);
  }
  routing.routed_scaling_factor = in.chance(50) ? 1.0f : 2.5f;
  const int H = 8 * (1 + in.pick(2)), I = 8 * (1 + in.pick(2));
  ExpertConfig global = make_expert_config(E, routing.top_k, H, I, S, static_cast<Activation>(in.pick(3)),
                                           static_cast<GateUpLayout>(in.pick(3)));
  global.routing_weight_on_input = in.chance(25);
  const int G = E + S;
  const int64_t T = in.pick(6), N = W * T;
  const bool expert_biases = in.chance(40), routing_bias = in.chance(40), unequal = W > 1 && in.chance(20);

  auto values = [&](int64_t n) { return fuzz::bf16_values(in, n); };
  const int64_t row13 = 2 * int64_t{I} * H, row2 = int64_t{H} * I;
  std::vector<uint16_t> w13 = values(G * row13), w2 = values(G * row2), x = values((N + 1) * H);
  std::vector<uint16_t> b13 = values(int64_t{G} * 2 * I), b2 = values(int64_t{G} * H);
  std::vector<float> b13f(b13.size()), b2f(b2.size()), logits(static_cast<size_t>((N + 1) * E)), bias(E);
  for (size_t i = 0; i < b13.size(); ++i) b13f[i] = bf16_to_float(b13[i]);
  for (size_t i = 0; i < b2.size(); ++i) b2f[i] = bf16_to_float(b2[i]);
  for (float& l : logits) l = small_value(in);
  for (float& b : bias) b = small_value(in) / 4;
  const TensorView bias_view = routing_bias ? TensorView::contiguous(bias.data(), DType::f32, {E}) : TensorView{};

  // Each rank: its slice of the routed experts plus every shared one, and T consecutive tokens.
  std::vector<std::vector<uint16_t>> rw13(W), rw2(W), rb13(W), rb2(W);
  std::vector<std::vector<uint16_t>> out(W, std::vector<uint16_t>(static_cast<size_t>((T + 1) * H), 0x7fc0));
  std::vector<EpSimRank> ranks(W);
  for (int r = 0; r < W; ++r) {
    const ExpertPartition p = expert_partition(E, W, r);
    auto slice = [&](const std::vector<uint16_t>& w, int64_t per, std::vector<uint16_t>& dst) {
      dst.assign(w.begin() + p.offset * per, w.begin() + (p.offset + p.count) * per);
      dst.insert(dst.end(), w.begin() + E * per, w.begin() + G * per);
    };
    slice(w13, row13, rw13[r]);
    slice(w2, row2, rw2[r]);
    const int64_t L = p.count + S;
    ranks[r].weights.w13 = TensorView::contiguous(rw13[r].data(), DType::bf16, {L, 2 * I, H});
    ranks[r].weights.w2 = TensorView::contiguous(rw2[r].data(), DType::bf16, {L, H, I});
    if (expert_biases) {
      slice(b13, 2 * I, rb13[r]);
      slice(b2, H, rb2[r]);
      ranks[r].weights.b13 = TensorView::contiguous(rb13[r].data(), DType::bf16, {L, 2 * I});
      ranks[r].weights.b2 = TensorView::contiguous(rb2[r].data(), DType::bf16, {L, H});
    }
    const int64_t Tr = unequal && r == W - 1 ? T + 1 : T;
    ranks[r].hidden = TensorView::contiguous(x.data() + r * T * H, DType::bf16, {Tr, H});
    ranks[r].logits = TensorView::contiguous(logits.data() + r * T * E, DType::f32, {Tr, E});
    ranks[r].out = TensorView::contiguous(out[r].data(), DType::bf16, {Tr, H});
  }
  EpSimArgs args;
  args.experts = global;
  args.routing = routing;
  args.routing_bias = bias_view;
  args.mode = in.chance(50) ? EpMode::all_gather : EpMode::all_to_all;
  args.block = 1 + in.pick(8);

  try {
    ep_simulate(args, ranks);
    fuzz::accepted(fuzz::outcomes(fuzz::Target::ep), !unequal, " (unequal token counts)");

    // The whole layer on one rank: every token routed at once, then the contract.
    RoutePlan plan({.max_tokens = std::max<int64_t>(N, 1),
                    .num_experts = E,
                    .top_k = routing.top_k,
                    .num_shared_experts = S,
                    .block = 1},
                   Device::cpu());
    route(routing, TensorView::contiguous(logits.data(), DType::f32, {N, E}), bias_view, plan);
    std::vector<double> want, bound;
    const fuzz::ContractCall call{.cfg = &global,
                                  .w13 = w13.data(),
                                  .w2 = w2.data(),
                                  .b13 = expert_biases ? b13f.data() : nullptr,
                                  .b2 = expert_biases ? b2f.data() : nullptr,
                                  .x = x.data(),
                                  .ids = plan.view().topk_ids,
                                  .weights = plan.view().topk_weights,
                                  .tokens = N};
    // W partial sums rounded to bf16 before the fp32 sum across ranks, then one rounding more.
    fuzz::contract_output(call, 2.5e-3 * (W + 1), want, bound);
    for (int r = 0; r < W; ++r)
      for (int64_t i = 0; i < T * H; ++i) {
        const double got = bf16_to_float(out[r][i]), w = want[r * T * H + i];
        require(std::abs(got - w) <= bound[r * T * H + i] + 1e-30,
                "rank " + std::to_string(r) + " of " + std::to_string(W) + " out[" + std::to_string(i / H) + ", " +
                    std::to_string(i % H) + "] = " + std::to_string(got) + ", the contract gives " +
                    std::to_string(w) + " (" + std::string(ep_mode_name(args.mode)) + ", E " + std::to_string(E) +
                    ", K " + std::to_string(routing.top_k) + ", S " + std::to_string(S) + ")");
      }
  } catch (const InvalidArgument& e) {
    fuzz::rejected(fuzz::outcomes(fuzz::Target::ep), !unequal, e.what(), "");
  }
}

}  // namespace

void moekit::fuzz::ep_input(const uint8_t* data, size_t size) {
  Bytes in(data, size);
  run_case(in);
}

MOEKIT_FUZZ_ENTRY(ep_input)

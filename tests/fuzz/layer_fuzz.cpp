// Fuzz target for moekit::MoELayer on the CPU (the reference runner): a small layer (every routing method, shared
// experts, biases, activations, gate/up layouts) and one forward() call are decoded from the input bytes, with at
// most one fault: configs that disagree, a quantized layer, a tensor of the wrong shape or dtype, an out that
// overlaps hidden without being it, too many tokens, a bad max_tokens, an unknown backend. Without a fault,
// forward() (apart or in place: out = hidden) must give bit for bit what route() and experts_reference() give on the
// same inputs, and fill the replay rows; with one, the layer must throw the documented error (InvalidArgument, or
// NotSupported for the quantized layer) whose message names the bad argument.
#include <algorithm>
#include <cstdint>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz_targets.h"
#include "moekit/dtype.h"
#include "moekit/error.h"
#include "moekit/experts.h"
#include "moekit/layer.h"
#include "moekit/plan.h"
#include "moekit/routing.h"
#include "moekit/tensor.h"

namespace {

using namespace moekit;
using fuzz::Bytes;
using fuzz::require;
using fuzz::small_value;

enum class Fault {
  none,
  routing_experts,  // routing num_experts != the expert config's
  routing_top_k,    // routing top_k != the expert config's
  quantized,        // fp8 weights: no runner serves them yet
  hidden_dtype,     // hidden in fp32
  out_width,        // out [T, H + 8]
  logits_width,     // logits [T, E + 1]
  logits_rows,      // logits with one row fewer than hidden
  replay_width,     // replay [T, K + 1]
  too_many_tokens,  // T > max_tokens
  zero_max_tokens,  // LayerOptions::max_tokens = 0
  unknown_backend,  // backends {"nonexistent"}
  bias_size,        // routing bias [E + 1]
  w2_shape,         // w2 [E', H, I / 2]
  out_overlaps,     // out starts 1..T*H-1 elements into hidden
  count
};

/// The substring the error of each fault must contain, in Fault's order (none: no error).
constexpr const char* kExpectedWords[] = {
    "",                                         // none
    "routing num_experts (",                    // routing_experts
    "routing top_k (",                          // routing_top_k
    "fp8_e4m3_block",                           // quantized
    "hidden must be a 2-D [T, H] bf16 tensor",  // hidden_dtype
    "out shape (",                              // out_width
    "logits.shape[1] (",                        // logits_width
    "logits.shape[0] (",                        // logits_rows
    "replay.shape[1] (",                        // replay_width
    "max_tokens (",                             // too_many_tokens
    "max_tokens (0)",                           // zero_max_tokens
    "'nonexistent'",                            // unknown_backend
    "bias",                                     // bias_size
    "w2 (",                                     // w2_shape
    "must be hidden itself (in place)",         // out_overlaps
};
static_assert(std::size(kExpectedWords) == static_cast<size_t>(Fault::count));

const char* expected_words(Fault f) {
  return kExpectedWords[static_cast<int>(f)];
}

void run_case(Bytes& in) {
  const Fault fault =
      in.chance(70) ? Fault::none : static_cast<Fault>(1 + in.pick(static_cast<int>(Fault::count) - 1));
  static const int kExperts[] = {2, 3, 4, 8};
  const int E = kExperts[in.pick(4)], K = 1 + in.pick(std::min(E, 3)), S = in.pick(2);
  const int H = 8 * (1 + in.pick(2)), I = 8 * (1 + in.pick(2));
  RoutingConfig routing = make_routing_config(static_cast<RoutingMethod>(in.pick(5)), E, K, S, in.chance(50));
  if (routing.method == RoutingMethod::llama4) routing.top_k = 1;
  if (routing.method == RoutingMethod::sigmoid_grouped && E % 2 == 0 && in.chance(50)) {
    routing.n_group = 2;
    routing.topk_group = E / 2 >= routing.top_k ? 1 + in.pick(2) : 2;
  }
  routing.routed_scaling_factor = in.chance(50) ? 1.0f : 2.5f;
  ExpertConfig experts = make_expert_config(E, routing.top_k, H, I, S, static_cast<Activation>(in.pick(3)),
                                            static_cast<GateUpLayout>(in.pick(3)));
  experts.routing_weight_on_input = in.chance(25);
  if (fault == Fault::routing_experts || fault == Fault::routing_top_k) {  // a routing config valid on its own
    routing.n_group = routing.topk_group = 1;
    if (routing.method == RoutingMethod::llama4) routing.method = RoutingMethod::pre_scored;
    if (fault == Fault::routing_experts) routing.num_experts = E == 8 ? 4 : 8;
    if (fault == Fault::routing_top_k) routing.top_k = routing.top_k == 1 ? 2 : 1;
  }
  QuantConfig quant;
  if (fault == Fault::quantized) quant.weight_format = WeightFormat::fp8_e4m3_block;
  const bool expert_biases = in.chance(50), routing_bias = in.chance(50);

  const int Ew = E + S;
  const int64_t max_tokens = 1 + in.pick(12);
  const int64_t T = fault == Fault::too_many_tokens ? max_tokens + 1 : in.pick(static_cast<int>(max_tokens) + 1);
  auto values = [&](int64_t n) { return fuzz::bf16_values(in, n); };
  std::vector<uint16_t> w13 = values(int64_t{Ew} * 2 * I * H), w2 = values(int64_t{Ew} * H * I);
  std::vector<uint16_t> b13 = values(int64_t{Ew} * 2 * I), b2 = values(int64_t{Ew} * H);
  std::vector<uint16_t> bias = values(E + 1);
  std::vector<float> hidden_f(static_cast<size_t>(std::max<int64_t>(T * H, 1)));
  std::vector<uint16_t> hidden = values(T * H);
  for (size_t i = 0; i < hidden_f.size() && i < hidden.size(); ++i) hidden_f[i] = bf16_to_float(hidden[i]);
  std::vector<float> logits(static_cast<size_t>(std::max<int64_t>(T * (E + 1), 1)));
  for (float& l : logits) l = small_value(in);
  std::vector<uint16_t> out(static_cast<size_t>(std::max<int64_t>(T * (H + 8), 1)), 0x7fc0);
  // In place, or the overlap fault: hidden's values at the start of a buffer with room for a shifted out.
  const bool in_place = fault == Fault::none && in.chance(25);
  const int64_t shift = fault == Fault::out_overlaps && T * H > 1 ? 1 + in.pick(static_cast<int>(T * H - 1)) : 0;
  std::vector<uint16_t> shared(static_cast<size_t>(std::max<int64_t>(2 * T * H, 1)), 0x7fc0);
  std::copy(hidden.begin(), hidden.end(), shared.begin());
  std::vector<int16_t> replay(static_cast<size_t>(std::max<int64_t>(T * (experts.top_k + 1), 1)), -1);
  const bool with_replay = in.chance(50) || fault == Fault::replay_width;

  LayerWeights weights;
  weights.experts.w13 = TensorView::contiguous(w13.data(), DType::bf16, {Ew, 2 * I, H});
  weights.experts.w2 = TensorView::contiguous(w2.data(), DType::bf16, {Ew, H, fault == Fault::w2_shape ? I / 2 : I});
  if (expert_biases) {
    weights.experts.b13 = TensorView::contiguous(b13.data(), DType::bf16, {Ew, 2 * I});
    weights.experts.b2 = TensorView::contiguous(b2.data(), DType::bf16, {Ew, H});
  }
  if (routing_bias || fault == Fault::bias_size)
    weights.routing_bias = TensorView::contiguous(bias.data(), DType::bf16, {fault == Fault::bias_size ? E + 1 : E});
  const TensorView hidden_view = fault == Fault::hidden_dtype
                                     ? TensorView::contiguous(hidden_f.data(), DType::f32, {T, H})
                                     : TensorView::contiguous(hidden.data(), DType::bf16, {T, H});
  const int64_t logit_rows = fault == Fault::logits_rows && T > 0 ? T - 1 : T;
  const int logit_width = fault == Fault::logits_width ? E + 1 : E;
  const TensorView logits_view = TensorView::contiguous(logits.data(), DType::f32, {logit_rows, logit_width});
  const TensorView shared_view = TensorView::contiguous(shared.data(), DType::bf16, {T, H});
  const TensorView out_view =
      in_place || fault == Fault::out_overlaps
          ? TensorView::contiguous(shared.data() + shift, DType::bf16, {T, H})
          : TensorView::contiguous(out.data(), DType::bf16, {T, fault == Fault::out_width ? H + 8 : H});
  const TensorView forward_hidden = in_place || fault == Fault::out_overlaps ? shared_view : hidden_view;
  const int replay_width = fault == Fault::replay_width ? experts.top_k + 1 : experts.top_k;
  const TensorView replay_view =
      with_replay ? TensorView::contiguous(replay.data(), DType::i16, {T, replay_width}) : TensorView{};
  LayerOptions options{.max_tokens = fault == Fault::zero_max_tokens ? 0 : max_tokens};
  if (fault == Fault::unknown_backend)
    options.backends = {"nonexistent"};
  else if (in.chance(50))
    options.backends = {"reference"};

  // A fault that the chosen shapes happen to cure (no rows to drop) is no fault.
  const bool faulty = fault != Fault::none && !(fault == Fault::logits_rows && T == 0) &&
                      !(fault == Fault::out_overlaps && shift == 0);
  try {
    MoELayer layer(experts, routing, quant, weights, options);
    layer.forward(forward_hidden, logits_view, out_view, nullptr, replay_view);
    fuzz::accepted(fuzz::outcomes(fuzz::Target::layer), !faulty,
                   " (fault " + std::to_string(static_cast<int>(fault)) + ")");

    // The same call by its parts: route() into a CPU plan, then experts_reference().
    RoutePlan plan(
        {.max_tokens = max_tokens, .num_experts = E, .top_k = experts.top_k, .num_shared_experts = S, .block = 1},
        Device::cpu());
    std::vector<int16_t> replay_want(replay.size(), -1);
    const TensorView replay_want_view =
        with_replay ? TensorView::contiguous(replay_want.data(), DType::i16, {T, experts.top_k}) : TensorView{};
    route(routing, logits_view, weights.routing_bias, plan, nullptr, replay_want_view);
    std::vector<uint16_t> want(out.size(), 0x7fc0);
    experts_reference(experts, weights.experts, hidden_view, plan.view(),
                      TensorView::contiguous(want.data(), DType::bf16, {T, H}), 1);
    const uint16_t* got = in_place || fault == Fault::out_overlaps ? shared.data() + shift : out.data();
    require(std::equal(got, got + T * H, want.begin()), "forward() differs from route + experts");
    require(replay == replay_want, "replay rows differ from route()'s");
  } catch (const Error& e) {
    const std::string what = e.what();
    const bool not_supported = dynamic_cast<const NotSupported*>(&e) != nullptr;
    const bool invalid = dynamic_cast<const InvalidArgument*>(&e) != nullptr;
    require(not_supported == (fault == Fault::quantized) && (invalid || not_supported),
            "the error's kind for fault " + std::to_string(static_cast<int>(fault)) + ": " + what);
    require(what.find(expected_words(fault)) != std::string::npos,
            "the error of fault " + std::to_string(static_cast<int>(fault)) + " does not name it: " + what);
    if (not_supported) {
      ++fuzz::outcomes(fuzz::Target::layer).rejected;
    } else {
      fuzz::rejected(fuzz::outcomes(fuzz::Target::layer), !faulty, what, "");
    }
  }
}

}  // namespace

void moekit::fuzz::layer_input(const uint8_t* data, size_t size) {
  Bytes in(data, size);
  run_case(in);
}

MOEKIT_FUZZ_ENTRY(layer_input)

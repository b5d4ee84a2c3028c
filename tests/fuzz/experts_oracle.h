// The experts' contract (include/moekit/experts.h) computed in double, for the fuzz targets that check an output
// against it: out[t] = sum_j w[t, j] * (W2 act(W13 x_t + b13) + b2) over the slots whose expert is held here, with a
// bound on how far an fp32 computation rounded once to bf16 may land from it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <vector>

#include "fuzz_support.h"
#include "moekit/dtype.h"
#include "moekit/experts.h"

namespace moekit::fuzz {

/// One activation in double, from the formulas of ActivationParams.
inline double contract_activation(const ExpertConfig& cfg, double gate, double up) {
  const ActivationParams& p = cfg.act;
  switch (cfg.activation) {
    case Activation::silu_gated:
      return gate / (1.0 + std::exp(-gate)) * up;
    case Activation::swiglu_clamped: {
      const double g = std::min<double>(gate, p.limit), u = std::clamp<double>(up, -p.limit, p.limit);
      return g / (1.0 + std::exp(-p.alpha * g)) * (u + p.beta);
    }
    case Activation::gelu_gated: {
      const double k = std::sqrt(2.0 / std::numbers::pi);
      return 0.5 * gate * (1.0 + std::tanh(k * (gate + 0.044715 * gate * gate * gate))) * up;
    }
  }
  violation("unknown activation accepted");
}

/// Row of w13 holding gate (which = 0) or up (which = 1) of intermediate column i.
inline int64_t contract_w13_row(GateUpLayout layout, int64_t I, int64_t i, int which) {
  switch (layout) {
    case GateUpLayout::gate_first:
      return which * I + i;
    case GateUpLayout::up_first:
      return (1 - which) * I + i;
    case GateUpLayout::interleaved:
      return 2 * i + which;
  }
  violation("unknown gate/up layout accepted");
}

/// A call's tensors as host arrays: weights of cfg.weight_experts() experts (bf16 bits), optional fp32 biases (null:
/// none), hidden [T, H] (bf16 bits), and the plan's ids and weights [T, K + S].
struct ContractCall {
  const ExpertConfig* cfg = nullptr;
  const uint16_t* w13 = nullptr;
  const uint16_t* w2 = nullptr;
  const float* b13 = nullptr;
  const float* b2 = nullptr;
  const uint16_t* x = nullptr;
  const int32_t* ids = nullptr;
  const float* weights = nullptr;
  int64_t tokens = 0;
};

/// want[t * H + h] in double, and bound[t * H + h]: `rounding` times the size of the terms (so it survives
/// cancellation; the output's bf16 rounding is 2^-9 of it) plus each activation's fp32 error, a few ulp of 1 per unit
/// of its inputs (gelu_tanh's 1 + tanh() cancels far below zero, a loss of about 1e-7 * |gate| * |up|).
inline void contract_output(const ContractCall& c, double rounding, std::vector<double>& want,
                            std::vector<double>& bound) {
  const ExpertConfig& cfg = *c.cfg;
  const int E = cfg.num_experts, Kt = cfg.top_k + cfg.num_shared_experts, local = cfg.local_experts();
  const int64_t H = cfg.hidden, I = cfg.intermediate;
  want.assign(static_cast<size_t>(c.tokens * H), 0.0);
  bound.assign(want.size(), 0.0);
  std::vector<double> a(static_cast<size_t>(I)), a_err(static_cast<size_t>(I));
  const double alpha = cfg.activation == Activation::swiglu_clamped ? std::abs(double{cfg.act.alpha}) : 0.0;
  for (int64_t t = 0; t < c.tokens; ++t) {
    for (int j = 0; j < Kt; ++j) {
      const int32_t id = c.ids[t * Kt + j];
      const int64_t le = id >= E ? local + (id - E) : int64_t{id} - cfg.local_expert_offset;
      if (id < E && (le < 0 || le >= local)) continue;  // another rank's expert
      // A routed slot's weight scales the expert's input under routing_weight_on_input, its output otherwise.
      const double wt = c.weights[t * Kt + j];
      const bool on_input = cfg.routing_weight_on_input && id < E;
      const double in_scale = on_input ? wt : 1.0, out_scale = on_input ? 1.0 : wt;
      for (int64_t i = 0; i < I; ++i) {
        double gu[2], size[2];
        for (int which = 0; which < 2; ++which) {
          const int64_t row = le * 2 * I + contract_w13_row(cfg.gate_up, I, i, which);
          double sum = c.b13 ? double{c.b13[row]} : 0.0, abs_sum = std::abs(sum);
          for (int64_t k = 0; k < H; ++k) {
            const double term =
                double{bf16_to_float(c.w13[row * H + k])} * (in_scale * bf16_to_float(c.x[t * H + k]));
            sum += term;
            abs_sum += std::abs(term);
          }
          gu[which] = sum;
          size[which] = abs_sum;
        }
        a[i] = contract_activation(cfg, gu[0], gu[1]);
        a_err[i] = 1e-6 * (1.0 + size[0]) * (1.0 + size[1]) * (1.0 + alpha);
      }
      for (int64_t h = 0; h < H; ++h) {
        double y = c.b2 ? double{c.b2[le * H + h]} : 0.0, mag = std::abs(y), err = 0.0;
        for (int64_t i = 0; i < I; ++i) {
          const double w = bf16_to_float(c.w2[(le * H + h) * I + i]);
          y += w * a[i];
          mag += std::abs(w * a[i]);
          err += std::abs(w) * a_err[i];
        }
        want[t * H + h] += out_scale * y;
        bound[t * H + h] += std::abs(out_scale) * (rounding * mag + err);
      }
    }
  }
}

}  // namespace moekit::fuzz

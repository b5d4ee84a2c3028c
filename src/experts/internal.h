// Internals of the expert-compute reference shared between its translation units and its tests: the throw and the
// tensor check behind every "experts" validation message, the rows of w13 holding gate(i) and up(i) in each
// arrangement, and the reference with an explicit token-chunk size (so tests can exercise the chunked path, which
// real sizes only reach with very large T).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include "moekit/experts.h"
#include "moekit/tensor.h"

namespace moekit::detail {

/// Throws InvalidArgument with op "experts" and `message` (written "<name> (<value>) must be <rule>").
[[noreturn]] void fail_experts(const std::string& message);

/// Throws InvalidArgument unless `t` is present, has exactly the extents `dims` (written `symbols` in the
/// header's notation, e.g. "[E', 2I, H]"), is bf16 (or fp32 when `allow_fp32`), contiguous, non-null when not
/// empty, and on `device`. Checks in that order; the first failure names the rule:
/// "<name> (<describe()>) must be <rule>".
void check_expert_tensor(const TensorView& t, std::string_view name, std::string_view symbols,
                         std::initializer_list<int64_t> dims, bool allow_fp32, Device device);

/// Rows of w13 (among an expert's 2I) holding gate and up column i of the intermediate activation.
struct GateUpRows {
  int64_t gate, up;
};
inline GateUpRows gate_up_rows(GateUpLayout layout, int64_t i, int64_t inter) {
  switch (layout) {
    case GateUpLayout::gate_first:
      return {i, inter + i};
    case GateUpLayout::up_first:
      return {inter + i, i};
    case GateUpLayout::interleaved:
      return {2 * i, 2 * i + 1};
  }
  return {i, inter + i};
}

/// experts_reference processing at most `chunk_tokens` tokens at a time, or (0) as many as keep its fp32 scratch
/// to about 128 MiB, which is what experts_reference does. The result does not depend on the chunk size.
void experts_reference_chunked(const ExpertConfig& cfg, const ExpertWeights& weights, const TensorView& hidden,
                               const RoutePlanView& plan, const TensorView& out, int threads, int64_t chunk_tokens);

}  // namespace moekit::detail

// rearrange_gate_up(): w13 / b13 rows from one gate/up arrangement into another, in host memory (for checkpoints
// rearranged at load time; the interleaved arrangement lets GEMM1 apply the activation in its epilogue).
#include <fmt/format.h>

#include <cstring>
#include <utility>

#include "experts/internal.h"
#include "moekit/error.h"
#include "moekit/experts.h"

namespace moekit {
namespace {

using detail::fail_experts;

void check_view(const TensorView& t, const char* name) {
  if (!t.present()) fail_experts(fmt::format("{} must be present", name));
  if (!t.device.is_cpu()) fail_experts(fmt::format("{} ({}) must be in host memory", name, t.describe()));
  if (t.ndim != 2 && t.ndim != 3)
    fail_experts(fmt::format("{} ({}) must be [E', 2I, H] or [E', 2I]", name, t.describe()));
  if (!t.is_contiguous()) fail_experts(fmt::format("{} ({}) must be contiguous", name, t.describe()));
  if (t.numel() > 0 && t.data == nullptr) fail_experts(fmt::format("{} ({}) must not be null", name, t.describe()));
  if (t.size(1) % 2 != 0) fail_experts(fmt::format("{} ({}) must have an even dim 1 (2I)", name, t.describe()));
}

}  // namespace

void rearrange_gate_up(const TensorView& src, GateUpLayout from, const TensorView& dst, GateUpLayout to) {
  for (const auto& [name, layout] : {std::pair{"from", from}, std::pair{"to", to}})
    if (gate_up_layout_name(layout) == "unknown")
      fail_experts(fmt::format("{} ({}) must be a known gate/up layout", name, static_cast<int>(layout)));
  check_view(src, "src");
  check_view(dst, "dst");
  if (dst.dtype != src.dtype || dst.ndim != src.ndim || dst.shape != src.shape)
    fail_experts(fmt::format("dst ({}) must have the shape and dtype of src ({})", dst.describe(), src.describe()));
  const int64_t row = (src.ndim == 3 ? src.size(2) : 1) * dtype_size(src.dtype);  // bytes per gate or up row
  if (dst.overlaps(src)) fail_experts("dst must not overlap src");
  const auto* s = static_cast<const unsigned char*>(src.data);
  auto* d = static_cast<unsigned char*>(dst.data);
  const int64_t experts = src.size(0), inter = src.size(1) / 2;
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t base = e * 2 * inter;
    for (int64_t i = 0; i < inter; ++i) {
      const detail::GateUpRows in = detail::gate_up_rows(from, i, inter), out = detail::gate_up_rows(to, i, inter);
      std::memcpy(d + (base + out.gate) * row, s + (base + in.gate) * row, row);
      std::memcpy(d + (base + out.up) * row, s + (base + in.up) * row, row);
    }
  }
}

}  // namespace moekit

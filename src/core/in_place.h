// The rules for buffers that may or must not share bytes: an output that may replace its input (MoE layers and
// experts write `out` after their last read of `hidden`, so out may be hidden itself), and buffers that must be
// apart (replay and the tensors read or written around it). Shared by every backend, so they reject alike.
#pragma once

#include <string>
#include <string_view>

#include "moekit/tensor.h"

namespace moekit::detail {

/// Empty when `out` is `in` itself (same first byte) or shares no byte with it; otherwise the broken rule, e.g.
/// "out ([4, 16] bf16 cpu) must be hidden itself (in place) or share no byte with it; it starts 64 bytes after
/// hidden". For two views of the same shape and dtype.
std::string in_place_problem(const TensorView& out, std::string_view out_name, const TensorView& in,
                             std::string_view in_name);

/// Empty when `a` shares no byte with `b`; otherwise "a ([4, 2] int16 cpu) must share no byte with b".
std::string shared_bytes_problem(const TensorView& a, std::string_view a_name, const TensorView& b,
                                 std::string_view b_name);

}  // namespace moekit::detail

// Whether a stream is capturing a CUDA graph: work that times kernels or synchronizes (the tuner) must not start
// then, since a capture forbids both.
#pragma once

#include "moekit/tensor.h"

namespace moekit::detail {

/// True when `stream` is capturing, or when the query itself fails (e.g. the legacy stream while another stream
/// captures in global mode): either way no synchronizing work may be issued. False without CUDA.
bool stream_is_capturing(Stream stream);

}  // namespace moekit::detail

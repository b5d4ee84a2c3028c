// Device helpers shared by the expert kernels: the global-id -> weight-index map, 8 x bf16 (16-byte) vector
// loads and stores, bias reads in either dtype, the gate/up column mapping of each w13 layout, and the gated
// activations (the same definitions as moekit::apply_activation, with a fast exp: error far under bf16).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "experts/cuda/experts_kernels.h"

namespace moekit::detail {

/// Programmatic dependent launch: a kernel started by launch_dependent() may begin while its predecessor in the
/// stream is still running (once every predecessor CTA has called allow_dependents() or exited). It must call
/// wait_for_predecessor() before it touches anything the predecessor writes; everything launched before the
/// predecessor is complete and visible from the start. A predecessor that never calls allow_dependents() makes
/// this an ordinary launch.
__device__ __forceinline__ void wait_for_predecessor() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}
__device__ __forceinline__ void allow_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" :::);
}

template <class Params>
void launch_dependent(void (*kernel)(Params), dim3 grid, dim3 block, Stream stream, const Params& p,
                      const char* what) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.stream = static_cast<cudaStream_t>(stream);
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attr;
  config.numAttrs = 1;
  cudaLaunchKernelEx(&config, kernel, p);
  check_launch(what);
}

/// Whether slot id `id` names a routed expert (ids >= E are the fused shared experts).
__device__ __forceinline__ bool routed_expert(const ExpertMap& m, int id) {
  return id < m.num_experts;
}

__device__ __forceinline__ int local_expert(const ExpertMap& m, int id) {
  if (!routed_expert(m, id)) return m.local_count + (id - m.num_experts);  // shared expert
  const int l = id - m.local_offset;
  return (l >= 0 && l < m.local_count) ? l : -1;
}

struct Bf16x8 {
  float v[8];
};

__device__ __forceinline__ Bf16x8 load_bf16x8(const void* p) {
  const uint4 raw = *static_cast<const uint4*>(p);
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
  Bf16x8 r;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    r.v[2 * i] = f.x;
    r.v[2 * i + 1] = f.y;
  }
  return r;
}

__device__ __forceinline__ void store_bf16x8(void* p, const float (&v)[8]) {
  uint4 raw;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
  *static_cast<uint4*>(p) = raw;
}

__device__ __forceinline__ float load_bias(const BiasRef& b, int64_t index) {
  if (b.data == nullptr) return 0.0f;
  if (b.is_bf16) return __bfloat162float(static_cast<const __nv_bfloat16*>(b.data)[index]);
  return static_cast<const float*>(b.data)[index];
}

/// b[0..7] = bias[index .. index + 7] (zeros without a bias): 16-byte loads where the address allows.
__device__ __forceinline__ void load_bias8(const BiasRef& b, int64_t index, float (&out)[8]) {
  if (b.data == nullptr) {
#pragma unroll
    for (int j = 0; j < 8; ++j) out[j] = 0.0f;
    return;
  }
  if (b.is_bf16) {
    const __nv_bfloat16* q = static_cast<const __nv_bfloat16*>(b.data) + index;
    if (reinterpret_cast<uintptr_t>(q) % 16 == 0) {
      const Bf16x8 v = load_bf16x8(q);
#pragma unroll
      for (int j = 0; j < 8; ++j) out[j] = v.v[j];
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) out[j] = __bfloat162float(q[j]);
    }
  } else {
    const float* q = static_cast<const float*>(b.data) + index;
    if (reinterpret_cast<uintptr_t>(q) % 16 == 0) {
      const float4 lo = *reinterpret_cast<const float4*>(q), hi = *reinterpret_cast<const float4*>(q + 4);
      out[0] = lo.x, out[1] = lo.y, out[2] = lo.z, out[3] = lo.w;
      out[4] = hi.x, out[5] = hi.y, out[6] = hi.z, out[7] = hi.w;
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) out[j] = q[j];
    }
  }
}

/// Column of gate(i) and up(i) inside the 2I outputs of GEMM1.
__device__ __forceinline__ int gate_column(GateUpLayout l, int i, int inter) {
  return l == GateUpLayout::gate_first ? i : (l == GateUpLayout::up_first ? inter + i : 2 * i);
}
__device__ __forceinline__ int up_column(GateUpLayout l, int i, int inter) {
  return l == GateUpLayout::gate_first ? inter + i : (l == GateUpLayout::up_first ? i : 2 * i + 1);
}

/// 1 / (1 + e^-x) with the approximate exp and reciprocal (a few ulp; 0 for x < -87, where the exact value is
/// below 1e-38).
__device__ __forceinline__ float sigmoid_fast(float x) {
  return __fdividef(1.0f, 1.0f + __expf(-x));
}

/// The three gated activations as one branch-free formula: g sigmoid(g (slope + cubic min(g^2, 1e4))) (u + beta),
/// where swiglu_clamped first clamps g <= limit and u to [-limit, limit]. silu_gated is slope 1; swiglu_clamped
/// slope alpha and its beta; gelu_gated's tanh form 0.5 g (1 + tanh z), z = sqrt(2/pi) (g + 0.044715 g^3), is
/// g sigmoid(2z): slope 2 sqrt(2/pi), cubic 2 sqrt(2/pi) 0.044715. Kernels that unroll it many times (the fused
/// gated epilogue: 64 values per thread and tile) then carry one copy of the arithmetic, not three behind a switch,
/// which overflowed the instruction cache. min(g^2, 1e4) keeps 0 * g^2 finite; the cubic term matters only where
/// |g| < 100, beyond which the sigmoid has saturated either way.
struct GatedActivation {
  float slope = 1.0f, cubic = 0.0f, beta = 0.0f, limit = 0.0f;
  bool clamped = false;
};

__host__ __device__ inline GatedActivation gated_activation_form(Activation a, const ActivationParams& p) {
  constexpr float kTwoSqrt2OverPi = 1.5957691216057308f;
  GatedActivation f;
  if (a == Activation::swiglu_clamped) {
    f.slope = p.alpha;
    f.beta = p.beta;
    f.limit = p.limit;
    f.clamped = true;
  } else if (a == Activation::gelu_gated) {
    f.slope = kTwoSqrt2OverPi;
    f.cubic = kTwoSqrt2OverPi * 0.044715f;
  }
  return f;
}

__device__ __forceinline__ float gated_activation(const GatedActivation& f, float gate, float up) {
  const float g = f.clamped ? fminf(gate, f.limit) : gate;
  const float u = f.clamped ? fminf(fmaxf(up, -f.limit), f.limit) : up;
  return g * sigmoid_fast(g * fmaf(f.cubic, fminf(g * g, 1e4f), f.slope)) * (u + f.beta);
}

}  // namespace moekit::detail

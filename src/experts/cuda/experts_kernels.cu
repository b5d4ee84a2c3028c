// The grouped path's memory-bound stages: gather (hidden rows into the plan's grouped order), bias + gated
// activation over GEMM1's [rows, 2I] output, and the deterministic combine. One CTA per row (per token for the
// combine), 16-byte vectors across its threads. The grid covers the host's bound on the rows for this T; rows past
// the plan's device-side extent, padding rows and other ranks' rows return at once, so nothing needs a host sync.
#include <cuda_runtime.h>

#include "experts/cuda/experts_device.cuh"

namespace moekit::detail {
namespace {

constexpr int kRowThreads = 128;

__global__ void __launch_bounds__(kRowThreads) gather_rows_kernel(GatherParams p) {
  const int64_t row = blockIdx.x;
  if (row_local_expert(p.plan, p.map, row) < 0) return;
  const int64_t token = p.plan.sorted_slots[row] / p.plan.slots;
  const uint4* src = static_cast<const uint4*>(p.hidden) + token * (p.hidden_size / 8);
  uint4* dst = static_cast<uint4*>(p.a1) + row * (p.hidden_size / 8);
  for (int v = threadIdx.x; v < p.hidden_size / 8; v += kRowThreads) dst[v] = src[v];
}

__global__ void __launch_bounds__(kRowThreads) activation_rows_kernel(ActivationKernelParams p) {
  const int64_t row = blockIdx.x;
  const int expert = row_local_expert(p.plan, p.map, row);
  if (expert < 0) return;
  const int inter = p.intermediate;
  const __nv_bfloat16* c1 = static_cast<const __nv_bfloat16*>(p.c1) + row * 2 * inter;
  const int64_t bias_base = static_cast<int64_t>(expert) * 2 * inter;
  for (int i0 = threadIdx.x * 8; i0 < inter; i0 += kRowThreads * 8) {
    float gate[8], up[8];
    if (p.layout == GateUpLayout::interleaved) {
      const Bf16x8 lo = load_bf16x8(c1 + 2 * i0), hi = load_bf16x8(c1 + 2 * i0 + 8);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        gate[j] = lo.v[2 * j], up[j] = lo.v[2 * j + 1];
        gate[4 + j] = hi.v[2 * j], up[4 + j] = hi.v[2 * j + 1];
      }
    } else {
      const Bf16x8 g = load_bf16x8(c1 + gate_column(p.layout, i0, inter));
      const Bf16x8 u = load_bf16x8(c1 + up_column(p.layout, i0, inter));
#pragma unroll
      for (int j = 0; j < 8; ++j) gate[j] = g.v[j], up[j] = u.v[j];
    }
    float out[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float g = gate[j] + load_bias(p.b13, bias_base + gate_column(p.layout, i0 + j, inter));
      const float u = up[j] + load_bias(p.b13, bias_base + up_column(p.layout, i0 + j, inter));
      out[j] = gated_activation(p.activation, p.act_params, g, u);
    }
    store_bf16x8(static_cast<__nv_bfloat16*>(p.act) + row * inter + i0, out);
  }
}

constexpr int kCombineThreads = 128;
// Slots whose rows are loaded before any is added (latency, not bandwidth, rules at small T).
constexpr int kCombineBatch = 8;

// One CTA per (token, kCombineThreads * 8 columns): several CTAs per token keep a single token's latency short.
__global__ void __launch_bounds__(kCombineThreads) combine_kernel(CombineParams p) {
  const int64_t t = blockIdx.x;
  const int kt = p.plan.slots;
  __shared__ int s_row[32];
  __shared__ int s_expert[32];
  __shared__ float s_weight[32];
  if (threadIdx.x < kt) {
    const int64_t slot = t * kt + threadIdx.x;
    s_expert[threadIdx.x] = local_expert(p.map, p.plan.topk_ids[slot]);
    s_row[threadIdx.x] = p.plan.slot_rows[slot];
    s_weight[threadIdx.x] = p.plan.topk_weights[slot];
  }
  __syncthreads();
  wait_for_predecessor();  // y comes from GEMM2; the plan was complete before GEMM2 let this kernel start
  const int h = p.hidden;
  const int c0 = (blockIdx.y * kCombineThreads + threadIdx.x) * 8;
  if (c0 >= h) return;
  const __nv_bfloat16* y = static_cast<const __nv_bfloat16*>(p.y);
  float acc[8] = {};
  for (int j0 = 0; j0 < kt; j0 += kCombineBatch) {
    uint4 v[kCombineBatch];
#pragma unroll
    for (int b = 0; b < kCombineBatch; ++b) {
      const int j = j0 + b;
      v[b] = j < kt && s_expert[j] >= 0 ? *reinterpret_cast<const uint4*>(y + static_cast<int64_t>(s_row[j]) * h + c0)
                                        : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int b = 0; b < kCombineBatch; ++b) {  // slot order: the sum is deterministic
      const int j = j0 + b;
      if (j >= kt || s_expert[j] < 0) continue;
      const __nv_bfloat162* yh = reinterpret_cast<const __nv_bfloat162*>(&v[b]);
      const float w = s_weight[j];
      const int64_t bias = static_cast<int64_t>(s_expert[j]) * h + c0;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 f = __bfloat1622float2(yh[i]);
        acc[2 * i] += w * (f.x + load_bias(p.b2, bias + 2 * i));
        acc[2 * i + 1] += w * (f.y + load_bias(p.b2, bias + 2 * i + 1));
      }
    }
  }
  store_bf16x8(static_cast<__nv_bfloat16*>(p.out) + t * h + c0, acc);
}

}  // namespace

void launch_gather(const GatherParams& p, Stream stream) {
  if (p.plan.capacity == 0) return;
  gather_rows_kernel<<<static_cast<unsigned>(p.plan.capacity), kRowThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      p);
  check_launch("gather_rows_kernel");
}

void launch_activation(const ActivationKernelParams& p, Stream stream) {
  if (p.plan.capacity == 0) return;
  activation_rows_kernel<<<static_cast<unsigned>(p.plan.capacity), kRowThreads, 0,
                           static_cast<cudaStream_t>(stream)>>>(p);
  check_launch("activation_rows_kernel");
}

void launch_combine(const CombineParams& p, Stream stream) {
  if (p.plan.tokens == 0) return;
  const dim3 grid(static_cast<unsigned>(p.plan.tokens),
                  static_cast<unsigned>((p.hidden + kCombineThreads * 8 - 1) / (kCombineThreads * 8)));
  launch_dependent(combine_kernel, grid, dim3(kCombineThreads), stream, p, "combine_kernel");
}

}  // namespace moekit::detail

// Expert-parallel kernels: the all-to-all dispatch table (one CTA per destination, cub::BlockScan over tokens in
// chunks, so rows keep ascending token order), row packing with 16-byte copies, receiver scores, shared-slot
// masking, the fp32 all-to-all combine, and a counter-hash fill. Every kernel reads its row counts on the device,
// so nothing here needs the host to know how many rows moved.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cub/block/block_scan.cuh>
#include <string>

#include "moekit/error.h"
#include "parallel/ep_bookkeeping.h"
#include "parallel/ep_kernels.h"

namespace moekit::ep_detail {
namespace {

constexpr int kScanThreads = 256;
constexpr int kRowThreads = 128;

void check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)  // no fmt here: its consteval format strings do not compile under nvcc
    throw CudaError("ep", std::string(what) + " launch failed: " + cudaGetErrorString(err));
}

__global__ void __launch_bounds__(kScanThreads) ep_dispatch_scan_kernel(DispatchParams p) {
  using Scan = cub::BlockScan<int, kScanThreads>;
  __shared__ typename Scan::TempStorage tmp;
  __shared__ int carry;
  const int d = blockIdx.x;
  const int kt = p.K + p.S;
  if (threadIdx.x == 0) carry = 0;
  __syncthreads();
  for (int64_t base = 0; base < p.tokens; base += kScanThreads) {
    const int64_t t = base + threadIdx.x;
    int flag = 0;
    if (t < p.tokens) flag = (ep::dest_mask(p.ids + t * kt, p.K, p.S, p.E, p.W, p.self) >> d) & 1u;
    int pos = 0, total = 0;
    Scan(tmp).ExclusiveSum(flag, pos, total);
    pos += carry;
    if (t < p.tokens) {
      p.token_pos[t * p.W + d] = flag ? pos : -1;
      if (flag) p.send_token[d * p.tokens + pos] = static_cast<int32_t>(t);
    }
    __syncthreads();  // everyone has read carry and the scan storage
    if (threadIdx.x == 0) carry += total;
    __syncthreads();
  }
  if (threadIdx.x == 0) p.send_count[d] = carry;
}

__global__ void __launch_bounds__(kRowThreads) ep_pack_rows_kernel(PackParams p) {
  const int64_t i = blockIdx.x;
  const int d = blockIdx.y;
  if (i >= p.send_count[d]) return;
  const int64_t row = d * p.tokens + i;
  const int64_t t = p.send_token[row];
  const uint4* src = reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(p.hidden) + t * p.hidden_size);
  uint4* dst = reinterpret_cast<uint4*>(static_cast<__nv_bfloat16*>(p.send_hidden) + row * p.hidden_size);
  for (int64_t c = threadIdx.x; c < p.hidden_size / 8; c += kRowThreads) dst[c] = src[c];
  const int mw = ep::meta_width(p.K);
  if (threadIdx.x < p.K) {
    p.send_meta[row * mw + threadIdx.x] = p.ids[t * p.Kt + threadIdx.x];
    p.send_meta[row * mw + p.K + threadIdx.x] = __float_as_int(p.weights[t * p.Kt + threadIdx.x]);
  }
}

__global__ void __launch_bounds__(kRowThreads) ep_receiver_scores_kernel(ScoresParams p) {
  const int64_t row = blockIdx.x;
  const bool real = row % p.tokens < p.counts[row / p.tokens];
  float* sc = p.scores + row * p.E;
  for (int e = threadIdx.x; e < p.E; e += kRowThreads)
    sc[e] = !real && ep::is_inert_expert(e, p.E, p.local_offset, p.local_count, p.K) ? 1.0f : -INFINITY;
  __syncthreads();  // the -inf fill lands before the K weights overwrite it
  const int mw = ep::meta_width(p.K);
  if (real && threadIdx.x < p.K) {
    const int e = p.meta[row * mw + threadIdx.x];
    if (e >= 0 && e < p.E) sc[e] = __int_as_float(p.meta[row * mw + p.K + threadIdx.x]);
  }
}

__global__ void ep_mask_shared_kernel(MaskSharedParams p) {
  const int64_t row = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (row >= p.rows || ep::keeps_shared(row, p.tokens, p.self)) return;
  for (int j = p.K; j < p.Kt; ++j) p.weights[row * p.Kt + j] = 0.0f;
}

__global__ void __launch_bounds__(kRowThreads) ep_combine_kernel(CombineParams p) {
  const int64_t t = blockIdx.x;
  __shared__ int pos[32];
  if (threadIdx.x < p.W) pos[threadIdx.x] = p.token_pos[t * p.W + threadIdx.x];
  __syncthreads();
  const auto* back = static_cast<const __nv_bfloat16*>(p.back);
  auto* out = static_cast<__nv_bfloat16*>(p.out);
  for (int64_t c = threadIdx.x * 2; c < p.hidden; c += kRowThreads * 2) {
    float2 acc = {0.0f, 0.0f};
    for (int d = 0; d < p.W; ++d) {  // rank order: deterministic
      if (pos[d] < 0) continue;
      const float2 v =
          __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(back + (d * p.tokens + pos[d]) * p.hidden + c));
      acc.x += v.x;
      acc.y += v.y;
    }
    *reinterpret_cast<__nv_bfloat162*>(out + t * p.hidden + c) = __floats2bfloat162_rn(acc.x, acc.y);
  }
}

__device__ __forceinline__ uint64_t mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

__global__ void ep_hash_fill_kernel(HashFillParams p) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < p.n; i += int64_t{gridDim.x} * blockDim.x) {
    const uint64_t h = mix64(p.seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(p.first_index + i));
    const float u = static_cast<float>(h >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    const float v = (2.0f * u - 1.0f) * p.scale;
    if (p.bf16)
      static_cast<__nv_bfloat16*>(p.p)[i] = __float2bfloat16_rn(v);
    else
      static_cast<float*>(p.p)[i] = v;
  }
}

cudaStream_t cu(Stream s) {
  return static_cast<cudaStream_t>(s);
}

}  // namespace

void launch_dispatch(const DispatchParams& p, Stream stream) {
  if (p.tokens == 0) return;
  ep_dispatch_scan_kernel<<<p.W, kScanThreads, 0, cu(stream)>>>(p);
  check_launch("ep_dispatch_scan_kernel");
}

void launch_pack(const PackParams& p, Stream stream) {
  if (p.tokens == 0) return;
  ep_pack_rows_kernel<<<dim3(static_cast<unsigned>(p.tokens), p.W), kRowThreads, 0, cu(stream)>>>(p);
  check_launch("ep_pack_rows_kernel");
}

void launch_scores(const ScoresParams& p, Stream stream) {
  if (p.tokens == 0) return;
  ep_receiver_scores_kernel<<<static_cast<unsigned>(p.W * p.tokens), kRowThreads, 0, cu(stream)>>>(p);
  check_launch("ep_receiver_scores_kernel");
}

void launch_mask_shared(const MaskSharedParams& p, Stream stream) {
  if (p.rows == 0 || p.Kt == p.K) return;
  ep_mask_shared_kernel<<<static_cast<unsigned>((p.rows + 255) / 256), 256, 0, cu(stream)>>>(p);
  check_launch("ep_mask_shared_kernel");
}

void launch_combine(const CombineParams& p, Stream stream) {
  if (p.tokens == 0) return;
  ep_combine_kernel<<<static_cast<unsigned>(p.tokens), kRowThreads, 0, cu(stream)>>>(p);
  check_launch("ep_combine_kernel");
}

void launch_hash_fill(const HashFillParams& p, Stream stream) {
  if (p.n == 0) return;
  const int64_t blocks = std::min<int64_t>((p.n + 255) / 256, 65536);
  ep_hash_fill_kernel<<<static_cast<unsigned>(blocks), 256, 0, cu(stream)>>>(p);
  check_launch("ep_hash_fill_kernel");
}

}  // namespace moekit::ep_detail

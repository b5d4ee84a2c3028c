// EpLayer: one rank of the expert-parallel layer on an sm90 GPU. Construction validates, allocates the routing
// plans, the exchange buffers (W * max_tokens rows, zeroed once) and CudaExperts for the rank's local range.
// forward() enqueues, on the caller's stream, either
//   all_gather: copy logits into this rank's slab, all-gather logits and hidden, route all W*T tokens, mask the
//               shared slots of other ranks' tokens, local experts, reduce-scatter (bf16 sum) into out; or
//   all_to_all: route own tokens, dispatch table + packing, counts exchange, grouped send/recv of fixed-size slabs
//               (rows + ids/weights), receiver scores -> pre_scored plan, local experts, return trip, fp32 combine.
// Messages have a fixed size per T and row counts stay on the device: no host sync, capturable in CUDA graphs.
#include <fmt/format.h>

#include <memory>
#include <vector>

#include "core/in_place.h"
#include "moekit/device.h"
#include "moekit/error.h"
#include "moekit/expert_parallel.h"
#include "moekit/plan.h"

#if MOEKIT_HAS_CUDA
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "core/device_scope.h"
#include "parallel/ep_bookkeeping.h"
#include "parallel/ep_kernels.h"
#include "parallel/ep_validate.h"
#endif

namespace moekit {

#if MOEKIT_HAS_CUDA
namespace {

void ck(cudaError_t err, std::string_view call) {
  detail::check_cuda(err, "ep", call);
}

void nccl(ncclResult_t r, std::string_view call) {
  if (r != ncclSuccess) throw CudaError("ep", fmt::format("{} failed: {}", call, ncclGetErrorString(r)));
}

ncclDataType_t nccl_type(DType t) {
  return t == DType::bf16 ? ncclBfloat16 : ncclFloat32;
}

}  // namespace

struct EpLayer::Impl {
  EpLayerArgs args;
  ExpertConfig local;
  RoutingConfig receiver_routing;  // all_to_all: pre_scored over the received rows' scores
  int W = 1, r = 0, device = 0;
  ncclComm_t comm = nullptr;
  int64_t bytes = 0;
  std::unique_ptr<CudaExperts> experts;
  std::unique_ptr<RoutePlan> plan;      // all_gather: the W*T gathered tokens; all_to_all: the W*T received rows
  std::unique_ptr<RoutePlan> own_plan;  // all_to_all: this rank's T tokens
  std::vector<DeviceBuffer> buffers;
  // all_gather
  void* g_hidden = nullptr;  // [W*Tm, H] bf16
  void* g_logits = nullptr;  // [W*Tm, E] fp32 or bf16
  void* partial = nullptr;   // [W*Tm, H] bf16
  // all_to_all
  int32_t* send_token = nullptr;  // [W*Tm]
  int32_t* send_count = nullptr;  // [W]
  int32_t* recv_count = nullptr;  // [W]
  int32_t* token_pos = nullptr;   // [Tm*W]
  void* send_hidden = nullptr;    // [W*Tm, H] bf16
  int32_t* send_meta = nullptr;   // [W*Tm, 2K]
  void* recv_hidden = nullptr;    // [W*Tm, H] bf16
  int32_t* recv_meta = nullptr;   // [W*Tm, 2K]
  float* scores = nullptr;        // [W*Tm, E]
  void* recv_out = nullptr;       // [W*Tm, H] bf16
  void* back = nullptr;           // [W*Tm, H] bf16

  void* alloc(int64_t n) {
    buffers.emplace_back(static_cast<size_t>(std::max<int64_t>(n, 16)), device);
    ck(cudaMemset(buffers.back().data(), 0, buffers.back().bytes()), "cudaMemset");
    bytes += static_cast<int64_t>(buffers.back().bytes());
    return buffers.back().data();
  }

  void forward_all_gather(const TensorView& hidden, const TensorView& logits, const TensorView& out, Stream stream,
                          ExpertTactic tactic);
  void forward_all_to_all(const TensorView& hidden, const TensorView& logits, const TensorView& out, Stream stream,
                          ExpertTactic tactic);
};

EpLayer::EpLayer(const EpLayerArgs& a, const Communicator& comm) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  if (!comm.valid()) throw InvalidArgument("ep", "comm (empty) must hold an NCCL communicator");
  ep::validate_configs(a.experts, a.routing);
  if (a.mode != EpMode::all_gather && a.mode != EpMode::all_to_all)
    throw InvalidArgument("ep", fmt::format("mode ({}) must be all_gather or all_to_all", static_cast<int>(a.mode)));
  if (a.max_tokens < 1) throw InvalidArgument("ep", fmt::format("max_tokens ({}) must be >= 1", a.max_tokens));
  m.args = a;
  m.W = comm.world_size();
  m.r = comm.rank();
  m.device = comm.device();
  m.comm = static_cast<ncclComm_t>(comm.handle());
  m.local = rank_expert_config(a.experts, m.W, m.r);
  const Device dev = Device::cuda(m.device);
  validate_expert_weights(m.local, a.weights, dev);
  detail::CurrentDeviceScope scope(m.device, "ep");  // the allocations and zero fills below, on the rank's device

  const int E = a.experts.num_experts, K = a.experts.top_k, S = a.experts.num_shared_experts;
  const int64_t rows = m.W * a.max_tokens, H = a.experts.hidden;
  m.experts = std::make_unique<CudaExperts>(CudaExpertsArgs{m.local, a.weights, rows, a.block, dev});
  m.plan = std::make_unique<RoutePlan>(PlanShape{rows, E, K, S, a.block}, dev);
  if (a.mode == EpMode::all_gather) {
    m.g_hidden = m.alloc(rows * H * 2);
    m.g_logits = m.alloc(rows * E * 4);  // room for fp32; bf16 logits use half
    m.partial = m.alloc(rows * H * 2);
  } else {
    m.own_plan = std::make_unique<RoutePlan>(PlanShape{a.max_tokens, E, K, S, a.block}, dev);
    m.receiver_routing.method = RoutingMethod::pre_scored;
    m.receiver_routing.num_experts = E;
    m.receiver_routing.top_k = K;
    m.receiver_routing.num_shared_experts = S;
    const int64_t mw = ep::meta_width(K);
    m.send_token = static_cast<int32_t*>(m.alloc(rows * 4));
    m.send_count = static_cast<int32_t*>(m.alloc(m.W * 4));
    m.recv_count = static_cast<int32_t*>(m.alloc(m.W * 4));
    m.token_pos = static_cast<int32_t*>(m.alloc(rows * 4));
    m.send_hidden = m.alloc(rows * H * 2);
    m.send_meta = static_cast<int32_t*>(m.alloc(rows * mw * 4));
    m.recv_hidden = m.alloc(rows * H * 2);
    m.recv_meta = static_cast<int32_t*>(m.alloc(rows * mw * 4));
    m.scores = static_cast<float*>(m.alloc(rows * E * 4));
    m.recv_out = m.alloc(rows * H * 2);
    m.back = m.alloc(rows * H * 2);
  }
  ck(cudaDeviceSynchronize(), "cudaDeviceSynchronize");  // the zero fills are done before any stream uses them
}

EpLayer::~EpLayer() = default;
EpLayer::EpLayer(EpLayer&&) noexcept = default;
EpLayer& EpLayer::operator=(EpLayer&&) noexcept = default;

void EpLayer::forward(const TensorView& hidden, const TensorView& logits, const TensorView& out, Stream stream,
                      ExpertTactic tactic) {
  Impl& m = *impl_;
  const Device dev = Device::cuda(m.device);
  const int64_t T = hidden.present() ? hidden.size(0) : -1, H = m.local.hidden;
  auto check_rows = [&](const TensorView& v, std::string_view name) {
    const bool ok = v.present() && v.ndim == 2 && v.size(0) == T && v.size(1) == H && v.dtype == DType::bf16 &&
                    v.is_contiguous() && v.device == dev && v.starts_aligned(16);
    if (!ok)
      throw InvalidArgument("ep", fmt::format("{} ({}) must be [T, H] = [{}, {}] bf16 contiguous, 16-byte aligned, "
                                              "on {}",
                                              name, v.present() ? v.describe() : "absent", T, H, device_name(dev)));
  };
  if (T < 0 || T > m.args.max_tokens)
    throw InvalidArgument("ep", fmt::format("tokens ({}) must be in 0..{} (max_tokens)", T, m.args.max_tokens));
  check_rows(hidden, "hidden");
  check_rows(out, "out");
  if (std::string why = detail::in_place_problem(out, "out", hidden, "hidden"); !why.empty())
    throw InvalidArgument("ep", why);
  validate_route_args(m.args.routing, logits, m.args.routing_bias, {}, m.args.max_tokens, dev);
  if (logits.size(0) != T)
    throw InvalidArgument("ep", fmt::format("logits rows ({}) must equal hidden rows ({})", logits.size(0), T));
  if (T == 0) return;

  detail::CurrentDeviceScope scope(m.device, "ep");
  if (m.args.mode == EpMode::all_gather)
    m.forward_all_gather(hidden, logits, out, stream, tactic);
  else
    m.forward_all_to_all(hidden, logits, out, stream, tactic);
}

void EpLayer::Impl::forward_all_gather(const TensorView& hidden, const TensorView& logits, const TensorView& out,
                                       Stream stream, ExpertTactic tactic) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const Device dev = Device::cuda(device);
  const int64_t T = hidden.size(0), H = local.hidden, E = local.num_experts, esz = dtype_size(logits.dtype);
  const int K = local.top_k, Kt = K + local.num_shared_experts;
  char* gl = static_cast<char*>(g_logits);
  ck(cudaMemcpy2DAsync(gl + r * T * E * esz, E * esz, logits.data, logits.stride(0) * esz, E * esz, T,
                       cudaMemcpyDeviceToDevice, s),
     "cudaMemcpy2DAsync(logits)");
  nccl(ncclAllGather(gl + r * T * E * esz, gl, T * E, nccl_type(logits.dtype), comm, s), "ncclAllGather(logits)");
  nccl(ncclAllGather(hidden.data, g_hidden, T * H, ncclBfloat16, comm, s), "ncclAllGather(hidden)");
  route(args.routing, TensorView::contiguous(gl, logits.dtype, {W * T, E}, dev), args.routing_bias, *plan, stream);
  ep_detail::launch_mask_shared({plan->view().topk_weights, W * T, T, K, Kt, r}, stream);
  experts->run(*plan, TensorView::contiguous(g_hidden, DType::bf16, {W * T, H}, dev),
               TensorView::contiguous(partial, DType::bf16, {W * T, H}, dev), stream, tactic);
  nccl(ncclReduceScatter(partial, out.data, T * H, ncclBfloat16, ncclSum, comm, s), "ncclReduceScatter");
}

void EpLayer::Impl::forward_all_to_all(const TensorView& hidden, const TensorView& logits, const TensorView& out,
                                       Stream stream, ExpertTactic tactic) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const Device dev = Device::cuda(device);
  const int64_t T = hidden.size(0), H = local.hidden;
  const int E = local.num_experts, K = local.top_k, S = local.num_shared_experts, Kt = K + S;
  const int64_t mw = ep::meta_width(K);
  auto* sh = static_cast<uint16_t*>(send_hidden);
  auto* rh = static_cast<uint16_t*>(recv_hidden);
  auto* ro = static_cast<uint16_t*>(recv_out);
  auto* bk = static_cast<uint16_t*>(back);

  route(args.routing, logits, args.routing_bias, *own_plan, stream);
  const RoutePlanView& own = own_plan->view();
  ep_detail::launch_dispatch({own.topk_ids, T, K, S, E, W, r, send_token, send_count, token_pos}, stream);
  ep_detail::launch_pack(
      {hidden.data, own.topk_ids, own.topk_weights, send_token, send_count, T, H, K, Kt, W, send_hidden, send_meta},
      stream);
  // This rank's own slab moves by copy; the others by fixed-size messages (the counts say how much is real).
  ck(cudaMemcpyAsync(recv_count + r, send_count + r, 4, cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync(count)");
  ck(cudaMemcpyAsync(rh + r * T * H, sh + r * T * H, T * H * 2, cudaMemcpyDeviceToDevice, s),
     "cudaMemcpyAsync(rows)");
  ck(cudaMemcpyAsync(recv_meta + r * T * mw, send_meta + r * T * mw, T * mw * 4, cudaMemcpyDeviceToDevice, s),
     "cudaMemcpyAsync(meta)");
  if (W > 1) {
    nccl(ncclGroupStart(), "ncclGroupStart");  // counts first
    for (int p = 0; p < W; ++p) {
      if (p == r) continue;
      nccl(ncclSend(send_count + p, 1, ncclInt32, p, comm, s), "ncclSend(count)");
      nccl(ncclRecv(recv_count + p, 1, ncclInt32, p, comm, s), "ncclRecv(count)");
    }
    nccl(ncclGroupEnd(), "ncclGroupEnd");
    nccl(ncclGroupStart(), "ncclGroupStart");  // then the token rows and their ids/weights
    for (int p = 0; p < W; ++p) {
      if (p == r) continue;
      nccl(ncclSend(sh + p * T * H, T * H, ncclBfloat16, p, comm, s), "ncclSend(rows)");
      nccl(ncclRecv(rh + p * T * H, T * H, ncclBfloat16, p, comm, s), "ncclRecv(rows)");
      nccl(ncclSend(send_meta + p * T * mw, T * mw, ncclInt32, p, comm, s), "ncclSend(meta)");
      nccl(ncclRecv(recv_meta + p * T * mw, T * mw, ncclInt32, p, comm, s), "ncclRecv(meta)");
    }
    nccl(ncclGroupEnd(), "ncclGroupEnd");
  }
  ep_detail::launch_scores(
      {recv_meta, recv_count, T, W, K, E, local.local_expert_offset, local.local_experts(), scores}, stream);
  route(receiver_routing, TensorView::contiguous(scores, DType::f32, {W * T, E}, dev), {}, *plan, stream);
  ep_detail::launch_mask_shared({plan->view().topk_weights, W * T, T, K, Kt, r}, stream);
  experts->run(*plan, TensorView::contiguous(recv_hidden, DType::bf16, {W * T, H}, dev),
               TensorView::contiguous(recv_out, DType::bf16, {W * T, H}, dev), stream, tactic);
  ck(cudaMemcpyAsync(bk + r * T * H, ro + r * T * H, T * H * 2, cudaMemcpyDeviceToDevice, s),
     "cudaMemcpyAsync(return)");
  if (W > 1) {
    nccl(ncclGroupStart(), "ncclGroupStart");  // the return trip
    for (int p = 0; p < W; ++p) {
      if (p == r) continue;
      nccl(ncclSend(ro + p * T * H, T * H, ncclBfloat16, p, comm, s), "ncclSend(return)");
      nccl(ncclRecv(bk + p * T * H, T * H, ncclBfloat16, p, comm, s), "ncclRecv(return)");
    }
    nccl(ncclGroupEnd(), "ncclGroupEnd");
  }
  ep_detail::launch_combine({back, token_pos, T, H, W, out.data}, stream);
}

const ExpertConfig& EpLayer::local_config() const {
  return impl_->local;
}
EpMode EpLayer::mode() const {
  return impl_->args.mode;
}
int64_t EpLayer::max_tokens() const {
  return impl_->args.max_tokens;
}
int64_t EpLayer::workspace_bytes() const {
  return impl_->bytes + impl_->experts->workspace_bytes();
}

#else

struct EpLayer::Impl {};
EpLayer::EpLayer(const EpLayerArgs&, const Communicator&) {
  throw NotSupported("ep", "moekit was built without CUDA");
}
EpLayer::~EpLayer() = default;
EpLayer::EpLayer(EpLayer&&) noexcept = default;
EpLayer& EpLayer::operator=(EpLayer&&) noexcept = default;
void EpLayer::forward(const TensorView&, const TensorView&, const TensorView&, Stream, ExpertTactic) {
  throw NotSupported("ep", "moekit was built without CUDA");
}
const ExpertConfig& EpLayer::local_config() const {
  throw NotSupported("ep", "moekit was built without CUDA");
}
EpMode EpLayer::mode() const {
  return EpMode::all_gather;
}
int64_t EpLayer::max_tokens() const {
  return 0;
}
int64_t EpLayer::workspace_bytes() const {
  return 0;
}

#endif

}  // namespace moekit

// CPU simulation of expert parallelism: W in-process ranks run the same steps as the GPU layer (ep_layer.cpp) on
// host buffers, with NCCL collectives replaced by copies of the same fixed-size slabs and reduce-scatter by an fp32
// sum in rank order rounded once to bf16. Routing is route() on host plans, experts are experts_reference with each
// rank's local range, and dispatch tables, receiver scores and shared-slot masking come from ep_bookkeeping.h,
// the rules the kernels use too. It is the oracle the tests compare with the single-rank reference layer.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "moekit/error.h"
#include "moekit/expert_parallel.h"
#include "moekit/plan.h"
#include "parallel/ep_bookkeeping.h"
#include "parallel/ep_validate.h"

namespace moekit {
namespace {

using Rows = std::vector<uint16_t>;  // bf16 rows

struct SimShape {
  int W, E, K, S, Kt;
  int64_t T, H;
};

void check_host(const TensorView& t, std::string_view name, int rank) {
  if (t.present() && !t.device.is_cpu())
    throw InvalidArgument("ep", fmt::format("rank {} {} ({}) must be on the cpu", rank, name, t.describe()));
}

// Zeroes the shared slots' weights of every row that does not belong to `self` (see keeps_shared).
void mask_shared(RoutePlan& plan, const SimShape& s, int self) {
  float* w = plan.mutable_view().topk_weights;
  for (int64_t row = 0; row < s.W * s.T; ++row)
    if (!ep::keeps_shared(row, s.T, self))
      for (int j = s.K; j < s.Kt; ++j) w[row * s.Kt + j] = 0.0f;
}

void run_experts(const EpSimArgs& a, const EpSimRank& rank, int r, const SimShape& s, Rows& hidden,
                 const RoutePlan& plan, Rows& out) {
  const ExpertConfig cfg = rank_expert_config(a.experts, s.W, r);
  experts_reference(cfg, rank.weights, TensorView::contiguous(hidden.data(), DType::bf16, {s.W * s.T, s.H}),
                    plan.view(), TensorView::contiguous(out.data(), DType::bf16, {s.W * s.T, s.H}), a.threads);
}

void simulate_all_gather(const EpSimArgs& a, std::span<const EpSimRank> ranks, const SimShape& s) {
  const DType ldt = ranks[0].logits.dtype;
  const int64_t esz = dtype_size(ldt);
  Rows hidden(static_cast<size_t>(s.W * s.T * s.H));
  std::vector<char> logits(static_cast<size_t>(s.W * s.T * s.E * esz));
  for (int p = 0; p < s.W; ++p) {  // all-gather: slab p = rank p's rows
    std::memcpy(hidden.data() + p * s.T * s.H, ranks[p].hidden.data, static_cast<size_t>(s.T * s.H * 2));
    for (int64_t t = 0; t < s.T; ++t)
      std::memcpy(logits.data() + ((p * s.T + t) * s.E) * esz,
                  static_cast<const char*>(ranks[p].logits.data) + t * ranks[p].logits.stride(0) * esz,
                  static_cast<size_t>(s.E * esz));
  }
  RoutePlan plan(PlanShape{s.W * s.T, s.E, s.K, s.S, a.block}, Device::cpu());
  route(a.routing, TensorView::contiguous(logits.data(), ldt, {s.W * s.T, s.E}), a.routing_bias, plan);
  const std::vector<float> weights(plan.view().topk_weights, plan.view().topk_weights + s.W * s.T * s.Kt);
  std::vector<Rows> partial(static_cast<size_t>(s.W), Rows(static_cast<size_t>(s.W * s.T * s.H)));
  for (int r = 0; r < s.W; ++r) {  // every rank routes the same gathered tokens identically
    std::copy(weights.begin(), weights.end(), plan.mutable_view().topk_weights);
    mask_shared(plan, s, r);
    run_experts(a, ranks[r], r, s, hidden, plan, partial[r]);
  }
  for (int r = 0; r < s.W; ++r) {  // reduce-scatter (sum): rank r gets rows r*T..r*T+T-1
    uint16_t* out = ranks[r].out.as<uint16_t>();
    for (int64_t i = 0; i < s.T * s.H; ++i) {
      float acc = 0.0f;
      for (int p = 0; p < s.W; ++p) acc += bf16_to_float(partial[p][r * s.T * s.H + i]);
      out[i] = float_to_bf16(acc);
    }
  }
}

// One rank's send side of the all-to-all: its dispatch table and the packed slabs it sends to each peer.
struct SendSide {
  ep::DispatchTable table;
  Rows hidden;                // [W*T, H]: slab d = rows for rank d (stale zeros past the count)
  std::vector<int32_t> meta;  // [W*T, 2K]
};

SendSide pack_rank(const EpSimArgs& a, const EpSimRank& rank, int r, const SimShape& s) {
  RoutePlan own(PlanShape{s.T, s.E, s.K, s.S, a.block}, Device::cpu());
  route(a.routing, rank.logits, a.routing_bias, own);
  const int32_t* ids = own.view().topk_ids;
  const float* w = own.view().topk_weights;
  SendSide out;
  out.table = ep::build_dispatch_table(ids, s.T, s.K, s.S, s.E, s.W, r);
  out.hidden.assign(static_cast<size_t>(s.W * s.T * s.H), 0);
  const int mw = ep::meta_width(s.K);
  out.meta.assign(static_cast<size_t>(s.W * s.T * mw), 0);
  const uint16_t* hid = rank.hidden.as<const uint16_t>();
  for (int d = 0; d < s.W; ++d)
    for (int i = 0; i < out.table.send_count[d]; ++i) {
      const int64_t row = d * s.T + i, t = out.table.send_token[row];
      std::memcpy(out.hidden.data() + row * s.H, hid + t * s.H, static_cast<size_t>(s.H * 2));
      for (int j = 0; j < s.K; ++j) {
        out.meta[row * mw + j] = ids[t * s.Kt + j];
        std::memcpy(&out.meta[row * mw + s.K + j], &w[t * s.Kt + j], 4);
      }
    }
  return out;
}

// The receiver's routing input: row p*T+i scores the K ids of the row it received from rank p (their weights,
// -inf elsewhere), or the inert experts for a padding row past rank p's count.
std::vector<float> receiver_scores(const std::vector<int32_t>& meta, const std::vector<int32_t>& counts,
                                   const SimShape& s, const ExpertPartition& local) {
  const float ninf = -std::numeric_limits<float>::infinity();
  const int mw = ep::meta_width(s.K);
  std::vector<float> scores(static_cast<size_t>(s.W * s.T * s.E));
  for (int64_t row = 0; row < s.W * s.T; ++row) {
    const bool real = row % s.T < counts[row / s.T];
    float* sc = scores.data() + row * s.E;
    for (int e = 0; e < s.E; ++e)
      sc[e] = !real && ep::is_inert_expert(e, s.E, local.offset, local.count, s.K) ? 1.0f : ninf;
    if (!real) continue;
    for (int j = 0; j < s.K; ++j) {
      const int e = meta[row * mw + j];
      if (e >= 0 && e < s.E) std::memcpy(&sc[e], &meta[row * mw + s.K + j], 4);
    }
  }
  return scores;
}

void simulate_all_to_all(const EpSimArgs& a, std::span<const EpSimRank> ranks, const SimShape& s) {
  std::vector<SendSide> send;
  for (int r = 0; r < s.W; ++r) send.push_back(pack_rank(a, ranks[r], r, s));
  const int mw = ep::meta_width(s.K);
  RoutingConfig pre{};
  pre.method = RoutingMethod::pre_scored;
  pre.num_experts = s.E;
  pre.top_k = s.K;
  pre.num_shared_experts = s.S;
  std::vector<Rows> result(static_cast<size_t>(s.W));  // [W*T, H] per receiving rank
  for (int q = 0; q < s.W; ++q) {
    Rows hidden(static_cast<size_t>(s.W * s.T * s.H));
    std::vector<int32_t> meta(static_cast<size_t>(s.W * s.T * mw)), counts(static_cast<size_t>(s.W));
    for (int p = 0; p < s.W; ++p) {  // fixed-size messages: whole slabs, the count says how much is real
      std::copy_n(send[p].hidden.begin() + q * s.T * s.H, s.T * s.H, hidden.begin() + p * s.T * s.H);
      std::copy_n(send[p].meta.begin() + q * s.T * mw, s.T * mw, meta.begin() + p * s.T * mw);
      counts[p] = send[p].table.send_count[q];
    }
    std::vector<float> scores = receiver_scores(meta, counts, s, expert_partition(s.E, s.W, q));
    RoutePlan plan(PlanShape{s.W * s.T, s.E, s.K, s.S, a.block}, Device::cpu());
    route(pre, TensorView::contiguous(scores.data(), DType::f32, {s.W * s.T, s.E}), {}, plan);
    mask_shared(plan, s, q);
    result[q].assign(static_cast<size_t>(s.W * s.T * s.H), 0);
    run_experts(a, ranks[q], q, s, hidden, plan, result[q]);
  }
  for (int r = 0; r < s.W; ++r) {  // return trip, then the weighted partials summed in rank order
    const ep::DispatchTable& tab = send[r].table;
    uint16_t* out = ranks[r].out.as<uint16_t>();
    for (int64_t t = 0; t < s.T; ++t)
      for (int64_t h = 0; h < s.H; ++h) {
        float acc = 0.0f;
        for (int d = 0; d < s.W; ++d) {
          const int pos = tab.token_pos[t * s.W + d];
          if (pos >= 0) acc += bf16_to_float(result[d][(r * s.T + pos) * s.H + h]);
        }
        out[t * s.H + h] = float_to_bf16(acc);
      }
  }
}

}  // namespace

void ep_simulate(const EpSimArgs& a, std::span<const EpSimRank> ranks) {
  ep::validate_configs(a.experts, a.routing);
  const int W = static_cast<int>(ranks.size());
  expert_partition(a.experts.num_experts, W, 0);  // checks W
  check_host(a.routing_bias, "routing_bias", 0);
  const int64_t T = ranks[0].hidden.present() ? ranks[0].hidden.size(0) : 0;
  for (int r = 0; r < W; ++r) {
    const EpSimRank& k = ranks[r];
    check_host(k.hidden, "hidden", r);
    check_host(k.logits, "logits", r);
    check_host(k.out, "out", r);
    const bool ok = k.hidden.present() && k.out.present() && k.logits.present() && k.hidden.ndim == 2 &&
                    k.out.ndim == 2 && k.hidden.size(0) == T && k.out.size(0) == T && k.logits.size(0) == T &&
                    k.hidden.size(1) == a.experts.hidden && k.out.size(1) == a.experts.hidden &&
                    k.hidden.dtype == DType::bf16 && k.out.dtype == DType::bf16 && k.hidden.is_contiguous() &&
                    k.out.is_contiguous() && k.logits.dtype == ranks[0].logits.dtype;
    if (!ok)
      throw InvalidArgument("ep", fmt::format("rank {} hidden/out ({} / {}) must be [T, H] = [{}, {}] bf16 "
                                              "contiguous with logits of rank 0's dtype (every rank the same T)",
                                              r, k.hidden.describe(), k.out.describe(), T, a.experts.hidden));
    validate_route_args(a.routing, k.logits, a.routing_bias, {}, T, Device::cpu());
  }
  if (T == 0) return;
  const SimShape s{W,
                   a.experts.num_experts,
                   a.experts.top_k,
                   a.experts.num_shared_experts,
                   a.experts.top_k + a.experts.num_shared_experts,
                   T,
                   a.experts.hidden};
  if (a.mode == EpMode::all_gather)
    simulate_all_gather(a, ranks, s);
  else
    simulate_all_to_all(a, ranks, s);
}

}  // namespace moekit

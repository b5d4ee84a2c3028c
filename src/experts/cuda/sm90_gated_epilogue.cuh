// GEMM1's gated activation as a CUTLASS sm90 epilogue visitor node, for w13 with interleaved gate/up rows (row 2i
// is gate(i), row 2i + 1 up(i)). Plain form: GEMM1's accumulator columns 2i and 2i + 1 of a row are gate(i) and
// up(i), and each thread of the epilogue holds such a pair in adjacent registers. Swapped form (out^T = W x^T):
// accumulator rows 2i and 2i + 1 of a column are the pair, held by lanes l and l ^ 4. The node adds b13 and applies
// the activation in registers, stages the tile's act values in shared memory and, after the tile's last subtile,
// copies them to act rows with 16-byte stores, so the [rows, 2I] GEMM1 output and the separate activation pass
// disappear: the GEMM is built without a D tensor (ElementD = void) and this node is the epilogue's only output.
// Group g writes through the per-group pointer out[g] (the act rows GEMM2 reads), with the group's local expert for
// the bias.
#pragma once

#include "cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp"
#include "experts/cuda/experts_device.cuh"

namespace moekit::detail {

/// What both forms share: arguments, no workspace, no producer loads, the bias pair lookup and the copy-out.
struct GatedStoreBase {
  using ElementAux = cutlass::bfloat16_t;  // sizes the void-D epilogue's (unused) staging types
  using Arguments = GatedEpilogueArgs;
  using Params = GatedEpilogueArgs;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) {
    return args;
  }
  template <class ProblemShape>
  static bool can_implement(ProblemShape const&, Arguments const&) {
    return true;
  }
  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&) {
    return 0;
  }
  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const&, Arguments const&, void*, cudaStream_t,
                                              cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }

  CUTLASS_DEVICE bool is_producer_load_needed() const { return false; }
  CUTLASS_DEVICE bool is_C_load_needed() const { return false; }

  template <class... Args>
  CUTLASS_DEVICE auto get_producer_load_callbacks(
      cutlass::epilogue::fusion::detail::ProducerLoadArgs<Args...> const&) {
    return cutlass::epilogue::fusion::detail::EmptyProducerLoadCallbacks{};
  }

  /// b13[index], b13[index + 1] (index even) through the read-only path; 0 without a bias.
  static CUTLASS_DEVICE float2 bias_pair(const BiasRef& b, int64_t index) {
    if (b.data == nullptr) return make_float2(0.0f, 0.0f);
    if (b.is_bf16) {  // 4-byte aligned: b13 is, and index is even
      const __nv_bfloat162 v = __ldg(reinterpret_cast<const __nv_bfloat162*>(b.data) + index / 2);
      return __bfloat1622float2(v);
    }
    const float* f = static_cast<const float*>(b.data) + index;
    if (reinterpret_cast<uintptr_t>(f) % 8 == 0) return __ldg(reinterpret_cast<const float2*>(f));
    return make_float2(__ldg(f), __ldg(f + 1));
  }

  /// Copies `rows` staged act rows of `cols` values (multiples of 8 from 16-byte aligned bases) to out, row pitch
  /// ld, in 16-byte chunks; kThreads threads, `pitch` bf16 per staged row, kChunks chunks per staged row.
  template <int kRows, int kChunks, int kThreads>
  static CUTLASS_DEVICE void copy_out(__nv_bfloat16* out, int64_t ld, const __nv_bfloat16* stage, int pitch, int rows,
                                      int cols, int thread_idx) {
    for (int k = thread_idx; k < kRows * kChunks; k += kThreads) {
      const int r = k / kChunks, c = (k % kChunks) * 8;
      if (r < rows && c < cols)
        *reinterpret_cast<uint4*>(out + r * ld + c) = *reinterpret_cast<const uint4*>(stage + r * pitch + c);
    }
  }
};

/// Plain form's pairing: a fragment holds groups of four accumulators, (row r, columns 2c and 2c + 1) and (row
/// r + 8, the same columns), i.e. output c of rows r and r + 8, and lane ^ 1 holds output c ^ 1 of the same rows (the
/// wgmma accumulator layout). Lanes trade one value so that the even lane stages outputs (c, c + 1) of row r and the
/// odd lane outputs (c - 1, c) of row r + 8: one 4-byte shared store each.
struct PairAcrossColumns {
  template <class Callbacks, class Fragment, class Coords>
  static CUTLASS_DEVICE void stage(Callbacks& cb, Fragment const& frg, int i, Coords const& c0, Coords const& c1) {
    const bool odd = (threadIdx.x & 1) != 0;
    // Columns past N (a partial tile) are computed and staged but never copied out; their bias is not read.
    const bool in_n = cute::get<1>(c0) < cute::get<1>(cb.residue);
    const float2 b =
        in_n ? GatedStoreBase::bias_pair(cb.params.bias, cb.bias_base + static_cast<int>(cute::get<1>(c0)))
             : make_float2(0.0f, 0.0f);
    const auto& p = cb.params;
    const float v0 =
        gated_activation(p.activation, p.act, static_cast<float>(frg[i]) + b.x, static_cast<float>(frg[i + 1]) + b.y);
    const float v1 = gated_activation(p.activation, p.act, static_cast<float>(frg[i + 2]) + b.x,
                                      static_cast<float>(frg[i + 3]) + b.y);
    const float other = __shfl_xor_sync(0xffffffffu, odd ? v0 : v1, 1);
    const auto c = odd ? c1 : c0;
    const int m = cb.tile_m + static_cast<int>(cute::get<0>(c));
    const int col = (cb.tile_n + static_cast<int>(cute::get<1>(c))) / 2 - (odd ? 1 : 0);
    *reinterpret_cast<__nv_bfloat162*>(cb.stage + m * Callbacks::kPitch + col) =
        odd ? __floats2bfloat162_rn(other, v1) : __floats2bfloat162_rn(v0, other);
  }
};

/// Swapped form's pairing: a fragment holds groups of four accumulators, (weight row r, plan rows 2c and 2c + 1)
/// and (row r + 8, the same plan rows), and lane ^ 4 holds rows r ^ 1 and (r + 8) ^ 1 of the same plan rows (the
/// wgmma accumulator layout). So a lane with r even holds gates and its partner the matching ups: the gate lane
/// takes the ups of row r + 1 and stages act(r / 2) of both plan rows, the up lane takes the gates of row r + 8 and
/// stages act((r + 8) / 2). Act values are staged transposed: [plan row][act column].
struct PairAcrossRows {
  template <class Callbacks, class Fragment, class Coords>
  static CUTLASS_DEVICE void stage(Callbacks& cb, Fragment const& frg, int i, Coords const& c0, Coords const& c1) {
    const bool up = (threadIdx.x & 4) != 0;
    const float v0 = static_cast<float>(frg[i]), v1 = static_cast<float>(frg[i + 1]);
    const float v2 = static_cast<float>(frg[i + 2]), v3 = static_cast<float>(frg[i + 3]);
    const float r0 = __shfl_xor_sync(0xffffffffu, up ? v0 : v2, 4);
    const float r1 = __shfl_xor_sync(0xffffffffu, up ? v1 : v3, 4);
    const float g0 = up ? r0 : v0, g1 = up ? r1 : v1, u0 = up ? v2 : r0, u1 = up ? v3 : r1;
    const auto c = up ? c1 : c0;                                                 // the lane's own row of the pair
    const int m = cb.tile_m + static_cast<int>(cute::get<0>(c)) - (up ? 1 : 0);  // the gate row, in the tile
    // Rows past M (a partial tile) are computed and staged but never copied out; their bias is not read.
    const bool in_m = cute::get<0>(c) < cute::get<0>(cb.residue);
    const float2 b = in_m ? GatedStoreBase::bias_pair(cb.params.bias, cb.bias_base + m) : make_float2(0.0f, 0.0f);
    const auto& p = cb.params;
    const float a0 = gated_activation(p.activation, p.act, g0 + b.x, u0 + b.y);
    const float a1 = gated_activation(p.activation, p.act, g1 + b.x, u1 + b.y);
    const int n = cb.tile_n + static_cast<int>(cute::get<1>(c));
    cb.stage[n * Callbacks::kPitch + m / 2] = __float2bfloat16_rn(a0);
    cb.stage[(n + 1) * Callbacks::kPitch + m / 2] = __float2bfloat16_rn(a1);
  }
};

/// A tile's epilogue state: where the thread's values lie in the tile, the tile's extent inside the problem, its
/// act rows and staging buffer; visit() stages each group of four accumulators through the form's Pairing, and
/// reduce() copies the tile out after its last subtile (kRows staged rows of kChunks 16-byte chunks, kPitch bf16
/// apart, copied by kThreads threads).
template <class CTensor, class ThrResidue, class Pairing, int kRows, int kChunks, int kPitch_, int kThreads>
struct GatedTileCallbacks : cutlass::epilogue::fusion::detail::EmptyConsumerStoreCallbacks {
  static constexpr int kPitch = kPitch_;
  CTensor tc;          // (CPY, CPY_M, CPY_N, EPI_M, EPI_N) coordinates relative to the thread's first element
  ThrResidue residue;  // (M, N) minus the thread's first element's coordinates
  int tile_m, tile_n;  // the thread's first element relative to the tile's origin
  int rows, cols;      // act rows and act columns of the tile inside the problem
  __nv_bfloat16* out;  // the tile's first act element of this group
  __nv_bfloat16* stage;
  int64_t bias_base;  // b13 index the pairing adds its tile offsets to
  int thread_idx;
  GatedEpilogueArgs const& params;

  CUTLASS_DEVICE GatedTileCallbacks(CTensor tc, ThrResidue residue, int tile_m, int tile_n, int rows, int cols,
                                    __nv_bfloat16* out, __nv_bfloat16* stage, int64_t bias_base, int thread_idx,
                                    GatedEpilogueArgs const& params)
      : tc(tc),
        residue(residue),
        tile_m(tile_m),
        tile_n(tile_n),
        rows(rows),
        cols(cols),
        out(out),
        stage(stage),
        bias_base(bias_base),
        thread_idx(thread_idx),
        params(params) {}

  template <class ElementAccumulator, class ElementInput, int FragmentSize>
  CUTLASS_DEVICE auto visit(cutlass::Array<ElementAccumulator, FragmentSize> const&, int epi_v, int epi_m, int epi_n,
                            cutlass::Array<ElementInput, FragmentSize> const& frg_input) {
    static_assert(FragmentSize % 4 == 0, "a fragment must hold whole (row r, row r + 8) column-pair groups");
    auto tc_mn = tc(cute::_, cute::_, cute::_, epi_m, epi_n);
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < FragmentSize; i += 4)
      Pairing::stage(*this, frg_input, i, tc_mn(epi_v * FragmentSize + i), tc_mn(epi_v * FragmentSize + i + 2));
    return frg_input;
  }

  // After the tile's last subtile: every thread's values are staged; copy the rows inside the problem out in
  // 16-byte chunks, then wait again so the next tile's values do not overwrite rows still being read.
  template <class STensor, class SyncFn, class VTensor>
  CUTLASS_DEVICE void reduce(STensor&&, SyncFn const& sync_fn, int, int, bool is_last_iteration, VTensor) {
    if (!is_last_iteration) return;
    sync_fn();
    GatedStoreBase::copy_out<kRows, kChunks, kThreads>(out, params.ld_out, stage, kPitch, rows, cols, thread_idx);
    sync_fn();
  }
};

/// The node for a kTileM x kTileN tile stored by one epilogue (a consumer warpgroup, or both in the cooperative
/// schedule) of kThreads threads, with kBuffers staging buffers (the pingpong schedule's two consumers each have
/// one). Plain form: kTileM act rows of kTileN / 2 values. Swapped form (out^T = W x^T, cooperative): the kTileM
/// weight rows are kTileM / 2 act columns and the kTileN plan rows are act rows, staged transposed. Each buffer holds
/// kRows act rows of kCols values, kPitch bf16 apart (16-byte rows, fewer bank conflicts; kChunks 16-byte chunks).
template <int kTileM, int kTileN, int kThreads, int kBuffers, bool kSwapped>
struct Sm90GatedStore : GatedStoreBase {
  static_assert(!kSwapped || (kThreads == 256 && kBuffers == 1), "the swapped form is cooperative");
  static constexpr int kRows = kSwapped ? kTileN : kTileM;
  static constexpr int kCols = kSwapped ? kTileM / 2 : kTileN / 2;
  static constexpr int kPitch = kCols + 8;
  static constexpr int kChunks = kCols / 8;
  using Pairing = std::conditional_t<kSwapped, PairAcrossRows, PairAcrossColumns>;
  struct SharedStorage {
    alignas(16) __nv_bfloat16 act[kBuffers][kRows * kPitch];
  };
  template <class CTensor, class ThrResidue>
  using ConsumerStoreCallbacks = GatedTileCallbacks<CTensor, ThrResidue, Pairing, kRows, kChunks, kPitch, kThreads>;

  CUTLASS_HOST_DEVICE Sm90GatedStore() {}
  CUTLASS_HOST_DEVICE Sm90GatedStore(Params const& params, SharedStorage const& storage)
      : params(params), storage(const_cast<SharedStorage*>(&storage)) {}

  Params params;
  SharedStorage* storage = nullptr;

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(
      cutlass::epilogue::fusion::detail::ConsumerStoreArgs<Args...> const& args) {
    const auto [M, N, K, L] = args.problem_shape_mnkl;
    const int group = static_cast<int>(cute::get<3>(args.tile_coord_mnkl));
    const int m0 = static_cast<int>(cute::get<0>(args.tile_coord_mnkl)) * kTileM;
    const int n0 = static_cast<int>(cute::get<1>(args.tile_coord_mnkl)) * kTileN;
    const int local = local_expert(params.map, group);
    // The thread's first element in the problem, from the residue (M, N minus that element).
    const int first_m = static_cast<int>(M) - static_cast<int>(cute::get<0>(args.residue_tCcD));
    const int first_n = static_cast<int>(N) - static_cast<int>(cute::get<1>(args.residue_tCcD));
    auto* act = static_cast<__nv_bfloat16*>(const_cast<void*>(params.ptr_out[group]));
    const int64_t expert = local < 0 ? 0 : local;
    // Act rows and the b13 index of the tile's first pair: plain, rows on M and pairs on N; swapped, the reverse.
    const int act_row = kSwapped ? n0 : m0, act_col = kSwapped ? m0 / 2 : n0 / 2;
    const int rows = kSwapped ? min(kTileN, static_cast<int>(N) - n0) : min(kTileM, static_cast<int>(M) - m0);
    const int cols =
        kSwapped ? min(kCols, (static_cast<int>(M) - m0) / 2) : min(kCols, (static_cast<int>(N) - n0) / 2);
    const int64_t bias_base = kSwapped ? expert * M + m0 : expert * N + first_n;
    const int buffer = kBuffers == 1 ? 0 : static_cast<int>(threadIdx.x) / kThreads - 1;  // consumer warpgroup
    return ConsumerStoreCallbacks<decltype(args.tCcD), decltype(args.residue_tCcD)>(
        args.tCcD, args.residue_tCcD, first_m - m0, first_n - n0, rows, cols,
        act + static_cast<int64_t>(act_row) * params.ld_out + act_col, storage->act[buffer], bias_base,
        args.thread_idx, params);
  }
};

}  // namespace moekit::detail

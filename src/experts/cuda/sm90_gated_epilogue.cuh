// GEMM1's gated activation as a CUTLASS sm90 epilogue visitor node. Three pairings of an output's gate and up
// values in GEMM1's accumulator, one per w13 arrangement and tile form:
// - interleaved w13 (row 2i is gate(i), row 2i + 1 up(i)), plain form: accumulator columns 2i and 2i + 1 of a row,
//   held by each thread of the epilogue in adjacent registers (PairAcrossColumns);
// - interleaved w13, swapped form (out^T = W x^T): accumulator rows 2i and 2i + 1 of a column, held by lanes l and
//   l ^ 4 (PairAcrossRows);
// - gate-first or up-first w13 through sm90_halves_mainloop.cuh, plain form: tile columns j and j + kTileN / 2 of a
//   row, held by one thread in subtiles visited one after the other (PairAcrossHalves);
// - the same, swapped form: tile rows j and j + kTileM / 2 of a column, held by the two consumer warpgroups; both
//   are staged and paired when the tile is copied out (PairAcrossRowHalves).
// The node adds b13 and applies the activation in registers (b13's slice for the tile is staged in shared memory
// when the epilogue begins: one load per thread and tile, not one per value), stages the tile's act values in shared
// memory and, after the tile's last subtile, copies them to act rows with 16-byte stores, so the [rows, 2I] GEMM1
// output and the separate activation pass disappear: the GEMM is built without a D tensor (ElementD = void) and this
// node is the epilogue's only output. Group g writes through the per-group pointer out[g] (the act rows GEMM2
// reads), with the group's local expert for the bias.
#pragma once

#include "cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp"
#include "experts/cuda/experts_device.cuh"

namespace moekit::detail {

/// What both forms share: arguments, no workspace, no producer loads and the bias load.
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

  /// b13[index] through the read-only path (any alignment).
  static CUTLASS_DEVICE float bias_value(const BiasRef& b, int64_t index) {
    return b.is_bf16 ? __bfloat162float(__ldg(static_cast<const __nv_bfloat16*>(b.data) + index))
                     : __ldg(static_cast<const float*>(b.data) + index);
  }
};

/// Plain form's pairing: a fragment holds groups of four accumulators, (row r, columns 2c and 2c + 1) and (row
/// r + 8, the same columns), i.e. output c of rows r and r + 8, and lane ^ 1 holds output c ^ 1 of the same rows (the
/// wgmma accumulator layout). Lanes trade one value so that the even lane stages outputs (c, c + 1) of row r and the
/// odd lane outputs (c - 1, c) of row r + 8: one 4-byte shared store each.
struct PairAcrossColumns {
  static constexpr bool kSwapped = false;
  static constexpr int kPlanes = 1;               // staged act values
  static constexpr bool kWholeFragments = false;  // stage() per group of four
  static constexpr int kBiasGapAt = 0;            // no gap in the staged b13 slice
  template <class Callbacks, class Fragment, class Coords>
  static CUTLASS_DEVICE void stage(Callbacks& cb, Fragment const& frg, int i, Coords const& c0, Coords const& c1) {
    const bool odd = (threadIdx.x & 1) != 0;
    const float2 b = cb.bias_pair(cb.tile_n + static_cast<int>(cute::get<1>(c0)));
    const float v0 =
        gated_activation(cb.form, static_cast<float>(frg[i]) + b.x, static_cast<float>(frg[i + 1]) + b.y);
    const float v1 =
        gated_activation(cb.form, static_cast<float>(frg[i + 2]) + b.x, static_cast<float>(frg[i + 3]) + b.y);
    const float other = __shfl_xor_sync(0xffffffffu, odd ? v0 : v1, 1);
    const auto c = odd ? c1 : c0;
    const int m = cb.tile_m + static_cast<int>(cute::get<0>(c));
    const int col = (cb.tile_n + static_cast<int>(cute::get<1>(c))) / 2 - (odd ? 1 : 0);
    *reinterpret_cast<__nv_bfloat162*>(cb.stage + Callbacks::staged(m, col)) =
        odd ? __floats2bfloat162_rn(other, v1) : __floats2bfloat162_rn(v0, other);
  }
};

/// Swapped form's pairing: a fragment holds groups of four accumulators, (weight row r, plan rows 2c and 2c + 1)
/// and (row r + 8, the same plan rows), and lane ^ 4 holds rows r ^ 1 and (r + 8) ^ 1 of the same plan rows (the
/// wgmma accumulator layout). So a lane with r even holds gates and its partner the matching ups: the gate lane
/// takes the ups of row r + 1 and stages act(r / 2) of both plan rows, the up lane takes the gates of row r + 8 and
/// stages act((r + 8) / 2). Act values are staged transposed: [plan row][act column]; plan rows past the problem's
/// are not staged (the copy out skips them).
struct PairAcrossRows {
  static constexpr bool kSwapped = true;
  static constexpr int kPlanes = 1;  // staged act values
  static constexpr bool kWholeFragments = false;
  static constexpr int kBiasGapAt = 0;
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
    const float2 b = cb.bias_pair(m);
    const float a0 = gated_activation(cb.form, g0 + b.x, u0 + b.y);
    const float a1 = gated_activation(cb.form, g1 + b.x, u1 + b.y);
    const int n = cb.tile_n + static_cast<int>(cute::get<1>(c));
    if (n >= cb.rows) return;  // plan rows past the problem's: the copy out skips them
    cb.stage[Callbacks::staged(n, m / 2)] = __float2bfloat16_rn(a0);
    cb.stage[Callbacks::staged(n + 1, m / 2)] = __float2bfloat16_rn(a1);
  }
};

/// Halves form's pairing (sm90_halves_mainloop.cuh): tile columns c < kHalf are rows of w13's first block, column
/// c + kHalf the same row of its second block. A fragment holds groups of four accumulators, (row r, columns c and
/// c + 1) and (row r + 8, the same columns); the thread that holds column c of a row also holds column c + kHalf (the
/// wgmma accumulator layout repeats every 8 columns), and CUTLASS visits the subtiles N-major, every subtile of the
/// first half before any of the second (Sm90GroupedGemm checks that a subtile lies in one half). So the first half's
/// values are staged, with their bias, as bf16 where their act values go (the unfused path rounds GEMM1's output to
/// bf16 too), and the second half's visit reads them back from there and stages act in their place: each place is
/// written and read by one thread, so nothing needs a barrier. A second-half fragment loads all its partners before
/// it stores any act value, so that the loads overlap instead of each waiting behind the previous group's store. The
/// staged b13 slice is the first block's kHalf values and then the second block's (kBiasGapAt: where the gap between
/// them falls).
template <int kHalf>
struct PairAcrossHalves {
  static constexpr bool kSwapped = false;
  static constexpr int kPlanes = 1;  // staged act values
  static constexpr bool kWholeFragments = true;
  static constexpr int kBiasGapAt = kHalf;
  template <int kValues, class Callbacks, class Fragment, class CoordsOf>
  static CUTLASS_DEVICE void stage_fragment(Callbacks& cb, Fragment const& frg, CoordsOf const& coords) {
    constexpr int kRows = kValues / 2;  // (row, column pair) places: two per group of four
    const bool second = cb.tile_n + static_cast<int>(cute::get<1>(coords(0))) >= kHalf;
    int at[kRows];
    float v[kValues];
    CUTLASS_PRAGMA_UNROLL
    for (int g = 0; g < kValues / 4; ++g) {
      const auto c0 = coords(4 * g), c1 = coords(4 * g + 2);
      const int n = cb.tile_n + static_cast<int>(cute::get<1>(c0));
      const int col = second ? n - kHalf : n;
      at[2 * g] = Callbacks::staged(cb.tile_m + static_cast<int>(cute::get<0>(c0)), col);
      at[2 * g + 1] = Callbacks::staged(cb.tile_m + static_cast<int>(cute::get<0>(c1)), col);
      const float2 b = cb.bias_pair(n);
      CUTLASS_PRAGMA_UNROLL
      for (int k = 0; k < 4; ++k) v[4 * g + k] = static_cast<float>(frg[4 * g + k]) + (k % 2 == 0 ? b.x : b.y);
    }
    auto place = [&](int j) { return reinterpret_cast<__nv_bfloat162*>(cb.stage + at[j]); };
    if (!second) {
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kRows; ++j) *place(j) = __floats2bfloat162_rn(v[2 * j], v[2 * j + 1]);
      return;
    }
    float2 first[kRows];
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < kRows; ++j) first[j] = __bfloat1622float2(*place(j));
    const bool up_first = cb.params.up_first;
    auto act = [&](float first_value, float mine) {
      return up_first ? gated_activation(cb.form, mine, first_value) : gated_activation(cb.form, first_value, mine);
    };
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < kRows; ++j)
      *place(j) = __floats2bfloat162_rn(act(first[j].x, v[2 * j]), act(first[j].y, v[2 * j + 1]));
  }
};

/// Swapped halves form's pairing (sm90_halves_mainloop.cuh with the weights as A): tile rows m < kHalf are rows of
/// w13's first block, row m + kHalf the same row of its second block, and the two lie in different consumer
/// warpgroups. A fragment holds groups of four accumulators, (weight row r, plan rows 2c and 2c + 1) and (row r + 8,
/// the same plan rows); each value is staged with its bias as bf16 (the unfused path rounds GEMM1's output to bf16
/// too) in its block's plane, transposed ([plan row][act column]), and combine() pairs the planes when the tile is
/// copied out, after the epilogue's last barrier. Plan rows past the problem's are not staged (the copy out skips
/// them): an expert of one or two routed rows fills a 32-row tile that little.
template <int kHalf>
struct PairAcrossRowHalves {
  static constexpr bool kSwapped = true;
  static constexpr bool kWholeFragments = false;
  static constexpr int kBiasGapAt = kHalf;
  static constexpr int kPlanes = 2;  // the first block's values, then the second's
  template <class Callbacks, class Fragment, class Coords>
  static CUTLASS_DEVICE void stage(Callbacks& cb, Fragment const& frg, int i, Coords const& c0, Coords const& c1) {
    CUTLASS_PRAGMA_UNROLL
    for (int h = 0; h < 2; ++h) {
      const auto c = h == 0 ? c0 : c1;
      const int m = cb.tile_m + static_cast<int>(cute::get<0>(c));  // the weight row, in the tile
      const int n = cb.tile_n + static_cast<int>(cute::get<1>(c));  // the first of two plan rows
      if (n >= cb.rows) continue;
      const int second = m >= kHalf ? 1 : 0;
      const float b = cb.bias_at(m);
      __nv_bfloat16* plane = cb.stage + second * Callbacks::kPlaneElements;
      plane[Callbacks::staged(n, m - second * kHalf)] = __float2bfloat16_rn(static_cast<float>(frg[i + 2 * h]) + b);
      plane[Callbacks::staged(n + 1, m - second * kHalf)] =
          __float2bfloat16_rn(static_cast<float>(frg[i + 2 * h + 1]) + b);
    }
  }
  /// Act values of 8 outputs from the staged 16-byte chunks of both planes.
  template <class Callbacks>
  static CUTLASS_DEVICE uint4 combine(Callbacks const& cb, uint4 first, uint4 second) {
    const auto* f = reinterpret_cast<const __nv_bfloat162*>(&first);
    const auto* s = reinterpret_cast<const __nv_bfloat162*>(&second);
    uint4 out;
    auto* o = reinterpret_cast<__nv_bfloat162*>(&out);
    const bool up_first = cb.params.up_first;
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < 4; ++j) {
      const float2 a = __bfloat1622float2(f[j]), b = __bfloat1622float2(s[j]);
      const float2 gate = up_first ? b : a, up = up_first ? a : b;
      o[j] = __floats2bfloat162_rn(gated_activation(cb.form, gate.x, up.x), gated_activation(cb.form, gate.y, up.y));
    }
    return out;
  }
};

/// A tile's epilogue state: where the thread's values lie in the tile, the tile's extent inside the problem, its
/// act rows, staging buffer and staged bias; begin() stages the tile's kBiasLength b13 values (0 past the problem),
/// visit() stages each group of four accumulators (each fragment where Pairing::kWholeFragments) through the form's
/// Pairing, and reduce() copies the tile out after its last subtile (kRows staged rows of kCols values, copied by
/// kThreads threads in 16-byte chunks).
template <class CTensor, class Pairing, int kRows, int kCols, int kBiasLength, int kThreads>
struct GatedTileCallbacks : cutlass::epilogue::fusion::detail::EmptyConsumerStoreCallbacks {
  static_assert(kCols % 64 == 0, "the staging swizzle permutes eight 16-byte chunks");
  static constexpr int kChunks = kCols / 8;
  static constexpr int kPlaneElements = kRows * kCols;  // one plane of staged values (Pairing::kPlanes of them)
  /// Where act value (row, col) is staged: rows of kCols values, the 16-byte chunks of row r permuted by r % 8, so
  /// that the eight rows a warp's stores and copies touch at once fall in different banks.
  static CUTLASS_DEVICE int staged(int row, int col) {
    return row * kCols + ((((col >> 3) ^ row) & 7) | (col >> 3 & ~7)) * 8 + (col & 7);
  }
  CTensor tc;          // (CPY, CPY_M, CPY_N, EPI_M, EPI_N) coordinates relative to the thread's first element
  int tile_m, tile_n;  // the thread's first element relative to the tile's origin
  int rows, cols;      // act rows and act columns of the tile inside the problem
  __nv_bfloat16* out;  // the tile's first act element of this group
  __nv_bfloat16* stage;
  float* bias;  // kBiasLength b13 values from bias_base, bias_count of them inside the problem
  int64_t bias_base;
  int bias_count;
  int64_t bias_gap;  // b13 entries skipped before staged value Pairing::kBiasGapAt (when it is not 0)
  int thread_idx;
  GatedEpilogueArgs const& params;
  GatedActivation form;

  CUTLASS_DEVICE GatedTileCallbacks(CTensor tc, int tile_m, int tile_n, int rows, int cols, __nv_bfloat16* out,
                                    __nv_bfloat16* stage, float* bias, int64_t bias_base, int bias_count,
                                    int64_t bias_gap, int thread_idx, GatedEpilogueArgs const& params)
      : tc(tc),
        tile_m(tile_m),
        tile_n(tile_n),
        rows(rows),
        cols(cols),
        out(out),
        stage(stage),
        bias(bias),
        bias_base(bias_base),
        bias_count(bias_count),
        bias_gap(bias_gap),
        thread_idx(thread_idx),
        params(params),
        form(gated_activation_form(params.activation, params.act)) {}

  // Before the tile's first subtile; CUTLASS synchronizes the epilogue's threads after it when asked to.
  CUTLASS_DEVICE void begin() {
    if (params.bias.data == nullptr) return;
    for (int k = thread_idx; k < kBiasLength; k += kThreads) {
      const int64_t gap = Pairing::kBiasGapAt > 0 && k >= Pairing::kBiasGapAt ? bias_gap : 0;
      bias[k] = k < bias_count ? GatedStoreBase::bias_value(params.bias, bias_base + k + gap) : 0.0f;
    }
  }
  CUTLASS_DEVICE bool begin_sync_needed() const { return params.bias.data != nullptr; }

  /// The staged bias at tile index i (a column of the tile, or a weight row when swapped).
  CUTLASS_DEVICE float bias_at(int i) const { return params.bias.data != nullptr ? bias[i] : 0.0f; }

  /// The staged bias of the pair at tile index i (even; columns of the tile, or weight rows when swapped).
  CUTLASS_DEVICE float2 bias_pair(int i) const {
    return params.bias.data != nullptr ? *reinterpret_cast<const float2*>(bias + i) : make_float2(0.0f, 0.0f);
  }

  template <class ElementAccumulator, class ElementInput, int FragmentSize>
  CUTLASS_DEVICE auto visit(cutlass::Array<ElementAccumulator, FragmentSize> const&, int epi_v, int epi_m, int epi_n,
                            cutlass::Array<ElementInput, FragmentSize> const& frg_input) {
    static_assert(FragmentSize % 4 == 0, "a fragment must hold whole (row r, row r + 8) column-pair groups");
    auto tc_mn = tc(cute::_, cute::_, cute::_, epi_m, epi_n);
    if constexpr (Pairing::kWholeFragments) {
      Pairing::template stage_fragment<FragmentSize>(*this, frg_input,
                                                     [&](int i) { return tc_mn(epi_v * FragmentSize + i); });
    } else {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize; i += 4)
        Pairing::stage(*this, frg_input, i, tc_mn(epi_v * FragmentSize + i), tc_mn(epi_v * FragmentSize + i + 2));
    }
    return frg_input;
  }

  // After the tile's last subtile: every thread's values are staged; copy the rows inside the problem out in
  // 16-byte chunks, then wait again so the next tile's values do not overwrite rows still being read.
  template <class STensor, class SyncFn, class VTensor>
  CUTLASS_DEVICE void reduce(STensor&&, SyncFn const& sync_fn, int, int, bool is_last_iteration, VTensor) {
    if (!is_last_iteration) return;
    sync_fn();
    for (int k = thread_idx; k < kRows * kChunks; k += kThreads) {
      const int r = k / kChunks, c = (k % kChunks) * 8;
      if (r < rows && c < cols) {
        uint4 v = *reinterpret_cast<const uint4*>(stage + staged(r, c));
        if constexpr (Pairing::kPlanes == 2)
          v = Pairing::combine(*this, v, *reinterpret_cast<const uint4*>(stage + kPlaneElements + staged(r, c)));
        *reinterpret_cast<uint4*>(out + r * params.ld_out + c) = v;
      }
    }
    sync_fn();
  }
};

/// The node for a kTileM x kTileN tile stored by one epilogue (a consumer warpgroup, or both in the cooperative
/// schedule) of kThreads threads and paired by Pairing. Plain forms: kTileM act rows of kTileN / 2 values. Swapped
/// form (out^T = W x^T, cooperative): the kTileM weight rows are kTileM / 2 act columns and the kTileN plan rows are
/// act rows, staged transposed. One staging buffer holds kRows act rows of kCols values
/// (GatedTileCallbacks::staged()) and one bias slice the tile's b13 values. The pingpong schedule's two consumers
/// share both: CUTLASS's pingpong kernel runs their epilogues one after the other (its order barrier, behind which
/// they share the D staging too), and reduce() has read the whole buffer before it returns. A buffer per consumer
/// left the pingpong 64x256 tile's main loop four stages instead of five.
///
/// The buffer begins kBorrowBytes before the node's own storage, in the epilogue's D staging: an epilogue without D
/// (ElementD = void) still reserves it, sized by ElementAux, and never touches it. Sm90GroupedGemm checks that the
/// collective's storage of exactly kBorrowBytes lies right before this node's. Without the loan the cooperative
/// 128x256 tile's main loop has three stages instead of four.
template <int kTileM, int kTileN, int kThreads, class Pairing, int kBorrowBytes>
struct Sm90GatedStore : GatedStoreBase {
  static constexpr bool kSwapped = Pairing::kSwapped;
  static constexpr bool kHalves = Pairing::kBiasGapAt > 0;
  static_assert(!kHalves || Pairing::kBiasGapAt == (kSwapped ? kTileM : kTileN) / 2,
                "the halves split the tile's weight rows in two");
  static constexpr int kRows = kSwapped ? kTileN : kTileM;
  static constexpr int kCols = kSwapped ? kTileM / 2 : kTileN / 2;
  static constexpr int kBufferElements = kRows * kCols * Pairing::kPlanes;
  static constexpr int kBiasLength = kSwapped ? kTileM : kTileN;  // b13 values per tile: along the weight rows
  static constexpr int kStagingBytes = kBufferElements * static_cast<int>(sizeof(__nv_bfloat16));
  static_assert(kBorrowBytes % 16 == 0, "the staging buffer is copied out in 16-byte chunks");
  // At least 16 bytes of its own, so that the storage is never empty when the loan covers the buffer.
  static constexpr int kOwnBytes = kStagingBytes > kBorrowBytes + 16 ? kStagingBytes - kBorrowBytes : 16;
  struct SharedStorage {
    alignas(16) unsigned char bytes[kOwnBytes];  // first: the staging buffer continues the loan here
    alignas(16) float bias[kBiasLength];
  };
  template <class CTensor>
  using ConsumerStoreCallbacks = GatedTileCallbacks<CTensor, Pairing, kRows, kCols, kBiasLength, kThreads>;

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
    // Halves: the tile's outputs w0 / 2 on (w0 = m0 or n0, the tile's first weight row) are w13 rows w0 / 2 on in
    // each block (W / 2 rows apart, W = 2I the weights' extent).
    const int act_row = kSwapped ? n0 : m0, act_col = kSwapped ? m0 / 2 : n0 / 2;
    const int rows = kSwapped ? min(kTileN, static_cast<int>(N) - n0) : min(kTileM, static_cast<int>(M) - m0);
    const int cols =
        kSwapped ? min(kCols, (static_cast<int>(M) - m0) / 2) : min(kCols, (static_cast<int>(N) - n0) / 2);
    const int64_t W = kSwapped ? M : N;
    const int w0 = kSwapped ? m0 : n0, tile_w = kSwapped ? kTileM : kTileN;
    const int64_t bias_base = expert * W + (kHalves ? w0 / 2 : w0);
    const int bias_count = static_cast<int>(W) - w0;
    const int64_t bias_gap = kHalves ? W / 2 - tile_w / 2 : 0;
    // The loan starts kBorrowBytes before this node's storage, outside its C++ object: address arithmetic.
    auto* staging = reinterpret_cast<__nv_bfloat16*>(reinterpret_cast<uintptr_t>(storage) - kBorrowBytes);
    return ConsumerStoreCallbacks<decltype(args.tCcD)>(args.tCcD, first_m - m0, first_n - n0, rows, cols,
                                                       act + static_cast<int64_t>(act_row) * params.ld_out + act_col,
                                                       staging, storage->bias, bias_base, bias_count, bias_gap,
                                                       args.thread_idx, params);
  }
};

}  // namespace moekit::detail

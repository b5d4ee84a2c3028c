// GEMM1's main loop for w13 stored in two blocks (gate-first or up-first: rows [0, I) of one kind, [I, 2I) of the
// other), so that the fused gated epilogue can serve those checkpoints as it serves interleaved ones. The weights'
// tile t (kTileW weight rows: B's N tile in the plain form, A's M tile in the swapped form) is rows [t h, t h + h) of
// the first block followed by the same rows of the second block, h = kTileW / 2: two TMA boxes of h rows per stage,
// each landing in its half of the tile's shared memory. Plain form: accumulator columns j and j + h of a row are the
// same output's two halves (one thread holds both: the wgmma accumulator layout repeats every 8 columns). Swapped
// form: accumulator rows j and j + h, held by the two consumer warpgroups (the epilogue pairs them through shared
// memory). The problem's extent along the weights stays 2I and its tile count I / h; the caller guarantees
// I % h == 0.
//
// Built on CUTLASS's sm90 ptr-array TMA main loop: everything but the weights' TMA is the stock collective's. The
// weights' copy atom here has a box of h rows instead of kTileW, so this collective keeps its own atom
// (Params::tma_load_halves) and uses it where the stock code uses tma_load_b (or tma_load_a): the weights'
// tensormap (initialized from it, its dims and strides replaced per group through it), load_init()'s tile view of
// the weights and load().
#pragma once

#include <type_traits>

#include "cutlass/gemm/collective/collective_builder.hpp"

namespace moekit::detail {

/// kOnA: the weights are A (swapped form), else B.
template <class Stock, bool kOnA = false>
struct Sm90HalvesMainloop : Stock {
  using TileShape = typename Stock::TileShape;
  using InternalElementA = typename Stock::InternalElementA;
  using InternalElementB = typename Stock::InternalElementB;
  using TensorStorage = typename Stock::TensorStorage;
  using TensorMapStorage = typename Stock::TensorMapStorage;
  using MainloopPipeline = typename Stock::MainloopPipeline;
  using PipelineState = typename Stock::PipelineState;
  // The weights' operand: element, stride, shared-memory atom.
  using ElementW = std::conditional_t<kOnA, InternalElementA, InternalElementB>;
  using StrideW = std::conditional_t<kOnA, typename Stock::InternalStrideA, typename Stock::InternalStrideB>;
  using SmemLayoutAtomW = std::conditional_t<kOnA, typename Stock::SmemLayoutAtomA, typename Stock::SmemLayoutAtomB>;

  static constexpr int kTileW = cute::size<(kOnA ? 0 : 1)>(TileShape{});
  static constexpr int kTileK = cute::size<2>(TileShape{});
  static constexpr int kHalf = kTileW / 2;
  static_assert(kHalf % 64 == 0, "each half of the weights' tile must be whole 64-row swizzle panels");
  static_assert(cute::size<0>(typename Stock::DispatchPolicy::ClusterShape{}) == 1 &&
                    cute::size<1>(typename Stock::DispatchPolicy::ClusterShape{}) == 1,
                "one CTA per cluster: the weights' halves are not multicast");

  // One half of the weights' stage: the stage's first kHalf rows, the same layout the stock tile has there (rows are
  // the outer mode of the K-major layout, so each half is contiguous).
  using SmemLayoutHalf =
      decltype(cute::tile_to_shape(SmemLayoutAtomW{}, cute::make_shape(cute::Int<kHalf>{}, cute::Int<kTileK>{})));
  using TmaHalves = decltype(cute::make_tma_copy(
      cute::SM90_TMA_LOAD{},
      cute::make_tensor(static_cast<ElementW const*>(nullptr), cute::repeat_like(StrideW{}, int32_t(0)), StrideW{}),
      SmemLayoutHalf{}, cute::make_shape(cute::Int<kHalf>{}, cute::Int<kTileK>{}), cute::_1{}));

  struct Params : Stock::Params {
    TmaHalves tma_load_halves;
  };

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape problem_shapes, typename Stock::Arguments const& args,
                                                  void* workspace) {
    Params p{Stock::to_underlying_arguments(problem_shapes, args, workspace), {}};
    // As the stock collective: a placeholder address and shape, replaced per group before the first load.
    const void* ptr = kOnA ? static_cast<const void*>(args.ptr_A) : static_cast<const void*>(args.ptr_B);
    auto const* ptr_w = reinterpret_cast<ElementW const*>(reinterpret_cast<uint64_t>(ptr) & 0xFFFFFFFFFFFFFFF0);
    auto tensor_w = cute::make_tensor(ptr_w, cute::make_layout(cute::make_shape(1, 1, 1), StrideW{}));
    p.tma_load_halves = cute::make_tma_copy(cute::SM90_TMA_LOAD{}, tensor_w, SmemLayoutHalf{},
                                            cute::make_shape(cute::Int<kHalf>{}, cute::Int<kTileK>{}), cute::_1{});
    return p;
  }

  /// The other operand's tiles as the stock collective makes them; the weights' tile t as ((kHalf, 2), BLK_K): row i
  /// of half s is weight row t kHalf + i + s R / 2, R the weights' rows (2I).
  template <class ProblemShape_MNKL>
  CUTLASS_DEVICE auto load_init(ProblemShape_MNKL const& problem_shape_mnkl, Params const& p) const {
    using namespace cute;
    auto [M, N, K, L] = problem_shape_mnkl;
    const auto R = kOnA ? M : N;
    Tensor mW = p.tma_load_halves.get_tma_tensor(make_shape(R, K, 1));
    Tensor gW_half = local_tile(mW, make_shape(Int<kHalf>{}, Int<kTileK>{}), make_coord(_, _, _));
    auto const& h = gW_half.layout();  // (kHalf, BLK_K, R / kHalf, k, l)
    const int tiles = static_cast<int>(R) / kTileW;
    auto layout =
        make_layout(make_shape(make_shape(Int<kHalf>{}, _2{}), shape<1>(h), tiles, shape<3>(h), shape<4>(h)),
                    make_stride(make_stride(stride<0>(h), stride<2>(h) * tiles), stride<1>(h), stride<2>(h),
                                stride<3>(h), stride<4>(h)));
    Tensor gW = make_tensor(gW_half.data(), layout);
    if constexpr (kOnA) {
      Tensor mB_nkl = p.tma_load_b.get_tma_tensor(make_shape(N, K, 1));
      Tensor gB_nkl = local_tile(mB_nkl, TileShape{}, make_coord(_, _, _), Step<Underscore, _1, _1>{});
      return make_tuple(gW, gB_nkl);
    } else {
      Tensor mA_mkl = p.tma_load_a.get_tma_tensor(make_shape(M, K, 1));
      Tensor gA_mkl = local_tile(mA_mkl, TileShape{}, make_coord(_, _, _), Step<_1, Underscore, _1>{});
      return make_tuple(gA_mkl, gW);
    }
  }

  /// A's and B's copy atoms: the halves' for the weights, the stock one for the other operand.
  static CUTLASS_DEVICE auto const& atom_a(Params const& p) {
    if constexpr (kOnA)
      return p.tma_load_halves;
    else
      return p.tma_load_a;
  }
  static CUTLASS_DEVICE auto const& atom_b(Params const& p) {
    if constexpr (kOnA)
      return p.tma_load_b;
    else
      return p.tma_load_halves;
  }

  /// The stock producer loop, with the weights' two boxes per stage.
  template <class TensorA, class TensorB, class TensorMapA, class TensorMapB, class KTileIterator, class BlockCoord>
  CUTLASS_DEVICE void load(Params const& p, MainloopPipeline pipeline, PipelineState smem_pipe_write,
                           cute::tuple<TensorA, TensorB> const& load_inputs,
                           cute::tuple<TensorMapA, TensorMapB> const& input_tensormaps, BlockCoord const& blk_coord,
                           KTileIterator k_tile_iter, int k_tile_count, int, uint32_t, TensorStorage& shared) {
    using namespace cute;
    if (!elect_one_sync()) return;
    Tensor sA = make_tensor(make_smem_ptr(shared.smem_A.data()), typename Stock::SmemLayoutA{});
    Tensor sB = make_tensor(make_smem_ptr(shared.smem_B.data()), typename Stock::SmemLayoutB{});
    auto const& tma_a = atom_a(p);
    auto const& tma_b = atom_b(p);
    const auto l_coord = get<3>(blk_coord);
    // (TMA, TMA_M, TMA_K, k) and (TMA, TMA_M, TMA_K, PIPE), B's likewise; the weights' TMA_M (or TMA_N) is the
    // halves.
    Tensor tAgA = tma_a.get_slice(0).partition_S(get<0>(load_inputs)(_, _, get<0>(blk_coord), _, l_coord));
    Tensor tAsA = tma_a.get_slice(0).partition_D(sA);
    Tensor tBgB = tma_b.get_slice(0).partition_S(get<1>(load_inputs)(_, _, get<1>(blk_coord), _, l_coord));
    Tensor tBsB = tma_b.get_slice(0).partition_D(sB);
    CUTLASS_PRAGMA_NO_UNROLL
    for (; k_tile_count > 0; --k_tile_count) {
      pipeline.producer_acquire(smem_pipe_write);
      auto* barrier = pipeline.producer_get_barrier(smem_pipe_write);
      const int stage = smem_pipe_write.index();
      copy(tma_a.with(get<0>(input_tensormaps), *barrier, 0), tAgA(_, _, _, *k_tile_iter), tAsA(_, _, _, stage));
      copy(tma_b.with(get<1>(input_tensormaps), *barrier, 0), tBgB(_, _, _, *k_tile_iter), tBsB(_, _, _, stage));
      ++k_tile_iter;
      ++smem_pipe_write;
    }
  }

  /// As the stock collective, the weights' tensormap from the halves' atom.
  CUTLASS_DEVICE auto tensormaps_init(Params const& p, TensorMapStorage& shared, int32_t sm_count, int32_t sm_idx) {
    using namespace cute;
    auto* gmem = reinterpret_cast<TmaDescriptor*>(p.tensormaps);
    if (elect_one_sync()) {
      copy(recast<uint128_t>(make_tensor(atom_a(p).get_tma_descriptor(), Int<1>{}, Int<1>{})),
           recast<uint128_t>(make_tensor(make_smem_ptr(&shared.smem_tensormap_A), Int<1>{}, Int<1>{})));
      copy(recast<uint128_t>(make_tensor(atom_b(p).get_tma_descriptor(), Int<1>{}, Int<1>{})),
           recast<uint128_t>(make_tensor(make_smem_ptr(&shared.smem_tensormap_B), Int<1>{}, Int<1>{})));
    }
    __syncwarp();
    return make_tuple(&gmem[sm_idx], &gmem[sm_idx + sm_count]);
  }

  /// As the stock collective: the group's addresses, then its dims and strides (the weights' through the halves'
  /// atom).
  template <class TensorMapA, class TensorMapB, class ProblemShape_MNKL>
  CUTLASS_DEVICE void tensormaps_perform_update(TensorMapStorage& shared, Params const& p,
                                                cute::tuple<TensorMapA, TensorMapB> const&,
                                                ProblemShape_MNKL problem_shape_mnkl, int32_t group) {
    using namespace cute;
    if (!elect_one_sync()) return;
    this->tensormaps_replace_global_address(shared, p, group);
    const uint32_t M = get<0>(problem_shape_mnkl), N = get<1>(problem_shape_mnkl), K = get<2>(problem_shape_mnkl);
    cute::array<uint32_t, 5> shape_a = {1, 1, 1, 1, 1}, shape_b = {1, 1, 1, 1, 1};
    cute::array<uint64_t, 5> stride_a = {0, 0, 0, 0, 0}, stride_b = {0, 0, 0, 0, 0};
    Tensor tensor_a =
        make_tensor(static_cast<InternalElementA const*>(nullptr), make_shape(M, K, Int<1>{}), p.dA[group]);
    Tensor tensor_b =
        make_tensor(static_cast<InternalElementB const*>(nullptr), make_shape(N, K, Int<1>{}), p.dB[group]);
    cute::detail::fill_tma_gmem_shape_stride(atom_a(p), tensor_a, shape_a, stride_a);
    cute::detail::fill_tma_gmem_shape_stride(atom_b(p), tensor_b, shape_b, stride_b);
    for (uint64_t& s : stride_a) s = s * sizeof_bits_v<InternalElementA> / 8;
    for (uint64_t& s : stride_b) s = s * sizeof_bits_v<InternalElementB> / 8;
    tma_descriptor_replace_dims_strides_in_shared_mem(shared.smem_tensormap_A, shape_a, stride_a);
    tma_descriptor_replace_dims_strides_in_shared_mem(shared.smem_tensormap_B, shape_b, stride_b);
  }
};

}  // namespace moekit::detail

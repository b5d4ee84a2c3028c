// GEMM1's main loop for w13 stored in two blocks (gate-first or up-first: rows [0, I) of one kind, [I, 2I) of the
// other), so that the fused gated epilogue can serve those checkpoints as it serves interleaved ones. B's N tile n
// (kTileN weight rows) is rows [n h, n h + h) of the first block followed by the same rows of the second block, h =
// kTileN / 2: two TMA boxes of h rows per stage, each landing in its half of the tile's shared memory, so that
// accumulator columns j and j + h of a row are the same output's two halves (one thread holds both: the wgmma
// accumulator layout repeats every 8 columns). The problem's N stays 2I and its tile count I / h; the caller
// guarantees I % h == 0.
//
// Built on CUTLASS's sm90 ptr-array TMA main loop: everything but B's TMA is the stock collective's. B's copy atom
// here has a box of h rows instead of kTileN, so this collective keeps its own atom (Params::tma_load_b_halves) and
// uses it where the stock code uses tma_load_b: B's tensormap (initialized from it, its dims and strides replaced per
// group through it), load_init()'s tile view of B and load().
#pragma once

#include "cutlass/gemm/collective/collective_builder.hpp"

namespace moekit::detail {

template <class Stock>
struct Sm90HalvesMainloop : Stock {
  using TileShape = typename Stock::TileShape;
  using InternalElementB = typename Stock::InternalElementB;
  using InternalStrideB = typename Stock::InternalStrideB;
  using TensorStorage = typename Stock::TensorStorage;
  using TensorMapStorage = typename Stock::TensorMapStorage;
  using MainloopPipeline = typename Stock::MainloopPipeline;
  using PipelineState = typename Stock::PipelineState;
  using SmemLayoutB = typename Stock::SmemLayoutB;

  static constexpr int kTileN = cute::size<1>(TileShape{});
  static constexpr int kTileK = cute::size<2>(TileShape{});
  static constexpr int kHalf = kTileN / 2;
  static_assert(kHalf % 64 == 0, "each half of B's tile must be whole 64-row swizzle panels");
  static_assert(cute::size<0>(typename Stock::DispatchPolicy::ClusterShape{}) == 1 &&
                    cute::size<1>(typename Stock::DispatchPolicy::ClusterShape{}) == 1,
                "one CTA per cluster: B's halves are not multicast");

  // One half of B's stage: the stage's first kHalf rows, the same layout the stock tile has there (rows of B are
  // the outer mode of its K-major layout, so each half is contiguous).
  using SmemLayoutBHalf = decltype(cute::tile_to_shape(typename Stock::SmemLayoutAtomB{},
                                                       cute::make_shape(cute::Int<kHalf>{}, cute::Int<kTileK>{})));
  using TmaBHalves = decltype(cute::make_tma_copy(
      cute::SM90_TMA_LOAD{},
      cute::make_tensor(static_cast<InternalElementB const*>(nullptr),
                        cute::repeat_like(InternalStrideB{}, int32_t(0)), InternalStrideB{}),
      SmemLayoutBHalf{}, cute::make_shape(cute::Int<kHalf>{}, cute::Int<kTileK>{}), cute::_1{}));

  struct Params : Stock::Params {
    TmaBHalves tma_load_b_halves;
  };

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape problem_shapes, typename Stock::Arguments const& args,
                                                  void* workspace) {
    Params p{Stock::to_underlying_arguments(problem_shapes, args, workspace), {}};
    // As the stock collective: a placeholder address and shape, replaced per group before the first load.
    auto const* ptr_b =
        reinterpret_cast<InternalElementB const*>(reinterpret_cast<uint64_t>(args.ptr_B) & 0xFFFFFFFFFFFFFFF0);
    auto tensor_b = cute::make_tensor(ptr_b, cute::make_layout(cute::make_shape(1, 1, 1), InternalStrideB{}));
    p.tma_load_b_halves = cute::make_tma_copy(cute::SM90_TMA_LOAD{}, tensor_b, SmemLayoutBHalf{},
                                              cute::make_shape(cute::Int<kHalf>{}, cute::Int<kTileK>{}), cute::_1{});
    return p;
  }

  /// A's tiles as the stock collective makes them; B's tile n as ((kHalf, 2), BLK_K): row i of half s is weight
  /// row n kHalf + i + s N / 2.
  template <class ProblemShape_MNKL>
  CUTLASS_DEVICE auto load_init(ProblemShape_MNKL const& problem_shape_mnkl, Params const& p) const {
    using namespace cute;
    auto [M, N, K, L] = problem_shape_mnkl;
    Tensor mA_mkl = p.tma_load_a.get_tma_tensor(make_shape(M, K, 1));
    Tensor gA_mkl = local_tile(mA_mkl, TileShape{}, make_coord(_, _, _), Step<_1, Underscore, _1>{});
    Tensor mB_nkl = p.tma_load_b_halves.get_tma_tensor(make_shape(N, K, 1));
    Tensor gB_half = local_tile(mB_nkl, make_shape(Int<kHalf>{}, Int<kTileK>{}), make_coord(_, _, _));
    auto const& h = gB_half.layout();  // (kHalf, BLK_K, N / kHalf, k, l)
    const int tiles = static_cast<int>(N) / kTileN;
    auto layout =
        make_layout(make_shape(make_shape(Int<kHalf>{}, _2{}), shape<1>(h), tiles, shape<3>(h), shape<4>(h)),
                    make_stride(make_stride(stride<0>(h), stride<2>(h) * tiles), stride<1>(h), stride<2>(h),
                                stride<3>(h), stride<4>(h)));
    return make_tuple(gA_mkl, make_tensor(gB_half.data(), layout));
  }

  /// The stock producer loop, with B's two boxes per stage.
  template <class TensorA, class TensorB, class TensorMapA, class TensorMapB, class KTileIterator, class BlockCoord>
  CUTLASS_DEVICE void load(Params const& p, MainloopPipeline pipeline, PipelineState smem_pipe_write,
                           cute::tuple<TensorA, TensorB> const& load_inputs,
                           cute::tuple<TensorMapA, TensorMapB> const& input_tensormaps, BlockCoord const& blk_coord,
                           KTileIterator k_tile_iter, int k_tile_count, int, uint32_t, TensorStorage& shared) {
    using namespace cute;
    if (!elect_one_sync()) return;
    Tensor sA = make_tensor(make_smem_ptr(shared.smem_A.data()), typename Stock::SmemLayoutA{});
    Tensor sB = make_tensor(make_smem_ptr(shared.smem_B.data()), SmemLayoutB{});
    auto block_tma_a = p.tma_load_a.get_slice(0);
    auto block_tma_b = p.tma_load_b_halves.get_slice(0);
    auto [m_coord, n_coord, k_coord, l_coord] = blk_coord;
    Tensor tAgA = block_tma_a.partition_S(get<0>(load_inputs)(_, _, m_coord, _, l_coord));  // (TMA, TMA_M, TMA_K, k)
    Tensor tAsA = block_tma_a.partition_D(sA);  // (TMA, TMA_M, TMA_K, PIPE)
    Tensor tBgB = block_tma_b.partition_S(get<1>(load_inputs)(_, _, n_coord, _, l_coord));  // (TMA, 2, TMA_K, k)
    Tensor tBsB = block_tma_b.partition_D(sB);                                              // (TMA, 2, TMA_K, PIPE)
    CUTLASS_PRAGMA_NO_UNROLL
    for (; k_tile_count > 0; --k_tile_count) {
      pipeline.producer_acquire(smem_pipe_write);
      auto* barrier = pipeline.producer_get_barrier(smem_pipe_write);
      const int stage = smem_pipe_write.index();
      copy(p.tma_load_a.with(get<0>(input_tensormaps), *barrier, 0), tAgA(_, _, _, *k_tile_iter),
           tAsA(_, _, _, stage));
      copy(p.tma_load_b_halves.with(get<1>(input_tensormaps), *barrier, 0), tBgB(_, _, _, *k_tile_iter),
           tBsB(_, _, _, stage));
      ++k_tile_iter;
      ++smem_pipe_write;
    }
  }

  /// As the stock collective, B's tensormap from the halves' atom.
  CUTLASS_DEVICE auto tensormaps_init(Params const& p, TensorMapStorage& shared, int32_t sm_count, int32_t sm_idx) {
    using namespace cute;
    auto* gmem = reinterpret_cast<TmaDescriptor*>(p.tensormaps);
    if (elect_one_sync()) {
      copy(recast<uint128_t>(make_tensor(p.tma_load_a.get_tma_descriptor(), Int<1>{}, Int<1>{})),
           recast<uint128_t>(make_tensor(make_smem_ptr(&shared.smem_tensormap_A), Int<1>{}, Int<1>{})));
      copy(recast<uint128_t>(make_tensor(p.tma_load_b_halves.get_tma_descriptor(), Int<1>{}, Int<1>{})),
           recast<uint128_t>(make_tensor(make_smem_ptr(&shared.smem_tensormap_B), Int<1>{}, Int<1>{})));
    }
    __syncwarp();
    return make_tuple(&gmem[sm_idx], &gmem[sm_idx + sm_count]);
  }

  /// As the stock collective: the group's addresses, then its dims and strides (B's through the halves' atom).
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
    using ElementA = typename Stock::InternalElementA;
    Tensor tensor_a = make_tensor(static_cast<ElementA const*>(nullptr), make_shape(M, K, Int<1>{}), p.dA[group]);
    Tensor tensor_b =
        make_tensor(static_cast<InternalElementB const*>(nullptr), make_shape(N, K, Int<1>{}), p.dB[group]);
    cute::detail::fill_tma_gmem_shape_stride(p.tma_load_a, tensor_a, shape_a, stride_a);
    cute::detail::fill_tma_gmem_shape_stride(p.tma_load_b_halves, tensor_b, shape_b, stride_b);
    for (uint64_t& s : stride_a) s = s * sizeof_bits_v<ElementA> / 8;
    for (uint64_t& s : stride_b) s = s * sizeof_bits_v<InternalElementB> / 8;
    tma_descriptor_replace_dims_strides_in_shared_mem(shared.smem_tensormap_A, shape_a, stride_a);
    tma_descriptor_replace_dims_strides_in_shared_mem(shared.smem_tensormap_B, shape_b, stride_b);
  }
};

}  // namespace moekit::detail

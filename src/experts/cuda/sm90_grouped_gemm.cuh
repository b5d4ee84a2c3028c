// One CUTLASS sm90 ptr-array grouped GEMM, D[g] = A[g] * B[g]^T in bf16 with fp32 accumulation: A [M, K] and B
// [N, K] K-contiguous (TMA loads, wgmma), D [M, N] through a TMA epilogue, no C operand. Problem shapes live on the
// device only (filled by a kernel from the route plan), so the persistent grid is one CTA per SM and the group tile
// scheduler walks the groups on the device, skipping empty ones. Each sm90_grouped_gemm_*.cu instantiates one tile
// config (DESIGN §9: ~40 s and ~3.5 GB of compile each, keep them few).
#pragma once

#include <cuda_runtime.h>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "experts/cuda/experts_kernels.h"
#include "experts/cuda/sm90_gated_epilogue.cuh"
#include "experts/cuda/sm90_grouped_types.cuh"
#include "experts/cuda/sm90_halves_mainloop.cuh"
#include "moekit/error.h"

namespace moekit::detail {

/// What a grouped GEMM's groups multiply and store. plain: A = the plan's rows, B = weights, D row-major.
/// gated: as plain, but no D: the epilogue applies the gated activation to interleaved gate/up column pairs and
/// stores act rows (sm90_gated_epilogue.cuh). swap_ab: A = weights, B = the plan's rows and D column-major, i.e.
/// out^T = W x^T, so that a few rows per expert fill a narrow N tile instead of a 64-row M tile. swap_gated: as
/// swap_ab, with gated's epilogue on interleaved gate/up row pairs (cooperative only). gated_halves: as gated, for
/// w13 in two blocks (gate-first or up-first): B's tiles are loaded by sm90_halves_mainloop.cuh, half from each
/// block. swap_gated_halves: swap_gated for w13 in two blocks, A's tiles loaded half from each block.
enum class GroupedForm { plain, gated, swap_ab, swap_gated, gated_halves, swap_gated_halves };

/// A tile configuration: CTA tile (M, N, K), the warp-specialized schedule and the form.
template <int kTileM, int kTileN, int kTileK, bool kCooperative, GroupedForm kForm = GroupedForm::plain>
struct Sm90GroupedGemm {
  static constexpr bool kHalves = kForm == GroupedForm::gated_halves || kForm == GroupedForm::swap_gated_halves;
  static constexpr bool kGated = kForm == GroupedForm::gated || kForm == GroupedForm::swap_gated || kHalves;
  static constexpr bool kSwapped =
      kForm == GroupedForm::swap_ab || kForm == GroupedForm::swap_gated || kForm == GroupedForm::swap_gated_halves;
  // No D when gated: its layout only shapes the epilogue's unused staging types.
  using LayoutD = std::conditional_t<kForm == GroupedForm::swap_ab, GroupedLayoutDT, GroupedLayoutD>;
  using StrideD = std::conditional_t<kForm == GroupedForm::swap_ab, GroupedStrideDT, GroupedStrideD>;
  using ElementAB = cutlass::bfloat16_t;
  using ElementD = std::conditional_t<kGated, void, cutlass::bfloat16_t>;
  using ElementAcc = float;
  using TileShape = cute::Shape<cute::Int<kTileM>, cute::Int<kTileN>, cute::Int<kTileK>>;
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using KernelSchedule = std::conditional_t<kCooperative, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative,
                                            cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong>;
  using EpilogueSchedule = std::conditional_t<kCooperative, cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
                                              cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong>;
  static constexpr int kAlign = 8;  // 16 bytes of bf16

  template <class D, class FusionOp>
  using EpilogueFor = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAcc, ElementAcc, void, LayoutD*, kAlign, D, LayoutD*,
      kAlign, EpilogueSchedule, FusionOp>::CollectiveOp;
  template <class Epilogue>
  using CollectiveStorageOf = typename Epilogue::TensorStorage::CollectiveStorage;
  using PlainFusion = cutlass::epilogue::fusion::LinearCombination<cutlass::bfloat16_t, ElementAcc>;
  // The D staging of this tile's epilogue with a bf16 D: the gated (void-D) epilogue reserves the same, unused, and
  // the gated store's buffer begins there.
  static constexpr int kDStagingBytes =
      static_cast<int>(sizeof(CollectiveStorageOf<EpilogueFor<cutlass::bfloat16_t, PlainFusion>>));
  using Pairing =
      std::conditional_t<kHalves,
                         std::conditional_t<kSwapped, PairAcrossRowHalves<kTileM / 2>, PairAcrossHalves<kTileN / 2>>,
                         std::conditional_t<kSwapped, PairAcrossRows, PairAcrossColumns>>;
  using GatedStore = Sm90GatedStore<kTileM, kTileN, kCooperative ? 256 : 128, Pairing, kDStagingBytes>;
  using Fusion = std::conditional_t<
      kGated, cutlass::epilogue::fusion::Sm90EVT<GatedStore, cutlass::epilogue::fusion::Sm90AccFetch>, PlainFusion>;
  using CollectiveEpilogue = EpilogueFor<ElementD, Fusion>;
  // The loan's layout: the epilogue's tensor storage is the collective's (the D staging, kDStagingBytes) followed
  // directly by the fusion's, which is the gated store's alone (the accumulator fetch has none).
  template <class Epilogue>
  static constexpr bool lends_d_staging() {
    using Tensors = typename Epilogue::TensorStorage;
    return sizeof(CollectiveStorageOf<Epilogue>) == kDStagingBytes && offsetof(Tensors, thread) == kDStagingBytes &&
           sizeof(typename Tensors::FusionStorage) == sizeof(typename GatedStore::SharedStorage);
  }
  static_assert(!kGated || lends_d_staging<CollectiveEpilogue>(),
                "the gated store's buffer must begin in the epilogue's unused D staging");
  static_assert(!kHalves || kSwapped ||
                    (kTileN / 2) % cute::size<1>(typename CollectiveEpilogue::EpilogueTile{}) == 0,
                "PairAcrossHalves needs every epilogue subtile inside one half of the tile");

  using StockMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementAB, GroupedLayoutA*, kAlign, ElementAB,
      GroupedLayoutB*, kAlign, ElementAcc, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;
  using CollectiveMainloop = std::conditional_t<kHalves, Sm90HalvesMainloop<StockMainloop, kSwapped>, StockMainloop>;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<GroupedProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  // CUTLASS's stage count leaves the kernel's own few hundred bytes of shared memory out; check the total.
  static_assert(sizeof(typename Kernel::SharedStorage) <= cutlass::gemm::collective::detail::sm90_smem_capacity_bytes,
                "the kernel's shared storage exceeds what a CTA may have");

  static_assert(std::is_same_v<typename Kernel::InternalStrideA, GroupedStrideA>);
  static_assert(std::is_same_v<typename Kernel::InternalStrideB, GroupedStrideB>);
  static_assert(std::is_same_v<typename Kernel::InternalStrideD, StrideD>);

  static typename Gemm::Arguments arguments(const GroupedGemmArgs& a) {
    typename Gemm::Arguments args{};
    args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
    args.problem_shape = {a.groups, static_cast<GroupedProblemShape::UnderlyingProblemShape*>(a.problem_shapes),
                          nullptr};
    args.mainloop.ptr_A = reinterpret_cast<const ElementAB**>(a.ptr_a);
    args.mainloop.dA = static_cast<GroupedStrideA*>(a.stride_a);
    args.mainloop.ptr_B = reinterpret_cast<const ElementAB**>(a.ptr_b);
    args.mainloop.dB = static_cast<GroupedStrideB*>(a.stride_b);
    if constexpr (kGated) {
      args.epilogue.thread.op_1 = a.gated;  // op_0: the accumulator fetch, op_1: the gated store
      args.epilogue.ptr_D = nullptr;
      args.epilogue.dD = nullptr;
    } else {
      args.epilogue.thread.alpha = 1.0f;
      args.epilogue.thread.beta = 0.0f;
      args.epilogue.ptr_D = reinterpret_cast<ElementD**>(a.ptr_d);
      args.epilogue.dD = static_cast<StrideD*>(a.stride_d);
    }
    args.epilogue.ptr_C = nullptr;
    args.epilogue.dC = nullptr;
    // A group's tiles are walked with M fastest: plain, the row tiles of one weight tile in a row (the weight tile
    // comes from L2 after the first); swapped, the weights are on M, so N (the row tiles) goes fastest instead.
    if constexpr (kSwapped) args.scheduler.raster_order = cutlass::gemm::kernel::detail::RasterOrderOptions::AlongN;
    args.hw_info.device_id = 0;
    args.hw_info.sm_count = a.sm_count;
    return args;
  }

  static size_t workspace_size(int groups, int sm_count) {
    GroupedGemmArgs a{};
    a.groups = groups;
    a.sm_count = sm_count;
    return Gemm::get_workspace_size(arguments(a));
  }

  static void run(const GroupedGemmArgs& a, Stream stream) {
    Gemm gemm;
    typename Gemm::Arguments args = arguments(a);
    cutlass::Status status = gemm.can_implement(args);
    if (status != cutlass::Status::kSuccess)
      throw Internal("experts", std::string("grouped GEMM can_implement: ") + cutlassGetStatusString(status));
    status = gemm.run(args, a.workspace, static_cast<cudaStream_t>(stream));
    if (status != cutlass::Status::kSuccess)
      throw CudaError("experts", std::string("grouped GEMM launch failed: ") + cutlassGetStatusString(status));
    check_launch("grouped GEMM");
  }

  static GroupedGemmOps ops() { return {&workspace_size, &run}; }
};

}  // namespace moekit::detail

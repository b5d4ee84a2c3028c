// Expert parallelism (EP) over NCCL: the E routed experts of a layer are split contiguously over W ranks (one GPU
// each), fused shared experts are replicated, and tokens move between ranks in one of two modes:
//   all_gather:  all-gather hidden [T, H] and logits [T, E]; every rank routes all W*T tokens identically, computes
//                its local experts' (and, for its own tokens, the shared experts') contributions, and a
//                reduce-scatter (sum) returns each rank its T rows;
//   all_to_all:  each rank routes its own tokens, exchanges per-destination row counts, sends each token row once to
//                every rank that owns one of its experts (grouped ncclSend/ncclRecv), the owners compute, the rows
//                come back and the sender sums the partial outputs in fp32 (rank order) with one rounding to bf16.
// Both modes use receive buffers sized for the worst case (W * max_tokens rows) and messages of a fixed size per
// call, so neither synchronizes with the host: both are capturable in CUDA graphs. A CPU simulation of both modes
// (W in-process ranks on the reference experts) is always built; the NCCL parts need a CUDA build.
// No NCCL or CUDA header here: a communicator is an opaque handle (an ncclComm_t).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/cuda_experts.h"
#include "moekit/experts.h"
#include "moekit/routing.h"
#include "moekit/tensor.h"

namespace moekit {

/// Largest world size (a token's destinations are kept in a 32-bit mask).
inline constexpr int kMaxWorldSize = 32;

// ---- partition ------------------------------------------------------------------------------------------------

/// The routed experts one rank holds: global ids [offset, offset + count).
struct ExpertPartition {
  int offset = 0;
  int count = 0;
};

/// Contiguous partition of E routed experts over W ranks: every rank holds E / W experts and the first E % W ranks
/// one more (deterministic, so every rank computes the same table). Throws InvalidArgument (op "ep") for
/// world_size outside 1..32, num_experts < world_size (a rank without experts) or rank outside [0, world_size).
ExpertPartition expert_partition(int num_experts, int world_size, int rank);

/// The rank that holds routed expert `expert`. Throws InvalidArgument as expert_partition, or for an expert outside
/// [0, num_experts).
int expert_owner(int num_experts, int world_size, int expert);

/// `global` (local_num_experts -1 or E, offset 0) with rank `rank`'s local_num_experts and local_expert_offset set.
/// The shared experts stay as they are: every rank holds all S. Throws InvalidArgument as expert_partition, and
/// when `global` already names a different local range.
ExpertConfig rank_expert_config(const ExpertConfig& global, int world_size, int rank);

// ---- configuration --------------------------------------------------------------------------------------------

/// How tokens move between ranks (the two modes of the file header).
enum class EpMode : uint8_t { all_gather, all_to_all };

std::string_view ep_mode_name(EpMode m);      // "all_gather", "all_to_all"
EpMode parse_ep_mode(std::string_view name);  // throws InvalidArgument listing the names

// ---- communicators (NCCL) -------------------------------------------------------------------------------------

/// Opaque NCCL communicator (an ncclComm_t).
using CommHandle = void*;

/// The bytes of an ncclUniqueId, to be passed from rank 0 to the other ranks (any transport).
struct CommUniqueId {
  std::array<char, 128> bytes{};
};

/// One rank's NCCL communicator: borrowed from the caller or created (and then destroyed) here. Move-only.
/// Every member that creates a communicator sets NCCL_NVLS_ENABLE=0 in the process environment first (NVLink
/// multicast stays off on the machines moekit targets). Without CUDA every factory throws NotSupported.
class Communicator {
 public:
  /// An empty communicator (valid() is false); the factories below create usable ones.
  Communicator();
  ~Communicator();
  Communicator(Communicator&&) noexcept;
  Communicator& operator=(Communicator&&) noexcept;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  /// Wraps a communicator the caller created and keeps alive (it is never destroyed here). Reads its size, rank
  /// and device from NCCL. Throws InvalidArgument for a null handle, CudaError when NCCL fails.
  static Communicator borrow(CommHandle comm);

  /// A new unique id (ncclGetUniqueId), to be shared with every rank before init_rank(). Throws CudaError.
  static CommUniqueId unique_id();

  /// Creates rank `rank` of a world of `world_size` on CUDA device `device` (ncclCommInitRank). Collective: every
  /// rank must call it concurrently (one thread or process each) with the same id. Blocks until all have joined.
  /// Throws InvalidArgument for a bad world size / rank or a device index that is not visible, CudaError when NCCL
  /// fails.
  static Communicator init_rank(const CommUniqueId& id, int world_size, int rank, int device);

  /// Creates the communicators of a single-process world on devices 0..world_size-1 (ncclCommInitAll); element r
  /// is rank r. Throws InvalidArgument when fewer devices are visible, CudaError when NCCL fails.
  static std::vector<Communicator> init_all(int world_size);

  /// Aborts a communicator this object created (init_rank / init_all) with ncclCommAbort: pending operations on
  /// every rank using it fail instead of hanging. Safe to call from another thread; the handle is not destroyed
  /// again afterwards. A borrowed communicator (borrow()) is left alone: its owner aborts it.
  void abort();

  /// The underlying ncclComm_t (as an opaque handle) for callers that issue their own NCCL calls.
  CommHandle handle() const;
  /// Ranks in the communicator, this rank's index in it, and the CUDA device it was created on.
  int world_size() const;
  int rank() const;
  int device() const;
  /// False when it holds no communicator (default-constructed or moved from); an aborted one stays valid.
  bool valid() const;

 private:
  struct State;
  void release() noexcept;  // destroys an owned, live communicator
  std::shared_ptr<State> state_;
};

/// Runs fn(rank, comm) on `world_size` threads, thread r bound to CUDA device r with rank r of a fresh world
/// (Communicator::init_all). Waits for every thread. If any throws, every communicator is aborted (so ranks
/// blocked in a collective fail rather than hang) and the first exception is rethrown. Throws InvalidArgument
/// when fewer than world_size devices are visible, NotSupported without CUDA.
void run_on_gpus(int world_size, const std::function<void(int rank, Communicator& comm)>& fn);

// ---- the expert-parallel layer (GPU) --------------------------------------------------------------------------

struct EpLayerArgs {
  ExpertConfig experts;     // the global layer: local_num_experts -1 (or this rank's partition), offset to match
  RoutingConfig routing;    // must agree with experts on E, K and S
  ExpertWeights weights;    // this rank's: w13 [L+S, 2I, H], w2 [L+S, H, I] bf16 on the communicator's device,
                            // L = expert_partition(E, W, r).count, local experts first, then the S shared ones
  TensorView routing_bias;  // optional [E] fp32/bf16 on the device (selection only; the same on every rank)
  EpMode mode = EpMode::all_gather;
  int64_t max_tokens = 0;  // largest T per rank of any forward()
  int block = 64;          // route-plan block size B
};

/// One rank's share of an expert-parallel MoE layer on sm90 GPUs (bf16 experts). Construction validates and
/// allocates everything; forward() only enqueues kernels and NCCL calls on the caller's stream. Every forward()
/// uses the same buffers: calls on different streams must be ordered by the caller (an event).
class EpLayer {
 public:
  /// Validates the configs (op "experts"/"route"/"ep"), that E, K, S agree, and the weights against this rank's
  /// partition; allocates routing plans, the experts' workspace and the exchange buffers for W * max_tokens rows.
  /// `comm` must outlive the layer. Throws InvalidArgument, NotSupported (no CUDA, no sm90 device), CudaError.
  EpLayer(const EpLayerArgs& args, const Communicator& comm);
  ~EpLayer();
  EpLayer(EpLayer&&) noexcept;
  EpLayer& operator=(EpLayer&&) noexcept;

  /// out [T, H] bf16 = the whole MoE layer (all W ranks' experts) applied to this rank's hidden [T, H] bf16
  /// routed by its logits [T, E] fp32/bf16 (unit stride in E); out may be hidden itself (in place), and must not
  /// overlap it otherwise. Collective: every rank calls it with the same T
  /// (<= max_tokens) and logits dtype, in the same order. No allocation, no host synchronization: capturable in a
  /// CUDA graph (per rank, after one eager call). Throws InvalidArgument for bad inputs, CudaError when a CUDA or
  /// NCCL call fails.
  void forward(const TensorView& hidden, const TensorView& logits, const TensorView& out, Stream stream = nullptr,
               ExpertTactic tactic = {});

  /// This rank's expert config (local range set).
  const ExpertConfig& local_config() const;
  /// The token exchange the layer was built with.
  EpMode mode() const;
  /// The most tokens per rank a forward() accepts.
  int64_t max_tokens() const;
  /// Device bytes owned by the layer (plans, exchange buffers, expert workspace).
  int64_t workspace_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ---- CPU simulation (always built; the oracle of the dispatch/combine bookkeeping) ----------------------------

/// One simulated rank: its weights (as EpLayerArgs::weights) and its tokens, all host tensors.
struct EpSimRank {
  ExpertWeights weights;  // [L_r + S, ...] bf16
  TensorView hidden;      // [T, H] bf16
  TensorView logits;      // [T, E] fp32/bf16
  TensorView out;         // [T, H] bf16 (written)
};

struct EpSimArgs {
  ExpertConfig experts;  // the global layer
  RoutingConfig routing;
  TensorView routing_bias;  // optional [E], host
  EpMode mode = EpMode::all_gather;
  int block = 64;   // route-plan block size B
  int threads = 1;  // for experts_reference
};

/// Runs both halves of the exchange of `mode` for W = ranks.size() in-process ranks on the CPU: routing
/// (route() on host plans), the same dispatch tables, scores and combine rules as the GPU kernels, the reference
/// experts with each rank's local range, and collectives simulated by copies (reduce-scatter sums in fp32 in rank
/// order, one rounding to bf16). Throws InvalidArgument when the ranks' token counts differ, a tensor is not on the
/// host, or as the configs' validation does.
void ep_simulate(const EpSimArgs& args, std::span<const EpSimRank> ranks);

// ---- benchmark (`moekit bench ep`) ----------------------------------------------------------------------------

struct EpBenchOptions {
  std::string preset;           // a name from presets()
  int gpus = 2;                 // W
  std::vector<int64_t> tokens;  // T per rank
  std::vector<EpMode> modes{EpMode::all_gather, EpMode::all_to_all};
  int iterations = 50;  // timed forward calls per measurement (median)
  int warmup = 5;
  int num_experts = 0;  // 0: the preset's E, reduced (keeping the routing groups valid) when the
                        // single-GPU baseline's weights do not fit in 80% of one device's memory
  uint64_t seed = 1;
};

struct EpBenchRow {
  EpMode mode = EpMode::all_gather;
  int64_t tokens = 0;                   // T per rank
  double single_us = 0;                 // median forward time of the whole layer on one GPU at T tokens
  double ep_us = 0;                     // median EP forward time (the slowest rank's median)
  double single_tokens_per_s = 0;       // T / single_us
  double ep_tokens_per_s_per_rank = 0;  // T / ep_us
  double verify_error = 0;              // max over ranks of the relative Frobenius error against the single-GPU layer
};

struct EpBenchReport {
  std::string preset, device;
  int gpus = 0;
  int num_experts = 0;   // E actually used
  bool reduced = false;  // E was reduced to fit
  std::vector<EpBenchRow> rows;
};

/// Builds the preset's layer with hash-generated weights (the same global tensors on one GPU and split over W),
/// verifies each mode against the single-GPU layer on device 0 (relative Frobenius error <= 1e-2, else Internal),
/// then times eager forward calls (CUDA events, median) on W threads. Allocates freely. Throws InvalidArgument
/// (unknown preset, bad tokens, iterations < 1, gpus outside 1..kMaxWorldSize), NotSupported (no CUDA, fewer than
/// `gpus` sm90 devices), CudaError, Internal.
EpBenchReport bench_ep(const EpBenchOptions& options);

}  // namespace moekit

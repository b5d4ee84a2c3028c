// The autotuner (DESIGN §6): picks a (GEMM1, GEMM2) tactic pair per token bucket, by timing only when asked.
// Staged search: rank GEMM1 tactics alone (with the default GEMM2), GEMM2 tactics alone (with the default GEMM1),
// keep the top 2 of each, then time the 2x2 pairs end to end in three rounds, each round bracketed by timings of the
// default pair: n1 + n2 + 16 timings instead of n1 * n2, and a pair replaces the default only where it is more than
// 1% faster than the default timed around it (bracketed_ratio(): medians over the rounds of drift-corrected ratios),
// and by more than the default's timings stray from a straight line (bracketing_spread()).
// Winners live in an in-memory cache and a persisted JSON cache (atomic write under a lock file, merged with what is
// on disk, invalidated by a metadata mismatch). Without an entry, the runner's deterministic default heuristic picks,
// for each T; so it does where the winner is the default pair at the T the bucket was timed at (the search confirmed
// the heuristic, whose thresholds need not fall on bucket edges).
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "moekit/tensor.h"

namespace moekit {

class Runner;      // moekit/layer.h
struct LayerSpec;  // moekit/layer.h

// ---- token buckets ------------------------------------------------------------------------------------------------

/// Largest token count the tuner buckets: 2^31 - 1.
inline constexpr int64_t kMaxTunedTokens = (int64_t{1} << 31) - 1;

/// The token bucket of `tokens`: the smallest bucket >= tokens, where the buckets are the powers of 2 up to 256
/// (1, 2, 4, ..., 256), the multiples of 256 up to 2048 (512, 768, ..., 2048), the multiples of 512 up to 4096
/// (2560, 3072, 3584, 4096), then the powers of 2 (8192, 16384, ...). So bucket(3) = 4, bucket(257) = 512,
/// bucket(2049) = 2560, bucket(4097) = 8192. Throws InvalidArgument (op "tuner") unless 1 <= tokens <=
/// kMaxTunedTokens.
int64_t token_bucket(int64_t tokens);

/// Every bucket from 1 up to and including token_bucket(max_tokens), ascending. Same errors as token_bucket().
std::vector<int64_t> token_buckets(int64_t max_tokens);

// ---- tactics
// --------------------------------------------------------------------------------------------------------

/// One runner-specific way to run a GEMM (tile shape, schedule, small-M variant, ...). Names are stable: the
/// persisted cache stores names, never indices.
struct Tactic {
  std::string name;         // e.g. "tile128x128_ws"
  std::string description;  // one line for `moekit tune --show` and logs
};

/// Indices into a runner's gemm1_tactics() and gemm2_tactics().
struct TacticPair {
  int gemm1 = 0;
  int gemm2 = 0;
  friend bool operator==(const TacticPair&, const TacticPair&) = default;
};

// ---- cache types --------------------------------------------------------------------------------------------------

/// The machine a cache was measured on. A persisted cache whose metadata differs from the tuner's in any field is
/// ignored on load and replaced on save.
struct CacheMetadata {
  std::string library_version;  // moekit::kVersion
  std::string device_name;      // e.g. "NVIDIA H200"; "cpu" without a GPU
  int sm_count = 0;             // SMs; hardware threads without a GPU
  int cuda_version = 0;         // CUDA runtime version, e.g. 12080; 0 without CUDA
  friend bool operator==(const CacheMetadata&, const CacheMetadata&) = default;

  /// This process's library version and this machine's first CUDA device (or the CPU when there is none).
  static CacheMetadata current();
  /// "" when equal, else the first differing field, e.g. "device_name ('NVIDIA H100' vs 'NVIDIA H200')".
  std::string mismatch(const CacheMetadata& other) const;

  /// "" when a cache file can hold this metadata, else the first broken rule: library_version and device_name must
  /// be valid UTF-8 (JSON text), e.g. "device_name must be valid UTF-8". Autotuner's constructor checks it.
  std::string problem() const;
};

/// What the tuner learned for one key: the winner, the staged shortlists (best first, at most 2 each) so a later
/// run can re-time just the shortlist pairs, and the measured times.
struct TuningEntry {
  std::string gemm1;  // winner tactic names
  std::string gemm2;
  std::vector<std::string> gemm1_shortlist;
  std::vector<std::string> gemm2_shortlist;
  double seconds = 0;          // the winner's end-to-end time (its median over the final stage's rounds)
  double default_seconds = 0;  // the default pair's (median of its final-stage timings at `tokens`), for comparison
  int64_t tokens = 0;          // token count that was timed (the bucket, capped at the runner's max_tokens)
  // What the timings routed: "synthetic" (the runner's own logits) or "given" (TuneOptions::logits). A cache file
  // written without the field reads as "synthetic".
  std::string routing = "synthetic";
  friend bool operator==(const TuningEntry&, const TuningEntry&) = default;

  /// "" when the entry can be cached and persisted, else the first broken rule, starting with the field's name,
  /// e.g. "seconds (0) must be finite and > 0". The rules: gemm1, gemm2 and every shortlist name are non-empty
  /// valid UTF-8; both shortlists are non-empty; seconds and default_seconds are finite and > 0; 1 <= tokens <=
  /// kMaxTunedTokens; routing is "synthetic" or "given". Autotuner::insert() and the cache file reader check it.
  std::string problem() const;
};

/// A persisted cache file's contents.
struct CacheFile {
  CacheMetadata metadata;
  std::map<std::string, TuningEntry> entries;  // by tuning_key()
};

/// The cache key of (runner, layer, tokens): a readable string of everything that changes which tactic is valid or
/// best: runner name and version, E, local E and offset, K, S, H, I, activation, gate/up layout, expert biases,
/// " weight_on_input=1" after them for ExpertConfig::routing_weight_on_input (absent otherwise, so that the keys of
/// other layers stay as they were), routing method and groups, weight/activation formats and block sizes, and
/// token_bucket(tokens), e.g.
///   "runner=reference@1 E=8 local=8@0 K=2 S=0 H=4096 I=14336 act=silu_gated gate_up=gate_first bias=0
///    routing=softmax_topk groups=1/1 w=bf16 a=bf16 blocks=128x128/128 T=64"   (one line)
/// Throws InvalidArgument for tokens outside [1, kMaxTunedTokens].
std::string tuning_key(const Runner& runner, const LayerSpec& spec, int64_t tokens);

// ---- tuning -------------------------------------------------------------------------------------------------------

/// What tune() does with keys that already have a cache entry.
enum class TuneMode : uint8_t {
  skip_cached,       // keys with a valid entry are not timed again (the default)
  retime_shortlist,  // keys with a valid entry re-time only their stored shortlist pairs and the default pair
  full,              // every key gets the full staged search
};

/// How tune() reports progress on its stream.
enum class ProgressStyle : uint8_t {
  none,    // silent
  detect,  // a bar when the stream is a terminal (isatty), plain lines otherwise
  bar,     // one line redrawn in place: a bar, configurations done/total, elapsed and ETA
  lines,   // one plain line per tuned bucket
};

struct TuneOptions {
  TuneMode mode = TuneMode::skip_cached;
  ProgressStyle progress = ProgressStyle::none;
  std::FILE* progress_stream = nullptr;  // nullptr = stderr
  // Optional routing logits to time on instead of the runner's synthetic ones, e.g. rows an engine captured from its
  // own router, so that the search sees that routing's skew: [N, E] fp32 or bf16, unit stride in E, N >= 1, on the
  // runner's device (Runner::set_timing_logits). Copied and validated only when tune() times something; the runner
  // is back on its synthetic logits when tune() returns or throws. Entries land under the same keys either way.
  TensorView logits;
};

// ---- comparing timings under drift
// ---------------------------------------------------------------------------------

/// Compares timings of a candidate with those of a reference taken around them, so that a drift of the machine's
/// speed during the measurement (clocks settling under a power cap, temperature) cancels where it is linear in time.
/// The timings alternate: reference[0], candidate[0], reference[1], candidate[1], ..., reference[R]; in round r the
/// candidate ran at `fraction` of the way from reference[r] to reference[r + 1] (1/2 for one candidate per round,
/// j / (m + 1) for the j-th of m). Returns the median over the rounds of candidate[r] / (reference[r] + fraction *
/// (reference[r + 1] - reference[r])): below 1 the candidate is faster. With an even number of rounds, the mean of
/// the middle two. Throws InvalidArgument unless candidate is non-empty, reference.size() == candidate.size() + 1,
/// every time is finite and positive, and 0 < fraction < 1.
double bracketed_ratio(std::span<const double> reference, std::span<const double> candidate, double fraction);

/// What bracketing cannot cancel: the largest relative distance of an inner reference timing from the straight line
/// between its two neighbours, max over 0 < i < n - 1 of |reference[i] - m_i| / m_i with m_i = (reference[i - 1] +
/// reference[i + 1]) / 2; 0 with fewer than three timings. A linear drift gives 0; a reference that jumps by x% and
/// back gives x%, and so would a candidate's bracketed_ratio() that compares with it, however fast the candidate is.
/// Throws InvalidArgument unless every time is finite and positive.
double bracketing_spread(std::span<const double> reference);

/// The least gain that lets a pair replace the default pair (Autotuner::tune()): its drift-corrected ratio to the
/// default must be below 1 - max(kMinTunedGain, bracketing_spread(default timings)).
inline constexpr double kMinTunedGain = 0.01;

/// One pair of the final stage and its timings (TuneResult::final_stage).
struct FinalStageTiming {
  TacticPair tactics;
  std::vector<double> seconds;  // one timing per round, in order
  double ratio = 0;             // bracketed_ratio() against the default pair timed around it: < 1 is faster
};

/// The outcome for one requested token count.
struct TuneResult {
  int64_t tokens = 0;  // as requested
  int64_t bucket = 0;  // token_bucket(tokens)
  std::string key;
  TacticPair best;
  TuningEntry entry;
  int timed_configs = 0;    // end-to-end timings this call made for this bucket
  bool from_cache = false;  // skip_cached found a valid entry and timed nothing
  // The final stage's timings, where this call ran one with more than one candidate: the default pair's (one
  // before each round and one after the last) and every other pair's, in the order they were timed.
  std::vector<double> default_timings;
  std::vector<FinalStageTiming> final_stage;
  // bracketing_spread(default_timings), and the ratio a pair had to stay below to replace the default:
  // 1 - max(kMinTunedGain, spread) (0 and 0 without a final stage).
  double default_spread = 0;
  double threshold = 0;
};

/// The tactic pair forward() runs and where it came from.
struct TacticChoice {
  TacticPair tactics;
  bool tuned = false;  // a valid cache entry (else the runner's default heuristic)
  // The pair is runner.default_tactics(tokens), which may differ between token counts of one bucket: there is no
  // entry, or the entry's winner is the default at the token count it was timed at (the tuner confirmed the
  // heuristic there, so the heuristic's own thresholds, which need not fall on bucket edges, stay in force).
  bool per_token = true;
};

/// The tuner and its cache. Thread-safe: every member locks an internal mutex (timing runs outside it, so two
/// threads tuning the same key may both time it; the later result wins).
class Autotuner {
 public:
  /// A tuner whose cache belongs to the machine described by `metadata`. Throws InvalidArgument (op "tuner") where
  /// metadata.problem() names a broken rule.
  explicit Autotuner(CacheMetadata metadata = CacheMetadata::current());

  /// The process-wide tuner MoELayer uses unless given another. Created on first use.
  static Autotuner& global();

  /// The machine this tuner's entries are measured on (CacheMetadata::current() unless given).
  const CacheMetadata& metadata() const { return metadata_; }

  /// The pair to run for `tokens` on this layer: the cached winner of its bucket when the entry's tactic names all
  /// exist in the runner's lists, unless that winner is runner.default_tactics(entry.tokens), the heuristic's own
  /// pick where the bucket was timed; then, and without a usable entry, runner.default_tactics(tokens). Never times,
  /// never allocates device memory.
  /// Preconditions: the runner passed check_support(spec). Throws InvalidArgument for tokens out of range.
  TacticChoice choose(const Runner& runner, const LayerSpec& spec, int64_t tokens) const;

  /// Tunes the buckets of `tokens` (duplicates of a bucket are tuned once) with the staged search and stores the
  /// winners in memory (persist them with save()). Calling this is the explicit request to tune. For each bucket it
  /// times at min(bucket, runner.max_tokens()) tokens through runner.time_schedule(), one schedule per stage (the
  /// first stage's timings in one, the final stage's in another, in the order below). With n1 GEMM1 and n2 GEMM2
  /// tactics (n1, n2 >= 2) it makes n1 + n2 timings in the two stages, then the final stage: 3 rounds, each the
  /// default pair once and then each shortlist pair other than the default once, and the default once more after
  /// the last round: n1 + n2 + 16 timings, or n1 + n2 + 13 where the default is a shortlist pair. A stage with a
  /// single tactic has nothing to rank and is skipped, and the shortlist pairs are min(2, n1) * min(2, n2); a single
  /// final candidate (n1 = n2 = 1) is timed once. Each pair is judged by bracketed_ratio() against the default
  /// timings around its rounds, which cancels a linear drift of the GPU's speed during the stage; the pair with the
  /// smallest ratio (the earlier one on ties) replaces the default only where that ratio is below 1 -
  /// max(kMinTunedGain, bracketing_spread(default timings)) and its median time is below the default's too: a gain
  /// must exceed 1% and the default's own departure from a straight line during the stage, which a drift-corrected
  /// ratio cannot tell from a gain, and one slow timing of the default, which enters two rounds' ratios, cannot make
  /// an equal pair win. The entry records both medians. The timings run on the runner's own synthetic inputs
  /// (Runner::time_schedule()) unless options.logits names the routing to time on; cuda_bf16's synthetic logits are
  /// uniform random, so its routing is near-uniform, and a pair that wins there can lose under skewed routing
  /// (mixtral-8x7b at T = 1024: swapped 96x256 tiles 6.6% faster with uniform routing, 3.7% slower with the hottest
  /// expert at 1.4x the mean rows; docs/benchmarks.md, "Thirty-third session"). Throws InvalidArgument when something
  /// must be timed and the runner is not built or options.logits is invalid, or for token counts out of range, and
  /// what the runner throws.
  std::vector<TuneResult> tune(Runner& runner, const LayerSpec& spec, std::span<const int64_t> tokens,
                               const TuneOptions& options = {});

  /// The in-memory entry of `key`, if any.
  std::optional<TuningEntry> find(const std::string& key) const;
  /// Stores an entry (replacing any), marks it as learned in this process, so save() prefers it over the disk's.
  /// Throws InvalidArgument (op "tuner") for an empty key or one that is not valid UTF-8, and for an entry that
  /// breaks a rule of TuningEntry::problem(), e.g. "entry 'k'.tokens (0) must be in [1, 2147483647]".
  void insert(const std::string& key, const TuningEntry& entry);
  /// A copy of every in-memory entry.
  std::map<std::string, TuningEntry> entries() const;
  /// The number of in-memory entries; clear() drops them all and bumps generation() (no file is touched).
  size_t size() const;
  void clear();
  /// Increases whenever the in-memory cache changes; lets layers drop memoized choices cheaply.
  uint64_t generation() const;

  struct LoadReport {
    size_t loaded = 0;     // entries taken into memory
    size_t ignored = 0;    // entries skipped because of a metadata mismatch
    std::string mismatch;  // CacheMetadata::mismatch(), "" when the metadata matched
    bool file_exists = false;
  };
  /// Merges the entries of the cache file at `path` into memory (entries learned in this process win). A missing
  /// file loads nothing. Throws InvalidArgument naming the path and the problem when the file cannot be read, is not
  /// JSON, or does not have the cache's structure: the fields save() writes with their JSON types, sm_count and
  /// cuda_version within int, every entry's key non-empty and every entry within TuningEntry::problem()'s rules (a
  /// missing "routing" reads as "synthetic"). Unknown fields are ignored.
  LoadReport load(const std::filesystem::path& path);

  struct SaveReport {
    size_t written = 0;         // entries in the file afterwards
    size_t kept_from_disk = 0;  // entries the file had that this process did not learn
    size_t dropped = 0;         // disk entries dropped because the file's metadata did not match
  };
  /// Writes the cache to `path`: under an exclusive flock on "<path>.lock", reads the file again, merges (entries
  /// learned in this process win, other valid disk entries are kept and also loaded into memory), writes a temporary
  /// file in the same folder and renames it over `path`. Creates missing parent folders. A file that exists but is
  /// not a valid cache is never overwritten: InvalidArgument naming the path and the problem. Safe when several
  /// processes save to the same path at once.
  SaveReport save(const std::filesystem::path& path);

  /// Parses and checks a cache file without touching any tuner (used by `moekit tune --show`). Throws
  /// InvalidArgument as load() does, and when the file does not exist.
  static CacheFile read_file(const std::filesystem::path& path);

 private:
  struct Slot {
    TuningEntry entry;
    bool learned = false;  // tuned or inserted in this process (wins over disk at save time)
  };
  CacheMetadata metadata_;
  mutable std::mutex mutex_;
  std::map<std::string, Slot> cache_;
  uint64_t generation_ = 0;
};

/// Enables tuning in MoELayer::forward() on this thread for its lifetime: a forward() whose token bucket has no
/// valid cache entry first tunes that bucket (with `options`) on the layer's tuner, timing on options.logits or,
/// where that is absent, on the forward() call's own logits (so a warm-up pass tunes on the engine's routing). Scopes
/// nest; the innermost one applies. Outside every scope forward() never times anything. Inside a CUDA-graph capture
/// a forward() that would tune throws instead (InvalidArgument): warm every bucket up eagerly in the scope first.
class TuningScope {
 public:
  explicit TuningScope(const TuneOptions& options = {});
  ~TuningScope();
  TuningScope(const TuningScope&) = delete;
  TuningScope& operator=(const TuningScope&) = delete;

  /// The options of the innermost active scope on this thread, or nullptr when none is active.
  static const TuneOptions* active();

 private:
  TuneOptions options_;
  const TuneOptions* previous_;
};

}  // namespace moekit

// The autotuner's search and in-memory cache. Staged search per token bucket: time every GEMM1 tactic with the
// default GEMM2, every GEMM2 tactic with the default GEMM1, keep the 2 fastest of each, then time the (at most) 4
// pairs in rounds bracketed by timings of the default pair and keep the one with the smallest drift-corrected ratio
// to the default (ties: the earlier candidate, so results are deterministic for equal costs), unless it beats the
// default by less than kMinTunedGain or than the default's own spread (bracketing_spread()). A stage with a single
// tactic has nothing to rank and is skipped. Each stage's timings are one Runner::time_schedule() call, which a
// runner may time back to back. Persistence lives in tuning_cache.cpp.
#include "moekit/tuner.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <thread>

#include "moekit/device.h"
#include "moekit/error.h"
#include "moekit/layer.h"
#include "moekit/version.h"
#include "runtime/progress.h"

namespace moekit {
namespace {

std::optional<int> find_tactic(std::span<const Tactic> tactics, const std::string& name) {
  for (size_t i = 0; i < tactics.size(); ++i)
    if (tactics[i].name == name) return static_cast<int>(i);
  return std::nullopt;
}

// Indices of names that all exist, or nullopt when any is missing (or the list is empty).
std::optional<std::vector<int>> find_tactics(std::span<const Tactic> tactics, const std::vector<std::string>& names) {
  std::vector<int> ids;
  for (const std::string& n : names) {
    std::optional<int> id = find_tactic(tactics, n);
    if (!id) return std::nullopt;
    ids.push_back(*id);
  }
  if (ids.empty()) return std::nullopt;
  return ids;
}

// The (at most) two fastest indices, fastest first; equal times keep the lower index.
std::vector<int> fastest_two(const std::vector<double>& times) {
  std::vector<int> order(times.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return times[a] < times[b]; });
  order.resize(std::min<size_t>(order.size(), 2));
  return order;
}

std::vector<std::string> names_of(std::span<const Tactic> tactics, const std::vector<int>& ids) {
  std::vector<std::string> names;
  for (int id : ids) names.push_back(tactics[id].name);
  return names;
}

// A cached entry usable with this runner: its winner and shortlists name tactics the runner still has.
struct Resolved {
  TacticPair best;
  std::vector<int> shortlist1, shortlist2;
};

std::optional<Resolved> resolve(const Runner& runner, const TuningEntry& e) {
  std::optional<int> g1 = find_tactic(runner.gemm1_tactics(), e.gemm1);
  std::optional<int> g2 = find_tactic(runner.gemm2_tactics(), e.gemm2);
  std::optional<std::vector<int>> s1 = find_tactics(runner.gemm1_tactics(), e.gemm1_shortlist);
  std::optional<std::vector<int>> s2 = find_tactics(runner.gemm2_tactics(), e.gemm2_shortlist);
  if (!g1 || !g2 || !s1 || !s2) return std::nullopt;
  return Resolved{{*g1, *g2}, *s1, *s2};
}

// The final stage times its pairs in kFinalRounds rounds, each opened by a timing of the default pair, and the
// default once more after the last round; each pair is judged by its bracketed_ratio() to the default timed around
// it, so that a clock or temperature drift during the stage cancels where it is linear. (Before, the default was
// timed last in each round, after the same pairs in the same order: on an H200, `bench moe --tuned` timed one pair
// 3.2% apart from itself in alternating replays, and once took a pair that its comparison then found 4.9% slower
// than the default.) A pair other than the default must beat it by more than kMinTunedGain, and by more than the
// default's timings stray from a straight line (bracketing_spread(): a jump of the GPU's speed that bracketing
// cannot cancel): a tuned entry should be a measured gain, not a draw inside the spread of repeated timings. (On an
// H200, deepseek-v3 at T = 4096, default timings of 6658 / 6697 / 6566 / 7070 us, a spread of 4.6%, let a pair read
// 0.980 that `bench moe --tuned` then timed at 1.001 of the default; docs/benchmarks.md, "Fortieth session".)
constexpr int kFinalRounds = 3;

// The shortlist pairs but the default, in order.
std::vector<TacticPair> final_pairs(const std::vector<int>& s1, const std::vector<int>& s2, TacticPair def) {
  std::vector<TacticPair> c;
  for (int a : s1)
    for (int b : s2)
      if (TacticPair{a, b} != def) c.push_back({a, b});
  return c;
}

// Timings of a final stage with `pairs` pairs beside the default: the default alone has nothing to be compared with
// and is timed once.
int final_timings(size_t pairs) {
  return pairs == 0 ? 1 : kFinalRounds * static_cast<int>(pairs + 1) + 1;
}

// At most: the default may be on the shortlist (TuneProgress::drop_planned() takes back what was not timed).
int staged_timings(int n1, int n2) {
  return (n1 > 1 ? n1 : 0) + (n2 > 1 ? n2 : 0) + final_timings(std::min(n1, 2) * std::min(n2, 2));
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

thread_local const TuneOptions* g_active_scope = nullptr;

void check_timings(const char* op, std::span<const double> v, const char* what) {
  for (size_t i = 0; i < v.size(); ++i)
    if (!(std::isfinite(v[i]) && v[i] > 0.0))
      throw InvalidArgument("tuner", fmt::format("{}: {}[{}] ({}) must be finite and positive", op, what, i, v[i]));
}

}  // namespace

double bracketed_ratio(std::span<const double> reference, std::span<const double> candidate, double fraction) {
  if (candidate.empty()) throw InvalidArgument("tuner", "bracketed_ratio: candidate has no timings");
  if (reference.size() != candidate.size() + 1)
    throw InvalidArgument("tuner", fmt::format("bracketed_ratio: reference has {} timings, must have candidate's "
                                               "{} + 1 (one before each round and one after the last)",
                                               reference.size(), candidate.size()));
  if (!(fraction > 0.0 && fraction < 1.0))
    throw InvalidArgument("tuner", fmt::format("bracketed_ratio: fraction ({}) must be in (0, 1)", fraction));
  check_timings("bracketed_ratio", reference, "reference");
  check_timings("bracketed_ratio", candidate, "candidate");
  std::vector<double> ratios;
  for (size_t r = 0; r < candidate.size(); ++r)
    ratios.push_back(candidate[r] / (reference[r] + fraction * (reference[r + 1] - reference[r])));
  return median_of(std::move(ratios));
}

double bracketing_spread(std::span<const double> reference) {
  check_timings("bracketing_spread", reference, "reference");
  double spread = 0.0;
  for (size_t i = 1; i + 1 < reference.size(); ++i) {
    const double line = 0.5 * (reference[i - 1] + reference[i + 1]);
    spread = std::max(spread, std::abs(reference[i] - line) / line);
  }
  return spread;
}

CacheMetadata CacheMetadata::current() {
  CacheMetadata m;
  m.library_version = std::string(kVersion);
  if (cuda_device_count() > 0) {
    const DeviceInfo d = device_info(0);
    m.device_name = d.name;
    m.sm_count = d.sm_count;
    m.cuda_version = d.cuda_runtime_version;
  } else {
    m.device_name = "cpu";
    m.sm_count = static_cast<int>(std::thread::hardware_concurrency());
    m.cuda_version = 0;
  }
  return m;
}

std::string CacheMetadata::mismatch(const CacheMetadata& other) const {
  if (library_version != other.library_version)
    return fmt::format("library_version ('{}' vs '{}')", library_version, other.library_version);
  if (device_name != other.device_name)
    return fmt::format("device_name ('{}' vs '{}')", device_name, other.device_name);
  if (sm_count != other.sm_count) return fmt::format("sm_count ({} vs {})", sm_count, other.sm_count);
  if (cuda_version != other.cuda_version)
    return fmt::format("cuda_version ({} vs {})", cuda_version, other.cuda_version);
  return {};
}

Autotuner::Autotuner(CacheMetadata metadata) : metadata_(std::move(metadata)) {
  if (std::string why = metadata_.problem(); !why.empty()) throw InvalidArgument("tuner", "metadata." + why);
}

Autotuner& Autotuner::global() {
  static Autotuner tuner;
  return tuner;
}

TacticChoice Autotuner::choose(const Runner& runner, const LayerSpec& spec, int64_t tokens) const {
  const std::string key = tuning_key(runner, spec, tokens);
  {
    std::lock_guard lock(mutex_);
    auto it = cache_.find(key);
    if (it != cache_.end())
      if (std::optional<Resolved> r = resolve(runner, it->second.entry)) {
        // Every entry in the cache passed TuningEntry::problem() (insert(), load()): its tokens are in range.
        const bool confirmed = r->best == runner.default_tactics(it->second.entry.tokens);
        return {confirmed ? runner.default_tactics(tokens) : r->best, true, confirmed};
      }
  }
  return {runner.default_tactics(tokens), false, true};
}

std::vector<TuneResult> Autotuner::tune(Runner& runner, const LayerSpec& spec, std::span<const int64_t> tokens,
                                        const TuneOptions& options) {
  const std::span<const Tactic> tactics1 = runner.gemm1_tactics(), tactics2 = runner.gemm2_tactics();
  const int n1 = static_cast<int>(tactics1.size()), n2 = static_cast<int>(tactics2.size());

  // Plan: one job per distinct bucket, in request order, with what the cache already knows.
  struct Job {
    TuneResult result;
    std::optional<Resolved> cached;
    int planned = 0;
  };
  std::vector<Job> jobs;
  int64_t total = 0;
  for (int64_t t : tokens) {
    const int64_t bucket = token_bucket(t);
    if (std::any_of(jobs.begin(), jobs.end(), [&](const Job& j) { return j.result.bucket == bucket; })) continue;
    Job job;
    job.result.tokens = t;
    job.result.bucket = bucket;
    job.result.key = tuning_key(runner, spec, t);
    if (options.mode != TuneMode::full)
      if (std::optional<TuningEntry> e = find(job.result.key)) {
        job.cached = resolve(runner, *e);
        if (job.cached) job.result.entry = *e;
      }
    if (!job.cached)
      job.planned = staged_timings(n1, n2);
    else if (options.mode == TuneMode::retime_shortlist)
      job.planned = final_timings(job.cached->shortlist1.size() * job.cached->shortlist2.size());
    total += job.planned;
    jobs.push_back(std::move(job));
  }

  // Only timing needs a built runner: a request the cache answers entirely works on a checked one.
  if (total > 0 && !runner.built())
    throw InvalidArgument("tuner", fmt::format("runner '{}': tune() called before build()", runner.name()));
  // Time on the caller's routing where given; the runner goes back to its synthetic logits afterwards (on a throw
  // too, where a second error would hide the first, so the guard's own is dropped).
  struct SyntheticLogitsAgain {
    Runner* runner = nullptr;
    ~SyntheticLogitsAgain() {
      if (runner == nullptr) return;
      try {
        runner->set_timing_logits({});
      } catch (...) {
      }
    }
  } restore;
  if (total > 0 && options.logits.present()) {
    runner.set_timing_logits(options.logits);
    restore.runner = &runner;
  }
  const char* const routing = options.logits.present() ? "given" : "synthetic";
  detail::TuneProgress progress(options.progress, options.progress_stream, fmt::format("tune {}", runner.name()),
                                total);
  std::vector<TuneResult> results;
  for (Job& job : jobs) {
    TuneResult& r = job.result;
    const int64_t at = std::min(r.bucket, runner.max_tokens());
    // A stage's timings, in order, as one schedule (Runner::time_schedule(): back to back where the runner can).
    auto time = [&](const std::vector<TacticPair>& order) {
      return runner.time_schedule(order, at, [&] {
        ++r.timed_configs;
        progress.timed(r.bucket);
      });
    };
    // The final stage (see kFinalRounds and kMinTunedGain): stores the winner in r.best, the medians of its timings
    // and the default's in e, and every timing in r.
    auto final_stage = [&](const std::vector<int>& s1, const std::vector<int>& s2, TacticPair def, TuningEntry& e) {
      const std::vector<TacticPair> pairs = final_pairs(s1, s2, def);
      const int rounds = pairs.empty() ? 0 : kFinalRounds;
      std::vector<TacticPair> order = {def};
      for (int round = 0; round < rounds; ++round) {
        order.insert(order.end(), pairs.begin(), pairs.end());
        order.push_back(def);
      }
      const std::vector<double> timings = time(order);
      r.default_timings = {timings[0]};
      r.final_stage.clear();
      for (TacticPair p : pairs) r.final_stage.push_back({p, {}, 0.0});
      for (int round = 0, at_timing = 1; round < rounds; ++round) {
        for (FinalStageTiming& f : r.final_stage) f.seconds.push_back(timings[at_timing++]);
        r.default_timings.push_back(timings[at_timing++]);
      }
      r.best = def;
      e.default_seconds = median_of(r.default_timings);
      e.seconds = e.default_seconds;
      if (!pairs.empty()) {
        r.default_spread = bracketing_spread(r.default_timings);
        r.threshold = 1.0 - std::max(kMinTunedGain, r.default_spread);
      }
      double best_ratio = r.threshold;
      for (size_t j = 0; j < r.final_stage.size(); ++j) {
        FinalStageTiming& f = r.final_stage[j];
        f.ratio = bracketed_ratio(r.default_timings, f.seconds, double(j + 1) / double(pairs.size() + 1));
        const double median = median_of(f.seconds);
        if (f.ratio < best_ratio && median < e.default_seconds) {
          best_ratio = f.ratio;
          r.best = f.tactics;
          e.seconds = median;
        }
      }
      if (pairs.empty()) r.default_timings.clear();  // one timing, nothing compared
      progress.drop_planned(job.planned - r.timed_configs);
    };

    if (job.cached && options.mode == TuneMode::skip_cached) {
      r.best = job.cached->best;
      r.from_cache = true;
    } else if (job.cached) {  // retime_shortlist: the stored shortlist, rebuilt from names
      TuningEntry& e = r.entry;
      final_stage(job.cached->shortlist1, job.cached->shortlist2, runner.default_tactics(at), e);
      e.gemm1 = tactics1[r.best.gemm1].name;
      e.gemm2 = tactics2[r.best.gemm2].name;
      e.tokens = at;
      e.routing = routing;
      insert(r.key, e);
    } else {
      const TacticPair def = runner.default_tactics(at);
      // The first stage: each GEMM's tactics against the other's default, GEMM1's then GEMM2's, in one schedule.
      std::vector<TacticPair> order;
      if (n1 > 1)
        for (int i = 0; i < n1; ++i) order.push_back({i, def.gemm2});
      if (n2 > 1)
        for (int j = 0; j < n2; ++j) order.push_back({def.gemm1, j});
      const std::vector<double> first = time(order);
      std::vector<double> t1(n1, 0.0), t2(n2, 0.0);
      if (n1 > 1) std::copy_n(first.begin(), n1, t1.begin());
      if (n2 > 1) std::copy_n(first.end() - n2, n2, t2.begin());
      const std::vector<int> s1 = fastest_two(t1), s2 = fastest_two(t2);
      TuningEntry& e = r.entry;
      e = TuningEntry{};
      final_stage(s1, s2, def, e);
      e.gemm1 = tactics1[r.best.gemm1].name;
      e.gemm2 = tactics2[r.best.gemm2].name;
      e.gemm1_shortlist = names_of(tactics1, s1);
      e.gemm2_shortlist = names_of(tactics2, s2);
      e.tokens = at;
      e.routing = routing;
      insert(r.key, e);
    }
    progress.bucket_done(r, tactics1[r.best.gemm1].name, tactics2[r.best.gemm2].name);
    results.push_back(r);
  }
  progress.finish();
  if (restore.runner != nullptr) {
    restore.runner = nullptr;
    runner.set_timing_logits({});
  }
  return results;
}

std::optional<TuningEntry> Autotuner::find(const std::string& key) const {
  std::lock_guard lock(mutex_);
  auto it = cache_.find(key);
  if (it == cache_.end()) return std::nullopt;
  return it->second.entry;
}

std::map<std::string, TuningEntry> Autotuner::entries() const {
  std::lock_guard lock(mutex_);
  std::map<std::string, TuningEntry> out;
  for (const auto& [k, slot] : cache_) out.emplace(k, slot.entry);
  return out;
}

size_t Autotuner::size() const {
  std::lock_guard lock(mutex_);
  return cache_.size();
}

void Autotuner::clear() {
  std::lock_guard lock(mutex_);
  cache_.clear();
  ++generation_;
}

uint64_t Autotuner::generation() const {
  std::lock_guard lock(mutex_);
  return generation_;
}

TuningScope::TuningScope(const TuneOptions& options) : options_(options), previous_(g_active_scope) {
  g_active_scope = &options_;
}

TuningScope::~TuningScope() {
  g_active_scope = previous_;
}

const TuneOptions* TuningScope::active() {
  return g_active_scope;
}

}  // namespace moekit

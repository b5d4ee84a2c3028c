// The autotuner's search and in-memory cache. Staged search per token bucket: time every GEMM1 tactic with the
// default GEMM2, every GEMM2 tactic with the default GEMM1, keep the 2 fastest of each, then time the (at most) 4
// pairs and the default pair end to end in alternating rounds and keep the fastest by its median over the rounds
// (ties: the earlier candidate, so results are deterministic for equal costs), unless it beats the default by less
// than kMinGain. A stage with a single tactic has nothing to rank and is skipped. Persistence lives in
// tuning_cache.cpp.
#include "moekit/tuner.h"

#include <fmt/format.h>

#include <algorithm>
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

// The final stage times its candidates in kFinalRounds rounds, each candidate once per round in turn, so that a
// clock or temperature drift during the search falls on all of them alike, and ranks them by their medians. A pair
// other than the default must beat the default's median by more than kMinGain: a tuned entry should be a measured
// gain, not a draw inside the spread of repeated timings. (Before, the default's time came from stage 1 and the
// pairs' from later timings. On an H200, `bench moe --tuned` replayed one pair at two moments of a run 0.96-1.01x
// apart, and tuned choices other than the default at 0.95-1.01x the default's time.)
constexpr int kFinalRounds = 3;
constexpr double kMinGain = 0.01;

// Final-stage candidates: the shortlist pairs, then the default unless it is one of them.
std::vector<TacticPair> final_candidates(const std::vector<int>& s1, const std::vector<int>& s2, TacticPair def) {
  std::vector<TacticPair> c;
  for (int a : s1)
    for (int b : s2) c.push_back({a, b});
  if (std::find(c.begin(), c.end(), def) == c.end()) c.push_back(def);
  return c;
}

// One candidate (the default alone) has nothing to be compared with: one timing.
int final_rounds(size_t candidates) {
  return candidates > 1 ? kFinalRounds : 1;
}

int final_timings(size_t candidates) {
  return static_cast<int>(candidates) * final_rounds(candidates);
}

// At most: the default may be on the shortlist (TuneProgress::drop_planned() takes back what was not timed).
int staged_timings(int n1, int n2) {
  return (n1 > 1 ? n1 : 0) + (n2 > 1 ? n2 : 0) + final_timings(std::min(n1, 2) * std::min(n2, 2) + 1);
}

thread_local const TuneOptions* g_active_scope = nullptr;

}  // namespace

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

Autotuner::Autotuner(CacheMetadata metadata) : metadata_(std::move(metadata)) {}

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
        const int64_t timed = it->second.entry.tokens;
        const bool confirmed = timed >= 1 && timed <= kMaxTunedTokens && r->best == runner.default_tactics(timed);
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
      job.planned = final_timings(job.cached->shortlist1.size() * job.cached->shortlist2.size() + 1);
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
    auto time = [&](TacticPair p) {
      const double s = runner.time_tactics(p, at);
      ++r.timed_configs;
      progress.timed(r.bucket);
      return s;
    };
    // The final stage: the shortlist pairs and the default in alternating rounds; stores the winner in r.best and
    // its median and the default's in e (see kFinalRounds and kMinGain).
    auto final_stage = [&](const std::vector<int>& s1, const std::vector<int>& s2, TacticPair def, TuningEntry& e) {
      const std::vector<TacticPair> candidates = final_candidates(s1, s2, def);
      std::vector<std::vector<double>> times(candidates.size());
      for (int round = 0; round < final_rounds(candidates.size()); ++round)
        for (size_t c = 0; c < candidates.size(); ++c) times[c].push_back(time(candidates[c]));
      std::vector<double> medians;
      for (std::vector<double>& t : times) {
        std::sort(t.begin(), t.end());
        medians.push_back(t[t.size() / 2]);
      }
      size_t best = 0;
      for (size_t c = 1; c < candidates.size(); ++c)
        if (medians[c] < medians[best]) best = c;
      const size_t d = static_cast<size_t>(std::find(candidates.begin(), candidates.end(), def) - candidates.begin());
      if (medians[best] >= (1.0 - kMinGain) * medians[d]) best = d;
      r.best = candidates[best];
      e.seconds = medians[best];
      e.default_seconds = medians[d];
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
      std::vector<double> t1(n1, 0.0), t2(n2, 0.0);
      if (n1 > 1)
        for (int i = 0; i < n1; ++i) t1[i] = time({i, def.gemm2});
      if (n2 > 1)
        for (int j = 0; j < n2; ++j) t2[j] = time({def.gemm1, j});
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

void Autotuner::insert(const std::string& key, const TuningEntry& entry) {
  std::lock_guard lock(mutex_);
  cache_[key] = Slot{entry, true};
  ++generation_;
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

// Progress of a tuning run (internal): a bar redrawn in place with the configurations timed so far and an ETA when
// the stream is a terminal, one plain line per tuned bucket otherwise (logs, CI). The ETA assumes the remaining
// configurations cost what the finished ones cost on average.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>

#include "moekit/tuner.h"

namespace moekit::detail {

/// "850 ns", "12.3 us", "4.56 ms", "1.23 s": a duration in seconds in the most readable unit.
std::string format_seconds(double seconds);

class TuneProgress {
 public:
  using Clock = std::function<double()>;  // seconds since any fixed origin

  /// `style` detect resolves to bar when `stream` (nullptr = stderr) is a terminal, else lines. `total` is the
  /// number of timings the run plans (an upper bound: see drop_planned()). `clock` defaults to a steady clock (tests
  /// inject one).
  TuneProgress(ProgressStyle style, std::FILE* stream, std::string label, int64_t total, Clock clock = {});

  /// One timing finished while tuning `bucket`.
  void timed(int64_t bucket);
  /// `n` planned timings will not be made (a bucket needed fewer than its plan's upper bound).
  void drop_planned(int64_t n) { total_ -= n; }
  /// A bucket finished (tuned or taken from the cache).
  void bucket_done(const TuneResult& result, const std::string& gemm1, const std::string& gemm2);
  /// Ends the bar's line. Called by the destructor too.
  void finish();
  ~TuneProgress();

  ProgressStyle style() const { return style_; }
  /// "ETA 7.00 s" from the average cost so far; "ETA ?" before the first timing, "done" after the last.
  std::string eta() const;

 private:
  void draw_bar(int64_t bucket);

  ProgressStyle style_;
  std::FILE* stream_;
  std::string label_;
  int64_t total_;
  int64_t done_ = 0;
  Clock clock_;
  double start_;
  bool open_line_ = false;
};

}  // namespace moekit::detail

// Tuning progress output: a terminal bar with ETA, or plain lines (see progress.h).
#include "runtime/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

namespace moekit::detail {

std::string format_seconds(double s) {
  if (s < 1e-6) return fmt::format("{:.0f} ns", s * 1e9);
  if (s < 1e-3) return fmt::format("{:.1f} us", s * 1e6);
  if (s < 1.0) return fmt::format("{:.2f} ms", s * 1e3);
  return fmt::format("{:.2f} s", s);
}

TuneProgress::TuneProgress(ProgressStyle style, std::FILE* stream, std::string label, int64_t total, Clock clock)
    : style_(style),
      stream_(stream ? stream : stderr),
      label_(std::move(label)),
      total_(total),
      clock_(clock ? std::move(clock) : Clock([] {
        return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
      })),
      start_(clock_()) {
  if (style_ == ProgressStyle::detect) style_ = isatty(fileno(stream_)) ? ProgressStyle::bar : ProgressStyle::lines;
}

TuneProgress::~TuneProgress() {
  finish();
}

std::string TuneProgress::eta() const {
  if (done_ == 0) return "ETA ?";
  if (done_ >= total_) return "done";
  const double per_config = (clock_() - start_) / static_cast<double>(done_);
  return "ETA " + format_seconds(per_config * static_cast<double>(std::max<int64_t>(total_ - done_, 0)));
}

void TuneProgress::draw_bar(int64_t bucket) {
  constexpr int kWidth = 30;
  const int filled = total_ > 0 ? static_cast<int>(kWidth * std::min(done_, total_) / total_) : kWidth;
  const std::string bar = std::string(filled, '#') + std::string(kWidth - filled, '-');
  const std::string line = fmt::format("{} [{}] {}/{} timings  T={}  {} elapsed  {}", label_, bar, done_, total_,
                                       bucket, format_seconds(clock_() - start_), eta());
  // \r and trailing blanks: redraw in place over a possibly longer previous line.
  std::fprintf(stream_, "\r%-100s", line.c_str());
  std::fflush(stream_);
  open_line_ = true;
}

void TuneProgress::timed(int64_t bucket) {
  ++done_;
  if (style_ == ProgressStyle::bar) draw_bar(bucket);
}

void TuneProgress::bucket_done(const TuneResult& r, const std::string& gemm1, const std::string& gemm2) {
  if (style_ != ProgressStyle::lines) return;
  std::string line =
      fmt::format("{}: T={} (bucket {}): gemm1={} gemm2={} {} (default {}), ", label_, r.tokens, r.bucket, gemm1,
                  gemm2, format_seconds(r.entry.seconds), format_seconds(r.entry.default_seconds));
  if (r.from_cache) {
    line += "cached";
  } else {
    // Where the default's timings strayed by more than kMinTunedGain, the raised bar a pair had to clear.
    if (r.default_spread > kMinTunedGain)
      line += fmt::format("default spread {:.1f}%, bound {:.3f}; ", 100.0 * r.default_spread, r.threshold);
    line += fmt::format("{} timed; {}/{} timings, {} elapsed, {}", r.timed_configs, done_, total_,
                        format_seconds(clock_() - start_), eta());
  }
  std::fprintf(stream_, "%s\n", line.c_str());
  std::fflush(stream_);
}

void TuneProgress::finish() {
  if (open_line_) {
    std::fputc('\n', stream_);
    std::fflush(stream_);
    open_line_ = false;
  }
}

}  // namespace moekit::detail

// The benchmark library's host-side logic, on any machine: router fixtures, the router's phase times computed from
// synthetic timestamps (expected values worked out here by hand), and the phase table and JSON fields in reports.
#include "moekit/bench.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "moekit/error.h"

namespace moekit::bench {
namespace {

// One sample slice, [cta][point][ns, clock]: CTA c starts at ns0 + 100 c; point p of CTA 0 at ns0 + gaps[0..p);
// CTA 0's clock runs at `ghz` cycles per ns; the other CTAs end `tail` ns after CTA 0.
std::vector<uint64_t> slice(int ctas, int points, uint64_t ns0, const std::vector<uint64_t>& gaps, double ghz,
                            uint64_t tail) {
  std::vector<uint64_t> x(static_cast<size_t>(ctas * points * 2), 0);
  uint64_t t = ns0;
  for (int p = 0; p < points; ++p) {
    x[static_cast<size_t>(p * 2)] = t;
    x[static_cast<size_t>(p * 2 + 1)] = static_cast<uint64_t>(static_cast<double>(t - ns0) * ghz) + 5000;
    if (p + 1 < points) t += gaps[static_cast<size_t>(p)];
  }
  for (int c = 1; c < ctas; ++c) {
    x[static_cast<size_t>((c * points) * 2)] = ns0 + 100 * static_cast<uint64_t>(c);
    x[static_cast<size_t>((c * points + points - 1) * 2)] = t + tail;
  }
  return x;
}

void expect_phases(const std::vector<double>& us, const std::vector<double>& want) {
  ASSERT_EQ(us.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(us[i], want[i], 1e-9) << "phase " << i;
}

TEST(BenchPhases, MediansSpanSkewAndClockFromTimestamps) {
  const int ctas = 3, points = 4;
  const std::vector<uint64_t> gaps{1000, 3000, 500};  // ns
  std::vector<uint64_t> trace;
  for (uint64_t ns0 : {1000000ull, 2000000ull, 3000000ull}) {
    const std::vector<uint64_t> s = slice(ctas, points, ns0, gaps, 2.0, 250);
    trace.insert(trace.end(), s.begin(), s.end());
  }
  const RoutePhases ph = route_phases_from_trace(trace, 3, ctas * points * 2, ctas, points);
  expect_phases(ph.cta0_us, {1.0, 3.0, 0.5});
  EXPECT_NEAR(ph.sm_clock_ghz, 2.0, 1e-9);
  EXPECT_NEAR(ph.span_us, 4.75, 1e-9);  // 4500 ns of CTA 0 + 250 ns tail of the others
  EXPECT_NEAR(ph.skew_us, 0.2, 1e-9);   // the last CTA starts 200 ns after the first
  EXPECT_EQ(ph.samples, 3);
}

TEST(BenchPhases, TheCtaThatEndsLastHasItsOwnPhases) {
  // Two CTAs, three points, clocks at 2 cycles per ns. CTA 0: phases of 1000 and 2000 ns, ends at 3000 ns. CTA 1
  // ends at 3500 ns in the first two samples (phases 500 and 2500 ns on its own clock, which starts elsewhere) and
  // at 2500 ns in the third (phases 100 and 300 ns), where CTA 0 ends last.
  const int ctas = 2, points = 3;
  auto sample = [](uint64_t end1, uint64_t a, uint64_t b) {
    return std::vector<uint64_t>{0,   0,     1000,    2000,          3000, 6000,                  // CTA 0
                                 500, 90000, 500 + a, 90000 + 2 * a, end1, 90000 + 2 * (a + b)};  // CTA 1
  };
  std::vector<uint64_t> trace;
  for (const auto& s : {sample(3500, 500, 2500), sample(3500, 500, 2500), sample(2500, 100, 300)})
    trace.insert(trace.end(), s.begin(), s.end());
  const RoutePhases ph = route_phases_from_trace(trace, 3, ctas * points * 2, ctas, points);
  expect_phases(ph.cta0_us, {1.0, 2.0});
  expect_phases(ph.last_us, {0.5, 2.5});  // medians over CTA 1, CTA 1, CTA 0: {0.5, 0.5, 1.0}, {2.5, 2.5, 2.0}
  EXPECT_EQ(ph.last_cta, 1);
  EXPECT_NEAR(ph.span_us, 3.5, 1e-9);
}

TEST(BenchPhases, RejectsATraceTooShortForItsShape) {
  const std::vector<uint64_t> trace(10, 0);
  EXPECT_THROW(route_phases_from_trace(trace, 2, 8, 1, 4), InvalidArgument);
  EXPECT_THROW(route_phases_from_trace(trace, 1, 4, 1, 4), InvalidArgument);  // a slice needs 2 * 4 words
}

TEST(BenchKernels, ShortNamesDropNamespacesTemplatesAndParameters) {
  // Mangled names as the profiler gives them (`c++filt` of each is in the comment).
  // void moekit::detail::(anonymous namespace)::expert_gemv_kernel<1>(moekit::detail::GemvParams)
  EXPECT_EQ(short_kernel_name("_ZN6moekit6detail12_GLOBAL__N_118expert_gemv_kernelILi1EEEvNS0_10GemvParamsE"),
            "expert_gemv_kernel");
  // void cutlass::device_kernel<Op<int, 2>>(Op<int, 2>::Params)
  EXPECT_EQ(short_kernel_name("_ZN7cutlass13device_kernelI2OpIiLi2EEEEvNT_6ParamsE"), "device_kernel");
  EXPECT_EQ(short_kernel_name("void ns::inner::combine_kernel<true>(ns::P)"), "combine_kernel");
  EXPECT_EQ(short_kernel_name("plain"), "plain");
  EXPECT_EQ(short_kernel_name("broken<(x"), "broken<(x");  // unbalanced: returned as given
  EXPECT_EQ(short_kernel_name("_Znot_a_valid_mangling"), "_Znot_a_valid_mangling");
  // Rejected by the demangler (as some CUTLASS kernels' names are): the leading nested name still gives the function.
  EXPECT_EQ(short_kernel_name("_ZN7cutlass13device_kernelIQQQ"), "device_kernel");
  EXPECT_EQ(short_kernel_name("_ZN7cutlass99overlong"), "_ZN7cutlass99overlong");  // length past the end
}

TEST(BenchKernels, BreakdownPerPositionFromSamplesWithTheMostKernels) {
  // Three samples of two kernels (durations 2/3/4 us and 1/1/5 us; the second starts 0.5 us after the first ends,
  // or 0.25 us before it, overlapping) and one incomplete sample, which is left out.
  std::vector<std::vector<KernelSpan>> samples;
  const double d1[] = {2, 3, 4}, d2[] = {1, 1, 5}, gap[] = {0.5, 0.5, -0.25};
  for (int i = 0; i < 3; ++i) {
    const uint64_t t0 = 1000000ull * (i + 1);
    const uint64_t e0 = t0 + static_cast<uint64_t>(d1[i] * 1000);
    const uint64_t s1 = static_cast<uint64_t>(static_cast<double>(e0) + gap[i] * 1000);
    samples.push_back({{"_Z1av", t0, e0}, {"b", s1, s1 + static_cast<uint64_t>(d2[i] * 1000)}});
  }
  samples.push_back({{"_Z1av", 9000000, 9900000}});
  const std::vector<KernelStat> k = kernel_breakdown(samples);
  ASSERT_EQ(k.size(), 2u);
  EXPECT_EQ(k[0].name, "a");
  EXPECT_EQ(k[1].name, "b");
  EXPECT_EQ(k[0].duration.samples, 3);
  EXPECT_NEAR(k[0].duration.median_us, 3.0, 1e-9);
  EXPECT_NEAR(k[0].duration.min_us, 2.0, 1e-9);
  EXPECT_NEAR(k[1].duration.median_us, 1.0, 1e-9);
  EXPECT_NEAR(k[1].duration.p90_us, 5.0, 1e-9);
  EXPECT_EQ(k[0].start_gap_us, 0.0);
  EXPECT_NEAR(k[1].start_gap_us, 0.5, 1e-9);
  EXPECT_TRUE(kernel_breakdown({}).empty());
}

// Samples open with the harness's marker memset (its size, value = sample index & 0xff); a call's own memset (a
// library zeroing its workspace, of any size and value) and one of the marker's size but the wrong value stay in
// the call; records before the first marker are left out.
TEST(BenchKernels, SplitSamplesAtTheMarkersOnly) {
  const uint64_t marker = 1 << 20;
  auto memset = [](uint64_t start, uint64_t bytes, uint32_t value) {
    return ActivityRecord{start, start + 100, false, {}, bytes, value};
  };
  auto kernel = [](uint64_t start, uint64_t end, const char* name) {
    return ActivityRecord{start, end, true, name, 0, 0};
  };
  const std::vector<ActivityRecord> records = {
      kernel(0, 50, "before"),    memset(100, marker, 0),  kernel(300, 1300, "gemm"), memset(1400, 256, 0),
      kernel(1600, 2600, "gemm"), memset(3000, marker, 1), memset(3200, marker, 7),   kernel(3400, 3900, "gemm"),
  };
  const std::vector<std::vector<KernelSpan>> s = split_samples(records, marker);
  ASSERT_EQ(s.size(), 2u);
  ASSERT_EQ(s[0].size(), 3u);
  EXPECT_EQ(s[0][0].name, "gemm");
  EXPECT_EQ(s[0][1].name, "memset (256 bytes)");
  EXPECT_EQ(s[0][2].start_ns, 1600u);
  ASSERT_EQ(s[1].size(), 2u);
  EXPECT_EQ(s[1][0].name, "memset (1048576 bytes)");  // the marker's size, but not sample 1's value
  EXPECT_NEAR(busy_us(s[0]), 1.0 + 0.1 + 1.0, 1e-9);
  EXPECT_NEAR(busy_us(s[1]), 0.1 + 0.5, 1e-9);
  // Overlapping spans count once.
  EXPECT_NEAR(busy_us({{"a", 0, 2000}, {"b", 1500, 2500}, {"c", 2600, 2700}}), 2.6, 1e-9);
  EXPECT_EQ(busy_us({}), 0.0);
  EXPECT_TRUE(split_samples({kernel(0, 10, "x")}, marker).empty());
}

TEST(BenchRoute, FixturesAndUnknownName) {
  const std::vector<RouteCase> seed6 = route_fixtures("seed6");
  ASSERT_EQ(seed6.size(), 6u);
  EXPECT_EQ(seed6[2].tokens, 8);
  EXPECT_EQ(seed6[2].cfg.top_k, 10);
  EXPECT_EQ(seed6[2].block, 8);
  const std::vector<RouteCase> dsv3 = route_fixtures("dsv3");
  ASSERT_EQ(dsv3.size(), 4u);
  EXPECT_EQ(dsv3[0].cfg.method, RoutingMethod::sigmoid_grouped);
  EXPECT_TRUE(dsv3[0].bias);
  try {
    route_fixtures("seed7");
    FAIL() << "no exception";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("seed6, dsv3"), std::string::npos) << e.what();
  }
}

TEST(BenchRoute, ReportsCarryThePhases) {
  RouteResult r;
  r.c = route_fixtures("dsv3")[0];
  r.ctas = 1;
  r.verified = true;
  r.phases.cta0_us = {1.0, 3.0, 0.25, 0.0, 0.75, 0.5, 0.75};
  r.phases.span_us = 6.5;
  r.phases.sm_clock_ghz = 1.97;
  r.phases.samples = 100;
  const Ceilings c{"test GPU", 132, 1 << 20, 4e12, 0.6, 0.9};
  const std::string md = route_markdown({r}, c);
  EXPECT_NE(md.find("| setup | route | count | totals | offsets | scatter | padding |"), std::string::npos) << md;
  EXPECT_NE(md.find("| dsv3 | 1 | 1 | 1.00 | 3.00 | 0.25 | 0.00 | 0.75 | 0.50 | 0.75 | 6.50 | 0.00 | 1.97 |"),
            std::string::npos)
      << md;
  const std::string js = route_json({r}, c);
  EXPECT_NE(js.find("\"sm_clock_ghz\": 1.97"), std::string::npos) << js;
  EXPECT_NE(js.find("\"span_us\": 6.5"), std::string::npos) << js;
  EXPECT_NE(js.find("\"tiny_plan\": false"), std::string::npos) << js;
  EXPECT_EQ(md.find("build their plan in one step"), std::string::npos) << md;
  EXPECT_EQ(md.find("last: CTA"), std::string::npos) << md;  // one CTA: no row for the last one

  // A grid: the CTA that ends last gets a row under CTA 0's, in the report and the JSON.
  RouteResult g = r;
  g.ctas = 16;
  g.phases.last_us = {1.5, 2.0, 0.5, 0.25, 1.25, 0.5, 0.75};
  g.phases.last_cta = 15;
  const std::string gmd = route_markdown({g}, c);
  EXPECT_NE(gmd.find("| | | last: CTA 15 | 1.50 | 2.00 | 0.50 | 0.25 | 1.25 | 0.50 | 0.75 | | | |"),
            std::string::npos)
      << gmd;
  EXPECT_NE(route_json({g}, c).find("\"last_cta\": 15"), std::string::npos);

  // A one-step plan: the phase columns mean other things, and the report says so.
  r.tiny_plan = true;
  EXPECT_NE(route_markdown({r}, c).find("Calls with T * Kt <= 32 on one CTA build their plan in one step"),
            std::string::npos);
  EXPECT_NE(route_json({r}, c).find("\"tiny_plan\": true"), std::string::npos);
}

}  // namespace
}  // namespace moekit::bench

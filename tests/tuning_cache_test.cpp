// The autotuner's persisted cache: round trip, merge with the file (learned entries win), metadata invalidation,
// corrupted files, a save that cannot be written, two processes saving at once, resuming from a stored shortlist,
// entries naming unknown tactics.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "error_of.h"
#include "fake_runner.h"
#include "moekit/error.h"
#include "moekit/layer.h"
#include "moekit/tuner.h"
#include "tuner_test_util.h"

namespace moekit {
namespace {

using testing::built_runner;
using testing::FakeRunner;
using testing::FakeRunnerConfig;
using testing::read_all;
using testing::small_spec;
using testing::temp_dir;
using testing::test_metadata;
using testing::write_all;
namespace fs = std::filesystem;

using testing::error_of;

// ---- persisted cache
// -----------------------------------------------------------------------------------------------

TEST(TuningCache, RoundTrip) {
  const fs::path dir = temp_dir();
  const fs::path path = dir / "sub" / "cache.json";  // the folder is created
  auto r = built_runner({.cost = [](TacticPair p) { return 1.0 + 2 * p.gemm1 + (p.gemm2 == 1 ? 0.0 : 1.0); }});
  Autotuner tuner(test_metadata());
  const int64_t tokens[] = {1, 64, 4096};
  tuner.tune(*r, small_spec(), tokens);
  Autotuner::SaveReport saved = tuner.save(path);
  EXPECT_EQ(saved.written, 3u);
  EXPECT_EQ(saved.kept_from_disk, 0u);

  Autotuner loaded(test_metadata());
  Autotuner::LoadReport report = loaded.load(path);
  EXPECT_TRUE(report.file_exists);
  EXPECT_EQ(report.loaded, 3u);
  EXPECT_EQ(report.mismatch, "");
  EXPECT_EQ(loaded.entries(), tuner.entries());
  TacticChoice c = loaded.choose(*r, small_spec(), 64);
  EXPECT_TRUE(c.tuned);
  EXPECT_EQ(c.tactics, (TacticPair{0, 1}));

  CacheFile file = Autotuner::read_file(path);
  EXPECT_EQ(file.metadata, test_metadata());
  EXPECT_EQ(file.entries.size(), 3u);
  EXPECT_TRUE(read_all(path).find("\"format\": \"moekit-tuning-cache\"") != std::string::npos);
  // A missing file loads nothing.
  Autotuner empty(test_metadata());
  EXPECT_FALSE(empty.load(dir / "absent.json").file_exists);
  EXPECT_EQ(empty.size(), 0u);
  fs::remove_all(dir);
}

TEST(TuningCache, SaveMergesWithTheFileAndLearnedEntriesWin) {
  const fs::path dir = temp_dir();
  const fs::path path = dir / "cache.json";
  TuningEntry a{"g1_0", "g2_0", {"g1_0"}, {"g2_0"}, 1.0, 2.0, 8};
  TuningEntry b{"g1_1", "g2_1", {"g1_1"}, {"g2_1"}, 3.0, 4.0, 16};
  Autotuner first(test_metadata());
  first.insert("key-a", a);
  first.save(path);

  Autotuner second(test_metadata());
  second.insert("key-b", b);
  Autotuner::SaveReport rep = second.save(path);
  EXPECT_EQ(rep.written, 2u);
  EXPECT_EQ(rep.kept_from_disk, 1u);
  EXPECT_EQ(second.find("key-a"), a);  // merged into memory too
  EXPECT_EQ(Autotuner::read_file(path).entries.size(), 2u);

  // `first` learns a new value for key-a; `second` saving again must not put its stale copy back.
  TuningEntry a2 = a;
  a2.seconds = 0.5;
  first.insert("key-a", a2);
  first.save(path);
  second.save(path);
  EXPECT_EQ(Autotuner::read_file(path).entries.at("key-a"), a2);
  fs::remove_all(dir);
}

// Saves a cache of one entry "k" with test_metadata() to `path`; returns the file's text.
std::string save_one_entry(const fs::path& path) {
  Autotuner writer(test_metadata());
  writer.insert("k", {"g1_0", "g2_0", {"g1_0"}, {"g2_0"}, 1.0, 1.0, 1});
  writer.save(path);
  return read_all(path);
}

TEST(TuningCache, MetadataMismatchInvalidates) {
  const fs::path dir = temp_dir();
  const fs::path path = dir / "cache.json";
  const std::string original = save_one_entry(path);
  struct Variant {
    std::string field;
    CacheMetadata meta;
  };
  std::vector<Variant> variants;
  for (int f = 0; f < 4; ++f) {
    CacheMetadata m = test_metadata();
    if (f == 0) m.library_version = "0.0.9";
    if (f == 1) m.device_name = "Other GPU";
    if (f == 2) m.sm_count = 114;
    if (f == 3) m.cuda_version = 12040;
    variants.push_back(
        {std::vector<std::string>{"library_version", "device_name", "sm_count", "cuda_version"}[f], m});
  }
  for (const Variant& v : variants) {
    write_all(path, original);
    Autotuner reader(v.meta);
    Autotuner::LoadReport rep = reader.load(path);
    EXPECT_EQ(rep.loaded, 0u) << v.field;
    EXPECT_EQ(rep.ignored, 1u) << v.field;
    EXPECT_EQ(rep.mismatch.rfind(v.field + " (", 0), 0u) << rep.mismatch;
    EXPECT_EQ(reader.size(), 0u);
    // Saving replaces the stale entries and writes this machine's metadata.
    reader.insert("mine", {"g1_1", "g2_1", {"g1_1"}, {"g2_1"}, 2.0, 2.0, 2});
    Autotuner::SaveReport s = reader.save(path);
    EXPECT_EQ(s.dropped, 1u);
    CacheFile file = Autotuner::read_file(path);
    EXPECT_EQ(file.metadata, v.meta);
    EXPECT_EQ(file.entries.size(), 1u);
    EXPECT_EQ(file.entries.count("mine"), 1u);
  }
  EXPECT_EQ(test_metadata().mismatch(test_metadata()), "");
  EXPECT_EQ(test_metadata().mismatch(variants[1].meta), "device_name ('Test GPU' vs 'Other GPU')");
  fs::remove_all(dir);
}

TEST(TuningCache, CorruptedFileIsReportedAndLeftAlone) {
  const fs::path dir = temp_dir();
  const fs::path path = dir / "cache.json";
  const std::string garbage = "{\"format\": \"moekit-tuning-cache\", \"entries\": {";
  write_all(path, garbage);
  Autotuner tuner(test_metadata());
  tuner.insert("k", {"g1_0", "g2_0", {"g1_0"}, {"g2_0"}, 1.0, 1.0, 1});
  const std::string prefix = "moekit::tuner: cache file '" + path.string() + "' is not valid JSON: ";
  for (int attempt = 0; attempt < 3; ++attempt) {
    try {
      if (attempt == 0) tuner.load(path);
      if (attempt == 1) tuner.save(path);
      if (attempt == 2) Autotuner::read_file(path);
      ADD_FAILURE() << "no throw in attempt " << attempt;
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(std::string(e.what()).rfind(prefix, 0), 0u) << e.what();
      EXPECT_NE(std::string(e.what()).find("parse error"), std::string::npos) << e.what();
    }
    EXPECT_EQ(read_all(path), garbage);
  }
  // Valid JSON without the cache's structure names what is wrong.
  const std::string wrong = R"({"format": "moekit-tuning-cache", "format_version": 1,
    "metadata": {"library_version": "0.1.0", "device_name": "Test GPU", "sm_count": 132, "cuda_version": 12080},
    "entries": {"k": {"gemm1": 3}}})";
  write_all(path, wrong);
  try {
    tuner.save(path);
    FAIL() << "no throw";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()), "moekit::tuner: cache file '" + path.string() +
                                         "' is not a valid tuning cache: entry 'k'.gemm1 must be a string");
  }
  EXPECT_EQ(read_all(path), wrong);
  // An entry written before the routing field reads as timed on synthetic logits; an unknown routing is an error.
  const std::string entry = R"({"format": "moekit-tuning-cache", "format_version": 1,
    "metadata": {"library_version": "0.1.0", "device_name": "Test GPU", "sm_count": 132, "cuda_version": 12080},
    "entries": {"k": {"gemm1": "g1_0", "gemm2": "g2_0", "gemm1_shortlist": ["g1_0"], "gemm2_shortlist": ["g2_0"],
                      "seconds": 1.0, "default_seconds": 1.0, "tokens": 1ROUTING}}})";
  auto with_routing = [&](const std::string& routing) {
    std::string text = entry;
    text.replace(text.find("ROUTING"), 7, routing);
    return text;
  };
  write_all(path, with_routing(""));
  EXPECT_EQ(Autotuner::read_file(path).entries.at("k").routing, "synthetic");
  write_all(path, with_routing(R"(, "routing": "given")"));
  EXPECT_EQ(Autotuner::read_file(path).entries.at("k").routing, "given");
  write_all(path, with_routing(R"(, "routing": "real")"));
  try {
    Autotuner::read_file(path);
    FAIL() << "no throw";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()), "moekit::tuner: cache file '" + path.string() +
                                         "' is not a valid tuning cache: entry 'k'.routing ('real') must be "
                                         "\"synthetic\" or \"given\"");
  }
  try {
    Autotuner::read_file(dir / "absent.json");
    FAIL() << "no throw";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()),
              "moekit::tuner: cache file '" + (dir / "absent.json").string() + "' does not exist");
  }
  fs::remove_all(dir);
}

// Places a cache cannot be saved to are named with the reason; nothing is left behind (root may write anywhere,
// so these are places no user can write to: below a regular file, and over a folder).
TEST(TuningCache, PlacesThatCannotHoldTheFileAreNamed) {
  const fs::path dir = temp_dir();
  const fs::path file = dir / "plain";
  write_all(file, "x");
  Autotuner tuner(test_metadata());
  tuner.insert("k", {"g1_0", "g2_0", {"g1_0"}, {"g2_0"}, 1.0, 1.0, 1});
  const fs::path below = file / "sub" / "cache.json";
  EXPECT_EQ(error_of([&] { tuner.save(below); }),
            fmt::format("moekit::tuner: cache file '{}' cannot be created: folder '{}': Not a directory",
                        below.string(), (file / "sub").string()));
  const fs::path folder = dir / "folder.json";
  fs::create_directories(folder);
  const std::string is_folder =
      fmt::format("moekit::tuner: cache file '{}' is a folder, not a file", folder.string());
  EXPECT_EQ(error_of([&] { tuner.save(folder); }), is_folder);
  EXPECT_EQ(error_of([&] { tuner.load(folder); }), is_folder);
  EXPECT_EQ(error_of([&] { Autotuner::read_file(folder); }), is_folder);
  EXPECT_TRUE(fs::is_directory(folder));
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir)) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"folder.json", "folder.json.lock", "plain"}));
  fs::remove_all(dir);
}

// A save that cannot write the whole file (here a file-size limit, as a full disk would) is reported with the
// system's reason, and the cache on disk stays as it was: the new text goes to a temporary file that replaces the
// cache only once complete, and that file is removed. Runs in a child process, which alone gets the limit.
TEST(TuningCache, ASaveThatCannotBeWrittenLeavesTheFileAsItWas) {
  const fs::path dir = temp_dir();
  const fs::path path = dir / "cache.json";
  const std::string on_disk = save_one_entry(path);
  ASSERT_GT(on_disk.size(), 64u);
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(fds[0]);
    std::string what = "no exception";
    std::signal(SIGXFSZ, SIG_IGN);  // a write past the limit then fails with EFBIG instead of ending the process
    rlimit limit{};
    getrlimit(RLIMIT_FSIZE, &limit);
    limit.rlim_cur = 64;
    if (setrlimit(RLIMIT_FSIZE, &limit) != 0) what = "setrlimit failed";
    try {
      Autotuner tuner(test_metadata());
      tuner.insert("new", {"g1_1", "g2_1", {"g1_1"}, {"g2_1"}, 1.0, 1.0, 1});
      tuner.save(path);
    } catch (const Error& e) {
      what = e.what();
    }
    const ssize_t n = write(fds[1], what.data(), what.size());
    _exit(n == static_cast<ssize_t>(what.size()) ? 0 : 1);
  }
  close(fds[1]);
  std::string got;
  char buf[512];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) got.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int status = -1;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(got, fmt::format("moekit::tuner: cache file '{}' cannot be written: '{}.tmp.{}': File too large",
                             path.string(), path.string(), pid));
  EXPECT_EQ(read_all(path), on_disk);
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir)) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"cache.json", "cache.json.lock"}));
  fs::remove_all(dir);
}

TEST(TuningCache, TwoProcessesSavingAtOnceKeepEveryEntry) {
  const fs::path dir = temp_dir();
  const fs::path path = dir / "cache.json";
  constexpr int kSaves = 25;
  std::vector<pid_t> children;
  for (int c = 0; c < 2; ++c) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int status = 0;
      try {
        Autotuner tuner(test_metadata());  // a fresh tuner per process, as two `moekit tune` runs would have
        for (int i = 0; i < kSaves; ++i) {
          tuner.insert(fmt::format("child{}-{}", c, i), {"g1_0", "g2_0", {"g1_0"}, {"g2_0"}, 1.0 + i, 1.0, 1});
          tuner.save(path);
        }
      } catch (...) {
        status = 1;
      }
      _exit(status);
    }
    children.push_back(pid);
  }
  for (pid_t pid : children) {
    int status = -1;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  CacheFile file = Autotuner::read_file(path);
  EXPECT_EQ(file.entries.size(), 2u * kSaves);
  for (int c = 0; c < 2; ++c)
    for (int i = 0; i < kSaves; ++i) EXPECT_EQ(file.entries.count(fmt::format("child{}-{}", c, i)), 1u);
  fs::remove_all(dir);
}

// Whatever insert() accepts, save() writes and read_file() reads back: an entry a file cannot hold (an empty name,
// a time that is not finite and positive, tokens out of range) is rejected where it comes in.
TEST(TuningCache, InsertRejectsWhatAFileCannotHold) {
  const TuningEntry good{"g1_0", "g2_0", {"g1_0"}, {"g2_0"}, 1.0, 2.0, 8};
  EXPECT_EQ(good.problem(), "");
  const std::string not_utf8 = "g1_\xff";
  const std::vector<std::pair<std::function<void(TuningEntry&)>, std::string>> broken = {
      {[](TuningEntry& e) { e.gemm1 = ""; }, "gemm1 must not be empty"},
      {[&](TuningEntry& e) { e.gemm2 = not_utf8; }, "gemm2 must be valid UTF-8"},
      {[](TuningEntry& e) { e.gemm1_shortlist.clear(); }, "gemm1_shortlist must not be empty"},
      {[](TuningEntry& e) { e.gemm2_shortlist.push_back(""); }, "gemm2_shortlist[1] must not be empty"},
      {[](TuningEntry& e) { e.seconds = 0; }, "seconds (0) must be finite and > 0"},
      {[](TuningEntry& e) { e.seconds = std::nan(""); }, "seconds (nan) must be finite and > 0"},
      {[](TuningEntry& e) { e.default_seconds = -1; }, "default_seconds (-1) must be finite and > 0"},
      {[](TuningEntry& e) { e.default_seconds = HUGE_VAL; }, "default_seconds (inf) must be finite and > 0"},
      {[](TuningEntry& e) { e.tokens = 0; }, "tokens (0) must be in [1, 2147483647]"},
      {[](TuningEntry& e) { e.tokens = kMaxTunedTokens + 1; }, "tokens (2147483648) must be in [1, 2147483647]"},
      {[](TuningEntry& e) { e.routing = ""; }, "routing ('') must be \"synthetic\" or \"given\""},
  };
  Autotuner tuner(test_metadata());
  for (const auto& [mutate, problem] : broken) {
    TuningEntry e = good;
    mutate(e);
    EXPECT_EQ(e.problem(), problem);
    EXPECT_EQ(error_of([&] { tuner.insert("k", e); }), "moekit::tuner: entry 'k'." + problem);
  }
  EXPECT_EQ(error_of([&] { tuner.insert("", good); }), "moekit::tuner: an entry's key must not be empty");
  EXPECT_EQ(error_of([&] { tuner.insert(not_utf8, good); }), "moekit::tuner: an entry's key must be valid UTF-8");
  EXPECT_EQ(tuner.size(), 0u);
  EXPECT_EQ(error_of([] {
              Autotuner t({"0.1.0", "GPU \xc3", 132, 12080});
            }),
            "moekit::tuner: metadata.device_name must be valid UTF-8");
  // The limits themselves are accepted, and survive the round trip.
  TuningEntry edge = good;
  edge.tokens = kMaxTunedTokens;
  edge.seconds = 1e-300;
  edge.routing = "given";
  tuner.insert("k \xc3\xa9", edge);
  const fs::path dir = temp_dir();
  tuner.save(dir / "cache.json");
  EXPECT_EQ(Autotuner::read_file(dir / "cache.json").entries, tuner.entries());
  fs::remove_all(dir);
}

// A file's values outside what the fields hold are named, never wrapped or taken: a JSON integer past int64 (read
// as -1 before), sm_count past int (4294967428 would have matched 132 SMs), a time of 0, an empty key.
TEST(TuningCache, FileValuesOutsideTheirRangesAreNamed) {
  const fs::path dir = temp_dir();
  const fs::path path = dir / "cache.json";
  const std::string text = R"({"format": "moekit-tuning-cache", "format_version": VERSION,
    "metadata": {"library_version": "0.1.0", "device_name": "Test GPU", "sm_count": SMS, "cuda_version": 12080},
    "entries": {"KEY": {"gemm1": "g1_0", "gemm2": "g2_0", "gemm1_shortlist": ["g1_0"], "gemm2_shortlist": ["g2_0"],
                        "seconds": SECONDS, "default_seconds": 1.0, "tokens": TOKENS}}})";
  auto with = [&](std::string field, std::string value) {
    std::string t = text;
    for (const auto& [f, v] : {std::pair<std::string, std::string>{"VERSION", "1"},
                               {"SMS", "132"},
                               {"KEY", "k"},
                               {"SECONDS", "0.5"},
                               {"TOKENS", "8"}})
      t.replace(t.find(f), f.size(), f == field ? value : v);
    return t;
  };
  write_all(path, with("", ""));
  EXPECT_EQ(Autotuner::read_file(path).entries.at("k").seconds, 0.5);
  const std::string prefix = "moekit::tuner: cache file '" + path.string() + "' ";
  const std::vector<std::tuple<std::string, std::string, std::string>> cases = {
      {"VERSION", "18446744073709551615",
       "is not a valid tuning cache: the top level.format_version (18446744073709551615) must be in "
       "[-9223372036854775808, 9223372036854775807]"},
      {"SMS", "4294967428",
       "is not a valid tuning cache: metadata.sm_count (4294967428) must be in [-2147483648, "
       "2147483647]"},
      {"TOKENS", "18446744073709551615",
       "is not a valid tuning cache: entry 'k'.tokens (18446744073709551615) must be in [-9223372036854775808, "
       "9223372036854775807]"},
      {"TOKENS", "0", "is not a valid tuning cache: entry 'k'.tokens (0) must be in [1, 2147483647]"},
      {"SECONDS", "0", "is not a valid tuning cache: entry 'k'.seconds (0) must be finite and > 0"},
      {"SECONDS", "1e400", "is not valid JSON: "},
      {"KEY", "", "is not a valid tuning cache: an entry's key must not be empty"},
  };
  for (const auto& [field, value, message] : cases) {
    write_all(path, with(field, value));
    const std::string what = error_of([&] { Autotuner::read_file(path); });
    EXPECT_EQ(what.substr(0, prefix.size() + message.size()), prefix + message) << field << " = " << value;
  }
  fs::remove_all(dir);
}

// Autotuner is documented as thread-safe: threads of one process tune, choose, insert, load and save on one tuner at
// once (each with its own runner; two runner names, so that two threads tune each key). Run under ThreadSanitizer by
// scripts/test-sanitized.sh.
TEST(TuningCache, ThreadsShareOneTuner) {
  const fs::path dir = temp_dir();
  const fs::path path = dir / "cache.json";
  constexpr int kThreads = 4, kRounds = 3;
  const FakeRunnerConfig cfg{.cost = [](TacticPair p) { return 1.0 + 2 * p.gemm1 + (p.gemm2 == 1 ? 0.0 : 1.0); }};
  std::vector<std::unique_ptr<FakeRunner>> runners;
  for (int t = 0; t < kThreads; ++t) {
    FakeRunnerConfig c = cfg;
    c.name = t % 2 == 0 ? "fake_even" : "fake_odd";
    runners.push_back(built_runner(c));
  }
  Autotuner tuner(test_metadata());
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      try {
        for (int round = 0; round < kRounds; ++round) {
          const int64_t tokens[] = {1, 64, 4096};
          tuner.tune(*runners[t], small_spec(), tokens, {.mode = TuneMode::full});
          if (tuner.choose(*runners[t], small_spec(), 64).tactics != TacticPair{0, 1})
            errors[t] = "choose() did not give the tuned pair";
          tuner.insert(fmt::format("thread{}-{}", t, round), {"g1_0", "g2_0", {"g1_0"}, {"g2_0"}, 1.0, 1.0, 1});
          (void)tuner.entries();
          (void)tuner.generation();
          tuner.save(path);
          tuner.load(path);
        }
      } catch (const std::exception& e) {
        errors[t] = e.what();
      }
    });
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(errors[t], "") << "thread " << t;
  const size_t keys = 2 * 3 + kThreads * kRounds;  // two runners' three buckets, and the inserted entries
  EXPECT_EQ(tuner.size(), keys);
  EXPECT_EQ(Autotuner::read_file(path).entries, tuner.entries());
  fs::remove_all(dir);
}

TEST(TuningCache, ResumingRetimesTheStoredShortlist) {
  const fs::path dir = temp_dir();
  const fs::path path = dir / "cache.json";
  const std::vector<double> c1{5, 2, 7, 1}, c2{4, 8, 3, 6};
  FakeRunnerConfig cfg{.n1 = 4, .n2 = 4, .cost = [&](TacticPair p) { return c1[p.gemm1] + c2[p.gemm2]; }};
  {
    auto r = built_runner(cfg);
    Autotuner tuner(test_metadata());
    const int64_t tokens[] = {256};
    tuner.tune(*r, small_spec(), tokens);
    tuner.save(path);
  }
  auto r = built_runner(cfg);
  Autotuner tuner(test_metadata());
  tuner.load(path);
  const int64_t tokens[] = {200};
  TuneResult res = tuner.tune(*r, small_spec(), tokens, {.mode = TuneMode::retime_shortlist})[0];
  EXPECT_EQ(res.timed_configs, 3 * 5 + 1);
  const std::vector<TacticPair> round{{0, 0}, {3, 2}, {3, 0}, {1, 2}, {1, 0}};  // the default, the shortlist pairs
  std::vector<TacticPair> rounds;
  for (int k = 0; k < 3; ++k) rounds.insert(rounds.end(), round.begin(), round.end());
  rounds.push_back({0, 0});
  EXPECT_EQ(r->timed, rounds);
  EXPECT_EQ(res.best, (TacticPair{3, 2}));
  EXPECT_EQ(res.entry.gemm1_shortlist, (std::vector<std::string>{"g1_3", "g1_1"}));
  fs::remove_all(dir);
}

TEST(TuningCache, EntriesNamingUnknownTacticsAreNotTrusted) {
  auto r = built_runner({.default_pair = {1, 1}});
  Autotuner tuner(test_metadata());
  const std::string key = tuning_key(*r, small_spec(), 16);
  tuner.insert(key, {"g1_9", "g2_0", {"g1_9"}, {"g2_0"}, 1.0, 1.0, 16});
  TacticChoice c = tuner.choose(*r, small_spec(), 16);
  EXPECT_FALSE(c.tuned);
  EXPECT_EQ(c.tactics, (TacticPair{1, 1}));
  const int64_t tokens[] = {16};
  EXPECT_EQ(tuner.tune(*r, small_spec(), tokens)[0].timed_configs, 19);  // a full search, not "cached"
}

}  // namespace
}  // namespace moekit

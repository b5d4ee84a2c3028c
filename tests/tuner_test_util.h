// Helpers of the autotuner's CPU tests (tuner_test.cpp, tuning_cache_test.cpp, the tune command in runtime_test.cpp):
// fixed cache metadata, a fake runner checked and built for small_spec(), and a fresh temp folder per test with
// whole-file reads and writes.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "fake_runner.h"
#include "moekit/tuner.h"

namespace moekit::testing {

namespace fs = std::filesystem;

inline CacheMetadata test_metadata() {
  return {"0.1.0", "Test GPU", 132, 12080};
}

// A fake runner checked and built for small_spec().
inline std::unique_ptr<FakeRunner> built_runner(FakeRunnerConfig cfg = {}, int64_t max_tokens = 4096) {
  auto r = std::make_unique<FakeRunner>(std::move(cfg));
  EXPECT_TRUE(r->check_support(small_spec(), Device::cpu()).ok);
  r->build_synthetic(max_tokens);
  return r;
}

// A fresh folder per test under the system temp folder.
inline fs::path temp_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  fs::path dir = fs::temp_directory_path() / (std::string("moekit_tuner_") + info->test_suite_name() + "_" +
                                              info->name() + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

inline std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

inline void write_all(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary);
  out << text;
}

}  // namespace moekit::testing

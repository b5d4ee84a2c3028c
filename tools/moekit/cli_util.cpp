// CLI helpers: splitmix64 uniform fills (chunked so threads do not change the values), list parsing, checksums,
// JSON output files.
#include "cli_util.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <thread>

#include "moekit/dtype.h"
#include "moekit/error.h"

namespace moekit::cli {
namespace {

constexpr int64_t kChunk = 1 << 16;

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Chunk c always uses the stream seeded by (seed, c), so values do not depend on how chunks are spread on threads.
template <class Store>
void fill_chunks(int64_t n, uint64_t seed, float lo, float hi, Store store) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  const int threads = static_cast<int>(std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, chunks));
  auto work = [&](int tid) {
    for (int64_t c = tid; c < chunks; c += threads) {
      uint64_t state = seed * 0x2545f4914f6cdd1dull + static_cast<uint64_t>(c);
      const int64_t end = std::min(n, (c + 1) * kChunk);
      for (int64_t i = c * kChunk; i < end; ++i) {
        const float u = static_cast<float>(splitmix64(state) >> 40) * (1.0f / 16777216.0f);
        store(i, lo + (hi - lo) * u);
      }
    }
  };
  if (threads == 1) {
    work(0);
    return;
  }
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(work, t);
  for (auto& t : pool) t.join();
}

}  // namespace

void fill_uniform(float* out, int64_t n, uint64_t seed, float lo, float hi) {
  fill_chunks(n, seed, lo, hi, [out](int64_t i, float v) { out[i] = v; });
}

void fill_uniform_bf16(uint16_t* out, int64_t n, uint64_t seed, float lo, float hi) {
  fill_chunks(n, seed, lo, hi, [out](int64_t i, float v) { out[i] = float_to_bf16(v); });
}

std::vector<float> read_logits_file(const std::string& op, const std::string& path, int experts, int64_t& tokens) {
  std::ifstream in(path);
  if (!in) throw InvalidArgument(op, fmt::format("logits file '{}' cannot be opened", path));
  std::vector<float> values;
  std::string word;
  while (in >> word) {
    // strtof, not stof: stof throws on underflow too, and a subnormal logit is a valid fp32 value.
    char* end = nullptr;
    errno = 0;
    const float v = std::strtof(word.c_str(), &end);
    if (end != word.c_str() + word.size())
      throw InvalidArgument(op, fmt::format("logits file '{}': '{}' is not a number", path, word));
    if (errno == ERANGE && std::isinf(v))
      throw InvalidArgument(op, fmt::format("logits file '{}': '{}' is outside fp32's range", path, word));
    values.push_back(v);
  }
  if (values.empty() || values.size() % static_cast<size_t>(experts) != 0)
    throw InvalidArgument(op, fmt::format("logits file '{}' holds {} values, which must be a positive multiple of "
                                          "num_experts ({})",
                                          path, values.size(), experts));
  tokens = static_cast<int64_t>(values.size()) / experts;
  return values;
}

std::vector<int64_t> parse_int_list(const std::string& op, const std::string& text) {
  std::vector<int64_t> values;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    const std::string item = text.substr(pos, comma - pos);
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size() || v < 1)
      throw InvalidArgument(op, "token list entry '" + item + "' must be a positive integer (list: '" + text + "')");
    values.push_back(v);
    pos = comma + 1;
  }
  return values;
}

Checksum checksum_bf16(const uint16_t* data, int64_t n) {
  Checksum c;
  for (int64_t i = 0; i < n; ++i) {
    const double v = bf16_to_float(data[i]);
    c.sum += v;
    c.abs_sum += v < 0 ? -v : v;
  }
  return c;
}

void write_json_file(const std::string& op, const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text << "\n";
  f.flush();
  if (!f) throw InvalidArgument(op, fmt::format("json path ({}) must be writable", path));
}

}  // namespace moekit::cli

// Fuzz target for the autotuner's persisted cache (Autotuner::read_file(), load(), save(), insert()): a cache file is
// built from the input bytes as a JSON document whose every field is either what save() writes or one of a palette
// of replacements (a missing field, another JSON type, a value out of its range, an unknown extra field, a truncated
// text), each with its documented verdict. The reader must accept exactly the documents the rules allow, and read
// back the values written; a rejection must name the file. An accepted file must survive load() -> save() ->
// read_file() unchanged, a tuner of other metadata must ignore it, and insert() must take exactly the entries the
// reader takes.
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "fuzz_targets.h"
#include "moekit/error.h"
#include "moekit/tuner.h"

namespace {

using namespace moekit;
using fuzz::Bytes;
using fuzz::require;
using nlohmann::json;
namespace fs = std::filesystem;

// One choice for a field: the JSON to write (nullopt: leave the field out), whether the rules allow it, and the
// value it must read back as where they do.
template <class T>
struct Choice {
  std::optional<json> value;
  bool valid;
  T read;  // value-initialized where a choice leaves it out
};

template <class T>
const Choice<T>& pick(Bytes& in, const std::vector<Choice<T>>& choices) {
  // The first choice (a valid value) most of the time, so that most documents break at most one rule.
  return choices[in.chance(70) ? 0 : in.pick(static_cast<int>(choices.size()))];
}

// The document being built and what it should read back as.
struct Doc {
  json j = json::object();
  bool valid = true;
  template <class T>
  void set(json& obj, const char* name, const Choice<T>& c) {
    if (c.value) obj[name] = *c.value;
    valid = valid && c.valid;
  }
  // A member that must be an object: `obj` most of the time, else an array or nothing, which break the rules.
  void put_object(Bytes& in, const char* name, json obj) {
    if (in.chance(5)) {
      j[name] = json::array();
      valid = false;
    } else if (!in.chance(3)) {
      j[name] = std::move(obj);
    } else {
      valid = false;
    }
  }
};

const std::vector<Choice<std::string>> kNames = {{"g1_0", true, "g1_0"},
                                                 {"tile128x256_pingpong", true, "tile128x256_pingpong"},
                                                 {"\xc3\xa9t\xc3\xa9", true, "\xc3\xa9t\xc3\xa9"},
                                                 {"", false},
                                                 {3, false},
                                                 {json(nullptr), false},
                                                 {std::nullopt, false}};

const std::vector<Choice<std::vector<std::string>>> kShortlists = {{json{"g1_0"}, true, {"g1_0"}},
                                                                   {json{"a", "b"}, true, {"a", "b"}},
                                                                   {json{"a", "b", "c"}, true, {"a", "b", "c"}},
                                                                   {json::array(), false},
                                                                   {json{""}, false},
                                                                   {json{"a", 1}, false},
                                                                   {"a", false},
                                                                   {std::nullopt, false}};

const std::vector<Choice<double>> kSeconds = {{0.5, true, 0.5},       {1e-300, true, 1e-300}, {3, true, 3.0},
                                              {0.0, false},           {-1.0, false},          {"1", false},
                                              {json(nullptr), false}, {std::nullopt, false}};

const std::vector<Choice<int64_t>> kTokens = {{8, true, 8},
                                              {1, true, 1},
                                              {kMaxTunedTokens, true, kMaxTunedTokens},
                                              {0, false},
                                              {kMaxTunedTokens + 1, false},
                                              {-5, false},
                                              {uint64_t{18446744073709551615u}, false},
                                              {8.0, false},
                                              {"8", false},
                                              {std::nullopt, false}};

const std::vector<Choice<std::string>> kRouting = {{std::nullopt, true, "synthetic"},
                                                   {"given", true, "given"},
                                                   {"synthetic", true, "synthetic"},
                                                   {"real", false},
                                                   {"", false},
                                                   {1, false}};

const std::vector<Choice<int>> kSmCount = {{132, true, 132},
                                           {-1, true, -1},
                                           {2147483647, true, 2147483647},
                                           {int64_t{2147483648}, false},
                                           {int64_t{4294967428}, false},
                                           {1.5, false},
                                           {std::nullopt, false}};

const std::vector<Choice<std::string>> kFormat = {
    {"moekit-tuning-cache", true}, {"other", false}, {1, false}, {std::nullopt, false}};
const std::vector<Choice<int>> kFormatVersion = {
    {1, true}, {2, false}, {1.0, false}, {"1", false}, {std::nullopt, false}};
const std::vector<Choice<std::string>> kDevice = {{"NVIDIA H200", true, "NVIDIA H200"}, {"", true, ""}, {7, false}};

const std::vector<Choice<std::string>> kKeys = {
    {"runner=cuda_bf16@3 E=128 T=64", true, "runner=cuda_bf16@3 E=128 T=64"},
    {"k", true, "k"},
    {"k \xc3\xa9", true, "k \xc3\xa9"},
    {"", false}};

// A folder for this process's files, removed at exit.
struct Scratch {
  fs::path dir = fs::temp_directory_path() / ("moekit_cache_fuzz_" + std::to_string(::getpid()));
  Scratch() { fs::create_directories(dir); }
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

void write_text(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text;
  require(out.good(), "cannot write " + p.string());
}

void check_rejection(const InvalidArgument& e, const fs::path& p, const std::string& context) {
  const std::string what = e.what();
  require(what.rfind("moekit::tuner: cache file '" + p.string() + "' ", 0) == 0,
          "a rejection that does not name the file: " + what + context);
}

void run_case(Bytes& in) {
  static const Scratch scratch;
  const fs::path path = scratch.dir / "cache.json", copy = scratch.dir / "copy.json";
  fs::remove(copy);

  Doc doc;
  CacheFile expected;
  // The top level and the metadata.
  doc.set(doc.j, "format", pick(in, kFormat));
  doc.set(doc.j, "format_version", pick(in, kFormatVersion));
  json meta = json::object();
  const Choice<std::string>& device = pick(in, kDevice);
  doc.set(meta, "library_version", Choice<std::string>{"0.1.0", true});
  doc.set(meta, "device_name", device);
  const Choice<int>& sms = pick(in, kSmCount);
  doc.set(meta, "sm_count", sms);
  doc.set(meta, "cuda_version", Choice<int>{13000, true});
  expected.metadata = {"0.1.0", device.read, sms.read, 13000};
  doc.put_object(in, "metadata", std::move(meta));

  // Up to four entries; a repeated key replaces the earlier entry in the document and in what it reads back as.
  json entries = json::object();
  std::map<std::string, bool> entry_valid;  // by key, for the entries that stay in the document
  Autotuner inserter(CacheMetadata{"0.1.0", "x", 1, 0});
  const int n = in.pick(5);
  for (int i = 0; i < n; ++i) {
    const Choice<std::string>& key = pick(in, kKeys);
    json v = json::object();
    TuningEntry e;
    Doc fields;  // the entry's fields alone
    auto field = [&](const char* name, const auto& choices, auto& out) {
      const auto& c = pick(in, choices);
      fields.set(v, name, c);
      out = c.read;  // where a choice breaks a rule, what it reads as breaks one of TuningEntry::problem()'s too
    };
    field("gemm1", kNames, e.gemm1);
    field("gemm2", kNames, e.gemm2);
    field("gemm1_shortlist", kShortlists, e.gemm1_shortlist);
    field("gemm2_shortlist", kShortlists, e.gemm2_shortlist);
    field("seconds", kSeconds, e.seconds);
    field("default_seconds", kSeconds, e.default_seconds);
    field("tokens", kTokens, e.tokens);
    field("routing", kRouting, e.routing);
    if (in.chance(10)) v["added_later"] = json{{"x", 1}};  // unknown fields are ignored
    const bool shaped = !in.chance(3);                     // else the entry is not an object
    entries[*key.value] = shaped ? v : json::array();
    entry_valid[*key.value] = key.valid && fields.valid && shaped;
    expected.entries[key.read] = e;
    // insert() takes exactly the entries the reader takes.
    require(e.problem().empty() == fields.valid,
            "TuningEntry::problem() ('" + e.problem() + "') disagrees with the rules on entry " + v.dump());
    bool inserted = true;
    try {
      inserter.insert(key.read, e);
    } catch (const InvalidArgument& err) {
      inserted = false;
      require(std::string(err.what()).rfind("moekit::tuner: ", 0) == 0, "an insert() error without its operation");
    }
    require(inserted == (key.valid && fields.valid),
            "insert() disagrees with the rules on '" + key.read + "': " + v.dump());
  }
  for (const auto& [key, valid] : entry_valid) doc.valid = doc.valid && valid;
  doc.put_object(in, "entries", std::move(entries));
  if (in.chance(10)) doc.j["comment"] = "written by hand";

  std::string text = doc.j.dump(in.chance(50) ? 2 : -1);
  if (in.chance(5)) {  // a truncated text is never a JSON value: it lacks the closing brace
    text.resize(in.u8() % text.size());
    doc.valid = false;
  }
  write_text(path, text);
  const std::string context = "\nin the file:\n" + text;

  std::optional<CacheFile> read;
  try {
    read = Autotuner::read_file(path);
  } catch (const InvalidArgument& e) {
    check_rejection(e, path, context);
    fuzz::rejected(fuzz::outcomes(fuzz::Target::tuning_cache), doc.valid, e.what(), context);
    return;
  }
  fuzz::accepted(fuzz::outcomes(fuzz::Target::tuning_cache), doc.valid, context);
  require(read->metadata == expected.metadata, "the metadata did not read back as written" + context);
  require(read->entries == expected.entries, "the entries did not read back as written" + context);

  // The round trip through a tuner: load, save elsewhere, read again.
  Autotuner tuner(expected.metadata);
  const Autotuner::LoadReport loaded = tuner.load(path);
  require(loaded.file_exists && loaded.mismatch.empty() && loaded.loaded == expected.entries.size(),
          "load() did not take every entry" + context);
  const Autotuner::SaveReport saved = tuner.save(copy);
  require(saved.written == expected.entries.size(), "save() did not write every entry" + context);
  const CacheFile again = Autotuner::read_file(copy);
  require(again.metadata == expected.metadata && again.entries == expected.entries,
          "a loaded and saved file did not read back the same" + context);
  // Other metadata: the file is ignored, whole.
  CacheMetadata other = expected.metadata;
  other.sm_count ^= 1;
  Autotuner stranger(other);
  const Autotuner::LoadReport ignored = stranger.load(path);
  require(ignored.loaded == 0 && ignored.ignored == expected.entries.size() && stranger.size() == 0 &&
              ignored.mismatch == "sm_count (" + std::to_string(other.sm_count) + " vs " +
                                      std::to_string(expected.metadata.sm_count) + ")",
          "a tuner of other metadata took the file's entries" + context);
}

}  // namespace

namespace moekit::fuzz {

void tuning_cache_input(const uint8_t* data, size_t size) {
  Bytes in(data, size);
  run_case(in);
}

}  // namespace moekit::fuzz

MOEKIT_FUZZ_ENTRY(tuning_cache_input)

// The persisted tuning cache: JSON {format, format_version, metadata, entries}. Saving takes an exclusive flock on
// "<path>.lock" (never deleted: removing a lock file races with the next locker), re-reads the file, merges, writes
// "<path>.tmp.<pid>" and renames it over the file, so readers see the old or the new file, never a partial one, and
// two processes saving at once both keep their entries. A file that is not a valid cache is reported, never replaced.
// The rules an entry must keep to be written and read back (TuningEntry::problem()) live here too, with insert(),
// which applies them to what comes into the cache.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "moekit/error.h"
#include "moekit/tuner.h"

namespace moekit {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr std::string_view kFormat = "moekit-tuning-cache";
constexpr int kFormatVersion = 1;
constexpr int64_t kInt64Min = std::numeric_limits<int64_t>::min(), kInt64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kIntMin = std::numeric_limits<int>::min(), kIntMax = std::numeric_limits<int>::max();

[[noreturn]] void bad_file(const fs::path& p, const std::string& problem) {
  throw InvalidArgument("tuner", fmt::format("cache file '{}' {}", p.string(), problem));
}

// Typed access to a member of a JSON object, with an error naming the file, the place and the expected type.
const json& member(const fs::path& p, const json& obj, const char* name, const std::string& where) {
  auto it = obj.find(name);
  if (it == obj.end()) bad_file(p, fmt::format("is not a valid tuning cache: {} has no '{}'", where, name));
  return *it;
}

std::string get_string(const fs::path& p, const json& obj, const char* name, const std::string& where) {
  const json& v = member(p, obj, name, where);
  if (!v.is_string()) bad_file(p, fmt::format("is not a valid tuning cache: {}.{} must be a string", where, name));
  return v.get<std::string>();
}

// An integer in [lo, hi]; a JSON integer beyond int64 (an unsigned one) is reported, never wrapped.
int64_t get_int(const fs::path& p, const json& obj, const char* name, const std::string& where, int64_t lo,
                int64_t hi) {
  const json& v = member(p, obj, name, where);
  if (!v.is_number_integer())
    bad_file(p, fmt::format("is not a valid tuning cache: {}.{} must be an integer", where, name));
  const bool fits = !v.is_number_unsigned() || v.get<uint64_t>() <= static_cast<uint64_t>(hi);
  if (!fits || v.get<int64_t>() < lo || v.get<int64_t>() > hi)
    bad_file(
        p, fmt::format("is not a valid tuning cache: {}.{} ({}) must be in [{}, {}]", where, name, v.dump(), lo, hi));
  return v.get<int64_t>();
}

double get_number(const fs::path& p, const json& obj, const char* name, const std::string& where) {
  const json& v = member(p, obj, name, where);
  if (!v.is_number()) bad_file(p, fmt::format("is not a valid tuning cache: {}.{} must be a number", where, name));
  return v.get<double>();
}

std::vector<std::string> get_names(const fs::path& p, const json& obj, const char* name, const std::string& where) {
  const json& v = member(p, obj, name, where);
  std::vector<std::string> names;
  if (v.is_array())
    for (const json& n : v) {
      if (!n.is_string()) break;
      names.push_back(n.get<std::string>());
    }
  if (!v.is_array() || names.size() != v.size())  // an empty list is TuningEntry::problem()'s to report
    bad_file(p, fmt::format("is not a valid tuning cache: {}.{} must be an array of strings", where, name));
  return names;
}

CacheFile parse_cache(const fs::path& p, const std::string& text) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    bad_file(p, fmt::format("is not valid JSON: {}", e.what()));
  }
  if (!j.is_object()) bad_file(p, "is not a valid tuning cache: the top level must be a JSON object");
  if (get_string(p, j, "format", "the top level") != kFormat)
    bad_file(p, fmt::format("is not a valid tuning cache: format must be \"{}\"", kFormat));
  const int64_t version = get_int(p, j, "format_version", "the top level", kInt64Min, kInt64Max);
  if (version != kFormatVersion)
    bad_file(p, fmt::format("has format_version ({}), which must be {} (written by another moekit version)", version,
                            kFormatVersion));
  CacheFile file;
  // Copies (a cache file is a few KB): a reference bound to member()'s result with a literal's temporary string
  // among its arguments trips GCC 13's -Wdangling-reference.
  const json meta = member(p, j, "metadata", "the top level");
  if (!meta.is_object()) bad_file(p, "is not a valid tuning cache: metadata must be an object");
  file.metadata.library_version = get_string(p, meta, "library_version", "metadata");
  file.metadata.device_name = get_string(p, meta, "device_name", "metadata");
  file.metadata.sm_count = static_cast<int>(get_int(p, meta, "sm_count", "metadata", kIntMin, kIntMax));
  file.metadata.cuda_version = static_cast<int>(get_int(p, meta, "cuda_version", "metadata", kIntMin, kIntMax));
  const json entries = member(p, j, "entries", "the top level");
  if (!entries.is_object()) bad_file(p, "is not a valid tuning cache: entries must be an object");
  for (const auto& [key, v] : entries.items()) {
    if (key.empty()) bad_file(p, "is not a valid tuning cache: an entry's key must not be empty");  // JSON allows ""
    const std::string where = fmt::format("entry '{}'", key);
    if (!v.is_object()) bad_file(p, fmt::format("is not a valid tuning cache: {} must be an object", where));
    TuningEntry e;
    e.gemm1 = get_string(p, v, "gemm1", where);
    e.gemm2 = get_string(p, v, "gemm2", where);
    e.gemm1_shortlist = get_names(p, v, "gemm1_shortlist", where);
    e.gemm2_shortlist = get_names(p, v, "gemm2_shortlist", where);
    e.seconds = get_number(p, v, "seconds", where);
    e.default_seconds = get_number(p, v, "default_seconds", where);
    e.tokens = get_int(p, v, "tokens", where, kInt64Min, kInt64Max);
    // Absent in caches written before the field: their timings were synthetic.
    if (v.contains("routing")) e.routing = get_string(p, v, "routing", where);
    if (std::string problem = e.problem(); !problem.empty())
      bad_file(p, fmt::format("is not a valid tuning cache: {}.{}", where, problem));
    file.entries.emplace(key, std::move(e));
  }
  return file;
}

json to_json(const CacheFile& file) {
  json entries = json::object();
  for (const auto& [key, e] : file.entries)
    entries[key] = {{"gemm1", e.gemm1},
                    {"gemm2", e.gemm2},
                    {"gemm1_shortlist", e.gemm1_shortlist},
                    {"gemm2_shortlist", e.gemm2_shortlist},
                    {"seconds", e.seconds},
                    {"default_seconds", e.default_seconds},
                    {"tokens", e.tokens},
                    {"routing", e.routing}};
  const CacheMetadata& m = file.metadata;
  return {{"format", kFormat},
          {"format_version", kFormatVersion},
          {"metadata",
           {{"library_version", m.library_version},
            {"device_name", m.device_name},
            {"sm_count", m.sm_count},
            {"cuda_version", m.cuda_version}}},
          {"entries", std::move(entries)}};
}

// The file's text, or nullopt when it does not exist.
std::optional<std::string> read_text(const fs::path& p) {
  std::error_code ec;
  if (!fs::exists(p, ec)) {
    if (ec) bad_file(p, fmt::format("cannot be inspected: {}", ec.message()));
    return std::nullopt;
  }
  if (fs::is_directory(p, ec)) bad_file(p, "is a folder, not a file");
  std::ifstream in(p, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in.good() && !in.eof()) bad_file(p, fmt::format("cannot be read: {}", std::strerror(errno)));
  return text.str();
}

// An exclusive flock held for the object's lifetime.
class FileLock {
 public:
  explicit FileLock(const fs::path& p) : path_(p) {
    fd_ = ::open(p.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) fail("cannot be opened");
    while (::flock(fd_, LOCK_EX) != 0)
      if (errno != EINTR) {
        const int err = errno;
        ::close(fd_);
        errno = err;
        fail("cannot be locked");
      }
  }
  ~FileLock() {
    ::flock(fd_, LOCK_UN);
    ::close(fd_);
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  [[noreturn]] void fail(const char* what) {
    throw InvalidArgument("tuner", fmt::format("lock file '{}' {}: {}", path_.string(), what, std::strerror(errno)));
  }
  fs::path path_;
  int fd_ = -1;
};

// Writes `text` to a temporary file next to `p`, flushes it to disk, and renames it over `p`.
void write_atomically(const fs::path& p, const std::string& text) {
  const fs::path tmp = p.string() + fmt::format(".tmp.{}", ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) bad_file(p, fmt::format("cannot be written: '{}': {}", tmp.string(), std::strerror(errno)));
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      bad_file(p, fmt::format("cannot be written: '{}': {}", tmp.string(), std::strerror(err)));
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    bad_file(p, fmt::format("cannot be written: '{}': {}", tmp.string(), std::strerror(err)));
  }
  if (::rename(tmp.c_str(), p.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    bad_file(p, fmt::format("cannot be replaced by '{}': {}", tmp.string(), std::strerror(err)));
  }
}

// Whether `s` can be written as JSON text (valid UTF-8): nlohmann's dump() throws for what it cannot write.
bool is_json_text(const std::string& s) {
  try {
    (void)json(s).dump();
    return true;
  } catch (const json::type_error&) {
    return false;
  }
}

// "" when `s` is a non-empty JSON text, else why not ("... must not be empty" or "... must be valid UTF-8").
std::string name_problem(const std::string& what, const std::string& s) {
  if (s.empty()) return what + " must not be empty";
  if (!is_json_text(s)) return what + " must be valid UTF-8";
  return {};
}

}  // namespace

std::string CacheMetadata::problem() const {
  for (const auto& [what, s] : {std::pair{"library_version", &library_version}, {"device_name", &device_name}})
    if (!is_json_text(*s)) return fmt::format("{} must be valid UTF-8", what);
  return {};
}

std::string TuningEntry::problem() const {
  for (const auto& [what, s] : {std::pair{"gemm1", &gemm1}, {"gemm2", &gemm2}})
    if (std::string why = name_problem(what, *s); !why.empty()) return why;
  for (const auto& [what, list] :
       {std::pair{"gemm1_shortlist", &gemm1_shortlist}, {"gemm2_shortlist", &gemm2_shortlist}}) {
    if (list->empty()) return fmt::format("{} must not be empty", what);
    for (size_t i = 0; i < list->size(); ++i)
      if (std::string why = name_problem(fmt::format("{}[{}]", what, i), (*list)[i]); !why.empty()) return why;
  }
  for (const auto& [what, t] : {std::pair{"seconds", seconds}, {"default_seconds", default_seconds}})
    if (!(std::isfinite(t) && t > 0)) return fmt::format("{} ({}) must be finite and > 0", what, t);
  if (tokens < 1 || tokens > kMaxTunedTokens)
    return fmt::format("tokens ({}) must be in [1, {}]", tokens, kMaxTunedTokens);
  if (routing != "synthetic" && routing != "given")
    return fmt::format("routing ('{}') must be \"synthetic\" or \"given\"", routing);
  return {};
}

void Autotuner::insert(const std::string& key, const TuningEntry& entry) {
  if (std::string why = name_problem("an entry's key", key); !why.empty()) throw InvalidArgument("tuner", why);
  if (std::string why = entry.problem(); !why.empty())
    throw InvalidArgument("tuner", fmt::format("entry '{}'.{}", key, why));
  std::lock_guard lock(mutex_);
  cache_[key] = Slot{entry, true};
  ++generation_;
}

CacheFile Autotuner::read_file(const fs::path& path) {
  std::optional<std::string> text = read_text(path);
  if (!text) bad_file(path, "does not exist");
  return parse_cache(path, *text);
}

Autotuner::LoadReport Autotuner::load(const fs::path& path) {
  LoadReport report;
  std::optional<std::string> text = read_text(path);
  if (!text) return report;
  report.file_exists = true;
  CacheFile file = parse_cache(path, *text);
  report.mismatch = metadata_.mismatch(file.metadata);
  if (!report.mismatch.empty()) {
    report.ignored = file.entries.size();
    return report;
  }
  std::lock_guard lock(mutex_);
  for (auto& [key, entry] : file.entries) {
    Slot& slot = cache_[key];
    if (slot.learned) continue;  // what this process measured is newer than the file
    slot.entry = std::move(entry);
    ++report.loaded;
  }
  ++generation_;
  return report;
}

Autotuner::SaveReport Autotuner::save(const fs::path& path) {
  SaveReport report;
  std::error_code ec;
  if (path.has_parent_path() && !fs::exists(path.parent_path(), ec)) {
    fs::create_directories(path.parent_path(), ec);
    if (ec)
      bad_file(path, fmt::format("cannot be created: folder '{}': {}", path.parent_path().string(), ec.message()));
  }
  FileLock lock(path.string() + ".lock");
  CacheFile merged;
  merged.metadata = metadata_;
  if (std::optional<std::string> text = read_text(path)) {
    CacheFile disk = parse_cache(path, *text);  // throws before anything is written
    if (metadata_.mismatch(disk.metadata).empty())
      merged.entries = std::move(disk.entries);
    else
      report.dropped = disk.entries.size();
  }
  std::lock_guard guard(mutex_);
  const size_t from_disk = merged.entries.size();
  size_t replaced = 0;
  for (const auto& [key, slot] : cache_) {
    auto it = merged.entries.find(key);
    if (it == merged.entries.end()) {
      merged.entries.emplace(key, slot.entry);
    } else if (slot.learned) {
      it->second = slot.entry;
      ++replaced;
    }
  }
  write_atomically(path, to_json(merged).dump(2) + "\n");
  // The file now holds what this process learned; later saves must not override newer results of other processes.
  for (const auto& [key, entry] : merged.entries) cache_[key] = Slot{entry, false};
  ++generation_;
  report.written = merged.entries.size();
  report.kept_from_disk = from_disk - replaced;
  return report;
}

}  // namespace moekit

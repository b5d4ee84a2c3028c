// The runner registry and backend selection. Runners are added by explicit calls (never static initializers);
// "reference" is present from the first use. Selection expands "auto" into every registered runner in preference
// order and takes the first one whose check_support() says yes, keeping every verdict for the error message.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <mutex>

#include "moekit/error.h"
#include "moekit/layer.h"
#include "runtime/runners.h"

namespace moekit {
namespace {

struct Registry {
  std::mutex mutex;
  std::vector<RunnerInfo> runners;  // sorted by preference, descending; stable for equal preferences
};

Registry& registry() {
  static Registry* r = [] {
    auto* reg = new Registry;  // never destroyed: runners may be made during static destruction
    reg->runners.push_back({"reference", 0, detail::make_reference_runner});
    return reg;
  }();
  return *r;
}

std::string names_of(const std::vector<RunnerInfo>& runners) {
  std::string names;
  for (const RunnerInfo& r : runners) names += (names.empty() ? "" : ", ") + r.name;
  return names;
}

}  // namespace

void register_runner(RunnerInfo info) {
  if (info.name.empty()) throw InvalidArgument("layer", "runner name must not be empty");
  if (info.name == "auto" || info.name == "reference")
    throw InvalidArgument("layer", fmt::format("runner name ('{}') is reserved", info.name));
  if (!info.make) throw InvalidArgument("layer", fmt::format("runner '{}' factory must not be empty", info.name));
  Registry& reg = registry();
  std::lock_guard lock(reg.mutex);
  std::erase_if(reg.runners, [&](const RunnerInfo& r) { return r.name == info.name; });
  // "reference" stays last whatever the preferences say: it is the fallback that always works on the CPU.
  auto pos = std::find_if(reg.runners.begin(), reg.runners.end(), [&](const RunnerInfo& r) {
    return r.preference < info.preference || r.name == "reference";
  });
  reg.runners.insert(pos, std::move(info));
}

bool unregister_runner(std::string_view name) {
  if (name == "reference") throw InvalidArgument("layer", "runner 'reference' cannot be unregistered");
  Registry& reg = registry();
  std::lock_guard lock(reg.mutex);
  return std::erase_if(reg.runners, [&](const RunnerInfo& r) { return r.name == name; }) > 0;
}

std::vector<std::string> registered_runners() {
  Registry& reg = registry();
  std::lock_guard lock(reg.mutex);
  std::vector<std::string> names;
  for (const RunnerInfo& r : reg.runners) names.push_back(r.name);
  return names;
}

std::unique_ptr<Runner> make_runner(std::string_view name) {
  RunnerFactory make;
  {
    Registry& reg = registry();
    std::lock_guard lock(reg.mutex);
    for (const RunnerInfo& r : reg.runners)
      if (r.name == name) make = r.make;
    if (!make)
      throw InvalidArgument("layer", fmt::format("backend '{}' must be 'auto' or a registered runner ({})", name,
                                                 names_of(reg.runners)));
  }
  std::unique_ptr<Runner> runner = make();
  if (!runner || runner->name() != name)
    throw Internal("layer", fmt::format("the factory of runner '{}' made {}", name,
                                        runner ? fmt::format("runner '{}'", runner->name()) : "nothing"));
  return runner;
}

RunnerSelection select_runner(const LayerSpec& spec, Device device, std::span<const std::string> backends) {
  spec.validate();
  if (backends.empty()) throw InvalidArgument("layer", "backends must not be empty (use {\"auto\"})");
  // Expand "auto" and drop repeats; unknown names are contract errors, reported before anything is tried.
  const std::vector<std::string> registered = registered_runners();
  std::vector<std::string> order;
  auto add = [&](const std::string& name) {
    if (std::find(order.begin(), order.end(), name) == order.end()) order.push_back(name);
  };
  for (const std::string& b : backends) {
    if (b == "auto") {
      for (const std::string& r : registered) add(r);
    } else if (std::find(registered.begin(), registered.end(), b) != registered.end()) {
      add(b);
    } else {
      throw InvalidArgument("layer", fmt::format("backend '{}' must be 'auto' or a registered runner ({})", b,
                                                 fmt::join(registered, ", ")));
    }
  }
  RunnerSelection selection;
  for (const std::string& name : order) {
    std::unique_ptr<Runner> runner = make_runner(name);
    Support s = runner->check_support(spec, device);
    selection.verdicts.push_back({name, s});
    if (s.ok) {
      selection.runner = std::move(runner);
      return selection;
    }
  }
  std::string reasons;
  for (const BackendVerdict& v : selection.verdicts)
    reasons += fmt::format("{}{}: {}", reasons.empty() ? "" : "; ", v.name, v.support.reason);
  throw NotSupported("layer", fmt::format("no backend supports this layer on {}: {}", device_name(device), reasons));
}

}  // namespace moekit

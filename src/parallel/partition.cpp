// Expert partition over ranks, rank expert configs and EP mode names: the host-only pieces
// every EP path shares. The partition arithmetic itself lives in ep_bookkeeping.h (also used by the kernels).
#include <fmt/format.h>

#include <array>
#include <string>

#include "moekit/error.h"
#include "moekit/expert_parallel.h"
#include "parallel/ep_bookkeeping.h"
#include "parallel/ep_validate.h"

namespace moekit {
namespace {

void check_world(int num_experts, int world_size, int rank) {
  if (world_size < 1 || world_size > kMaxWorldSize)
    throw InvalidArgument("ep", fmt::format("world_size ({}) must be in 1..{}", world_size, kMaxWorldSize));
  if (rank < 0 || rank >= world_size)
    throw InvalidArgument("ep", fmt::format("rank ({}) must be in 0..{}", rank, world_size - 1));
  if (num_experts < world_size)
    throw InvalidArgument("ep", fmt::format("world_size ({}) must be <= num_experts ({})", world_size, num_experts));
}

constexpr std::array<std::pair<EpMode, std::string_view>, 2> kModes{{
    {EpMode::all_gather, "all_gather"},
    {EpMode::all_to_all, "all_to_all"},
}};

}  // namespace

ExpertPartition expert_partition(int num_experts, int world_size, int rank) {
  check_world(num_experts, world_size, rank);
  return {ep::part_offset(num_experts, world_size, rank), ep::part_count(num_experts, world_size, rank)};
}

int expert_owner(int num_experts, int world_size, int expert) {
  check_world(num_experts, world_size, 0);
  if (expert < 0 || expert >= num_experts)
    throw InvalidArgument("ep", fmt::format("expert ({}) must be in 0..{}", expert, num_experts - 1));
  return ep::part_owner(num_experts, world_size, expert);
}

ExpertConfig rank_expert_config(const ExpertConfig& global, int world_size, int rank) {
  const ExpertPartition p = expert_partition(global.num_experts, world_size, rank);
  const bool whole = global.local_num_experts < 0 ||
                     (global.local_num_experts == global.num_experts && global.local_expert_offset == 0);
  const bool same = global.local_num_experts == p.count && global.local_expert_offset == p.offset;
  if (!whole && !same)
    throw InvalidArgument("ep",
                          fmt::format("local experts ({} at {}) must be -1 or rank {}'s partition ({} at {})",
                                      global.local_num_experts, global.local_expert_offset, rank, p.count, p.offset));
  ExpertConfig c = global;
  c.local_num_experts = p.count;
  c.local_expert_offset = p.offset;
  c.validate();
  return c;
}

std::string_view ep_mode_name(EpMode m) {
  for (const auto& [mode, name] : kModes)
    if (mode == m) return name;
  return "unknown";
}

EpMode parse_ep_mode(std::string_view name) {
  std::string valid;
  for (const auto& [mode, n] : kModes) {
    if (n == name) return mode;
    valid += fmt::format("{}{}", valid.empty() ? "" : ", ", n);
  }
  throw InvalidArgument("ep", fmt::format("unknown mode '{}' (expected one of: {})", name, valid));
}

}  // namespace moekit

namespace moekit::ep {

void validate_configs(const ExpertConfig& experts, const RoutingConfig& routing) {
  experts.validate();
  routing.validate();
  if (routing.num_experts != experts.num_experts || routing.top_k != experts.top_k ||
      routing.num_shared_experts != experts.num_shared_experts)
    throw InvalidArgument("ep", fmt::format("routing (E {}, K {}, S {}) must match the experts (E {}, K {}, S {})",
                                            routing.num_experts, routing.top_k, routing.num_shared_experts,
                                            experts.num_experts, experts.top_k, experts.num_shared_experts));
}

}  // namespace moekit::ep

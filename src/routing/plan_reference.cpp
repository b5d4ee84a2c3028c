// CPU reference of the route plan (DESIGN §4): from topk_ids [T, Kt] a counting sort by expert.
// Pass 1 counts slots per expert; the offsets are the exclusive prefix of the counts rounded up to B; pass 2 walks
// the slots in ascending flat order t*Kt+j and appends each to its expert's segment, so rows within an expert
// ascend and the plan is deterministic. The GPU router must reproduce these arrays exactly.
#include <fmt/format.h>

#include <algorithm>

#include "moekit/error.h"
#include "moekit/plan.h"

namespace moekit {

void build_plan_reference(int64_t tokens, RoutePlanView& plan) {
  if (plan.topk_ids == nullptr || plan.expert_counts == nullptr || plan.expert_offsets == nullptr ||
      plan.sorted_slots == nullptr || plan.slot_rows == nullptr || plan.block_experts == nullptr ||
      plan.extent == nullptr)
    throw InvalidArgument("plan", "buffers must all be allocated (a moved-from plan has none)");
  const PlanShape& shape = plan.shape;
  shape.validate();
  if (tokens < 0 || tokens > shape.max_tokens)
    throw InvalidArgument("plan",
                          fmt::format("tokens ({}) must be in [0, max_tokens ({})]", tokens, shape.max_tokens));

  const int groups = shape.groups();
  const int64_t slots = shape.slots();
  const int64_t block = shape.block;
  const int64_t total = tokens * slots;    // also the padding sentinel
  const int32_t* ids = plan.topk_ids;      // [T, Kt] int32
  int32_t* counts = plan.expert_counts;    // [G] int32
  int32_t* offsets = plan.expert_offsets;  // [G+1] int32

  // groups >= 1 (shape.validate()); an unsigned count keeps GCC 13 from warning of a negative one.
  const auto group_count = static_cast<uint32_t>(groups);
  std::fill_n(counts, group_count, 0);
  for (int64_t s = 0; s < total; ++s) {
    const int32_t e = ids[s];
    if (e < 0 || e >= groups)
      throw InvalidArgument("plan",
                            fmt::format("topk_ids[{}, {}] ({}) must be in [0, {})", s / slots, s % slots, e, groups));
    ++counts[e];
  }
  offsets[0] = 0;
  for (int e = 0; e < groups; ++e)
    offsets[e + 1] = offsets[e] + static_cast<int32_t>((counts[e] + block - 1) / block * block);

  // Place the slots, using counts as each expert's fill cursor: they end where they started.
  std::fill_n(counts, group_count, 0);
  for (int64_t s = 0; s < total; ++s) {
    const int32_t e = ids[s];
    const int32_t row = offsets[e] + counts[e]++;
    plan.sorted_slots[row] = static_cast<int32_t>(s);
    plan.slot_rows[s] = row;
  }

  // Padding: the tail of every segment, then everything past the extent up to this T's capacity.
  const auto pad = static_cast<int32_t>(total);
  for (int e = 0; e < groups; ++e)
    std::fill(plan.sorted_slots + offsets[e] + counts[e], plan.sorted_slots + offsets[e + 1], pad);
  const int64_t cap = plan_capacity(tokens, shape.num_experts, shape.top_k, shape.num_shared_experts, shape.block);
  const int64_t used_rows = offsets[groups];
  if (used_rows > cap)
    throw Internal("plan", fmt::format("padded rows ({}) must be <= capacity ({})", used_rows, cap));
  std::fill(plan.sorted_slots + used_rows, plan.sorted_slots + cap, pad);

  const int64_t used_blocks = used_rows / block;
  for (int e = 0; e < groups; ++e)
    std::fill(plan.block_experts + offsets[e] / block, plan.block_experts + offsets[e + 1] / block, e);
  std::fill(plan.block_experts + used_blocks, plan.block_experts + cap / block, -1);

  plan.extent[0] = static_cast<int32_t>(used_rows);
  plan.extent[1] = static_cast<int32_t>(used_blocks);
  plan.tokens = tokens;
}

}  // namespace moekit

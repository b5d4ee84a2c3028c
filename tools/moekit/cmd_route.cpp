// `moekit route`: routes random or file logits with any method and prints the top-k ids and weights of the first
// tokens and a summary of the route plan. Runs on the CPU reference, or on the GPU with --backend cuda.
#include <fmt/format.h>

#include "cli_util.h"
#include "commands.h"
#include "moekit/device.h"
#include "moekit/error.h"
#include "moekit/plan.h"
#include "moekit/routing.h"

namespace moekit::cli {
namespace {

struct RouteOptions {
  int experts = 8;
  int top_k = 2;
  int shared = 0;
  std::string method = "softmax_topk";
  int64_t tokens = 4;
  int block = 16;
  int n_group = 1;
  int topk_group = 1;
  bool renormalize = false;
  float scale = 1.0f;
  bool bias = false;
  std::string logits_file;
  std::string backend = "cpu";
  uint64_t seed = 1;
  int show = 4;
};

void run_route(const RouteOptions& o) {
  const RoutingConfig cfg = make_routing_config(parse_routing_method(o.method), o.experts, o.top_k, o.shared,
                                                o.renormalize, o.n_group, o.topk_group, o.scale);
  cfg.validate();
  if (o.backend != "cpu" && o.backend != "cuda")
    throw InvalidArgument("route", fmt::format("backend '{}' must be cpu or cuda", o.backend));

  int64_t tokens = o.tokens;
  std::vector<float> logits;
  if (!o.logits_file.empty()) {
    logits = read_logits_file("route", o.logits_file, o.experts, tokens);
  } else {
    if (tokens < 1) throw InvalidArgument("route", fmt::format("tokens ({}) must be >= 1", tokens));
    logits.resize(static_cast<size_t>(tokens) * o.experts);
    fill_uniform(logits.data(), static_cast<int64_t>(logits.size()), o.seed, -4.0f, 4.0f);
  }
  std::vector<float> bias;
  if (o.bias) {
    bias.resize(o.experts);
    fill_uniform(bias.data(), o.experts, o.seed + 7, -0.1f, 0.1f);
  }

  PlanShape shape{tokens, o.experts, o.top_k, o.shared, o.block};
  shape.validate();
  const int kt = shape.slots();
  const int groups = shape.groups();
  const int64_t cap = plan_capacity(tokens, o.experts, o.top_k, o.shared, o.block);
  std::vector<int32_t> ids(tokens * kt), counts(groups), offsets(groups + 1), extent(2);
  std::vector<float> weights(tokens * kt);

  if (o.backend == "cpu") {
    RoutePlan plan(shape, Device::cpu());
    TensorView lv = TensorView::contiguous(logits.data(), DType::f32, {tokens, o.experts});
    TensorView bv = o.bias ? TensorView::contiguous(bias.data(), DType::f32, {o.experts}) : TensorView{};
    route(cfg, lv, bv, plan);
    const RoutePlanView& v = plan.view();
    std::copy(v.topk_ids, v.topk_ids + ids.size(), ids.begin());
    std::copy(v.topk_weights, v.topk_weights + weights.size(), weights.begin());
    std::copy(v.expert_counts, v.expert_counts + groups, counts.begin());
    std::copy(v.expert_offsets, v.expert_offsets + groups + 1, offsets.begin());
    std::copy(v.extent, v.extent + 2, extent.begin());
  } else {
    if (cuda_device_count() == 0) throw NotSupported("route", "backend cuda needs a CUDA device, and none was found");
    RoutePlan plan(shape, Device::cuda(0));
    DeviceBuffer dl(logits.size() * sizeof(float)), db(bias.size() * sizeof(float));
    dl.upload(logits.data(), logits.size() * sizeof(float));
    if (o.bias) db.upload(bias.data(), bias.size() * sizeof(float));
    TensorView lv = TensorView::contiguous(dl.data(), DType::f32, {tokens, o.experts}, Device::cuda(0));
    TensorView bv =
        o.bias ? TensorView::contiguous(db.data(), DType::f32, {o.experts}, Device::cuda(0)) : TensorView{};
    route(cfg, lv, bv, plan);
    const RoutePlanView& v = plan.view();
    copy_to_host(ids.data(), v.topk_ids, ids.size() * sizeof(int32_t));
    copy_to_host(weights.data(), v.topk_weights, weights.size() * sizeof(float));
    copy_to_host(counts.data(), v.expert_counts, counts.size() * sizeof(int32_t));
    copy_to_host(offsets.data(), v.expert_offsets, offsets.size() * sizeof(int32_t));
    copy_to_host(extent.data(), v.extent, extent.size() * sizeof(int32_t));
  }

  fmt::print("route: method={} E={} K={} S={} T={} B={} backend={}\n", o.method, o.experts, o.top_k, o.shared, tokens,
             o.block, o.backend);
  const int64_t show = std::min<int64_t>(o.show, tokens);
  for (int64_t t = 0; t < show; ++t) {
    std::string id_s, w_s;
    for (int j = 0; j < kt; ++j) {
      id_s += fmt::format("{}{}", j ? ", " : "", ids[t * kt + j]);
      w_s += fmt::format("{}{:.6f}", j ? ", " : "", weights[t * kt + j]);
    }
    fmt::print("token {}: ids [{}] weights [{}]\n", t, id_s, w_s);
  }
  if (show < tokens) fmt::print("... ({} more tokens)\n", tokens - show);
  int nonempty = 0;
  for (int e = 0; e < groups; ++e) nonempty += counts[e] > 0;
  fmt::print("plan: padded rows {} of capacity {}, blocks {}, experts with slots {}/{}\n", extent[0], cap, extent[1],
             nonempty, groups);
  std::string cs;
  for (int e = 0; e < groups && e < 64; ++e) cs += fmt::format("{}{}", e ? " " : "", counts[e]);
  fmt::print("expert counts: {}{}\n", cs, groups > 64 ? " ..." : "");
}

}  // namespace

void add_route_command(CLI::App& app) {
  auto opts = std::make_shared<RouteOptions>();
  CLI::App* cmd = app.add_subcommand("route", "Route logits (random or from a file) and summarize the route plan");
  cmd->add_option("--experts", opts->experts, "Routed experts E (1..1024)")->capture_default_str();
  cmd->add_option("--top-k", opts->top_k, "Experts per token K")->capture_default_str();
  cmd->add_option("--shared", opts->shared, "Fused shared experts S")->capture_default_str();
  cmd->add_option("--method", opts->method, "softmax_topk | topk_softmax | sigmoid_grouped | llama4 | pre_scored")
      ->capture_default_str();
  cmd->add_option("--tokens", opts->tokens, "Tokens T (random logits)")->capture_default_str();
  cmd->add_option("--block", opts->block, "Plan block size B (1..256)")->capture_default_str();
  cmd->add_option("--n-group", opts->n_group, "Expert groups (sigmoid_grouped)")->capture_default_str();
  cmd->add_option("--topk-group", opts->topk_group, "Groups kept (sigmoid_grouped)")->capture_default_str();
  cmd->add_flag("--renormalize", opts->renormalize, "Renormalize the K routed weights");
  cmd->add_option("--scale", opts->scale, "Routed scaling factor")->capture_default_str();
  cmd->add_flag("--bias", opts->bias, "Add a random selection bias");
  cmd->add_option("--logits", opts->logits_file, "Text file of T*E floats (overrides --tokens)");
  cmd->add_option("--backend", opts->backend, "cpu | cuda")->capture_default_str();
  cmd->add_option("--seed", opts->seed, "Random seed")->capture_default_str();
  cmd->add_option("--show", opts->show, "Tokens to print")->capture_default_str();
  cmd->callback([opts] { run_route(*opts); });
}

}  // namespace moekit::cli

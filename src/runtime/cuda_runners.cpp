// register_cuda_runners() and the bf16 CUDA runner's slot in the registry. Until the grouped-GEMM experts
// (CudaExperts, include/moekit/cuda_experts.h) are wired in, "cuda_bf16" is registered with a check_support() that
// says precisely why it cannot run here, so "auto" falls through to the next backend and an explicit request gets
// a clear NotSupported, never a silent success.
//
// Wiring point: replace PendingCudaBf16Runner in make_cuda_bf16_runner() by the runner over CudaExperts, keeping
// the same name, the device/build checks of cuda_unavailable_reason(), and a version bump in its version().
#include <fmt/format.h>

#include <array>

#include "moekit/device.h"
#include "moekit/error.h"
#include "moekit/layer.h"
#include "runtime/runners.h"

namespace moekit::detail {
namespace {

// Why a CUDA runner cannot serve `device` in this build, or "" when the device is usable.
std::string cuda_unavailable_reason(Device device) {
  if (!built_with_cuda()) return "moekit was built without CUDA";
  if (!device.is_cuda()) return fmt::format("runs on CUDA devices only (device {})", device_name(device));
  const int count = cuda_device_count();
  if (device.index < 0 || device.index >= count)
    return fmt::format("device {} is not visible ({} CUDA device(s))", device_name(device), count);
  if (!device_is_sm90(device.index)) {
    const DeviceInfo info = device_info(device.index);
    return fmt::format("device {} ({}, sm_{}{}) is not sm_90 (Hopper)", device_name(device), info.name, info.cc_major,
                       info.cc_minor);
  }
  return {};
}

const std::array<Tactic, 1> kPendingTactics{{{"pending", "no CUDA kernels are wired in yet"}}};

// Placeholder that only ever declines: every path past check_support() is unreachable through the lifecycle.
class PendingCudaBf16Runner final : public Runner {
 public:
  std::string_view name() const override { return "cuda_bf16"; }
  std::string_view version() const override { return "0"; }
  std::span<const Tactic> gemm1_tactics() const override { return kPendingTactics; }
  std::span<const Tactic> gemm2_tactics() const override { return kPendingTactics; }

 protected:
  Support do_check_support(const LayerSpec& spec, Device device) override {
    if (std::string why = cuda_unavailable_reason(device); !why.empty()) return Support::no(why);
    if (spec.quant.weight_format != WeightFormat::bf16 || spec.quant.activation_format != ActivationFormat::bf16)
      return Support::no(fmt::format("formats (weights {}, activations {}) are not supported (bf16 only)",
                                     weight_format_name(spec.quant.weight_format),
                                     activation_format_name(spec.quant.activation_format)));
    return Support::no("the bf16 CUDA experts are not wired into this runner yet");
  }
  void do_build(const LayerWeights&, int64_t) override { unreachable("build()"); }
  LayerWeights make_synthetic_weights(uint64_t) override { unreachable("build_synthetic()"); }
  void do_execute(const LayerInputs&, const TacticPair&, Stream) override { unreachable("execute()"); }
  double do_time_tactics(const TacticPair&, int64_t) override { unreachable("time_tactics()"); }

 private:
  [[noreturn]] static void unreachable(std::string_view step) {
    throw Internal("layer", fmt::format("runner 'cuda_bf16': {} reached a runner that never supports a layer", step));
  }
};

}  // namespace

std::unique_ptr<Runner> make_cuda_bf16_runner() {
  return std::make_unique<PendingCudaBf16Runner>();
}

}  // namespace moekit::detail

namespace moekit {

void register_cuda_runners() {
  register_runner({"cuda_bf16", detail::kCudaPreference, detail::make_cuda_bf16_runner});
}

}  // namespace moekit

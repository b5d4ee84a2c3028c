// tactic_gpu_of() / tactic_gpu_name(): which GPU's rules the CUDA experts' default heuristic applies. Host code
// only, built with or without CUDA (the CLI and its tests ask which rules a device takes without the kernels).
#include "moekit/cuda_experts.h"
#include "moekit/device.h"

namespace moekit {

TacticGpu tactic_gpu_of(const DeviceInfo& info) {
  if (info.sm_count <= 0) return TacticGpu::h200;
  const double per_sm = peak_dram_bytes_per_s(info) / info.sm_count;
  return per_sm > 0 && per_sm < kLeanDramPerSm ? TacticGpu::h100 : TacticGpu::h200;
}

std::string_view tactic_gpu_name(TacticGpu gpu) {
  return gpu == TacticGpu::h100 ? "h100" : "h200";
}

}  // namespace moekit

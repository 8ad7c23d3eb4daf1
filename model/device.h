// Devices and the run-time CUDA probe.
//
// A binary must start on a machine with no GPU and no driver: CUDA is only probed at run time
// (cuda_device_count() returns 0 when cudaGetDeviceCount fails), never required at start-up.
#pragma once

#include <string>

namespace gtron {

enum class DeviceKind { kCPU, kCUDA };

struct Device {
  DeviceKind kind = DeviceKind::kCPU;
  int index = 0;

  static Device cpu() { return {DeviceKind::kCPU, 0}; }
  static Device cuda(int i) { return {DeviceKind::kCUDA, i}; }
  bool is_cpu() const { return kind == DeviceKind::kCPU; }
  bool is_cuda() const { return kind == DeviceKind::kCUDA; }
  bool operator==(const Device& o) const { return kind == o.kind && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string str() const;  // "cpu", "cuda:0"
};

// Number of usable CUDA devices; 0 when there is no driver or no GPU. Thread-safe; probes once.
int cuda_device_count();

// Compute capability of CUDA device `index` as 10·major + minor (90 for an H100/H200), and its
// name; 0 and "" when the device does not exist (no driver, or index >= cuda_device_count()).
int cuda_compute_capability(int index);
std::string cuda_device_name(int index);
// Whether the current CUDA device (cudaGetDevice) has compute capability 9.0, so sm_90a kernels
// (wgmma, TMA) run there; false without a device. Asked once per device, then cached: cheap
// enough to ask before every launch.
bool current_cuda_device_is_sm90();

}  // namespace gtron

// Run-time CUDA probe. Linked with the static CUDA runtime, so it loads on machines without a
// driver; cudaGetDeviceCount then fails and we report zero devices.
#include <cuda_runtime.h>

#include <array>
#include <atomic>

#include "model/device.h"

namespace gtron {

int cuda_device_count() {
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky error so later probes start clean
      return 0;
    }
    return n;
  }();
  return count;
}

namespace {

bool device_properties(int index, cudaDeviceProp* prop) {
  if (index < 0 || index >= cuda_device_count()) return false;
  if (cudaGetDeviceProperties(prop, index) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return true;
}

}  // namespace

int cuda_compute_capability(int index) {
  cudaDeviceProp prop;
  return device_properties(index, &prop) ? 10 * prop.major + prop.minor : 0;
}

std::string cuda_device_name(int index) {
  cudaDeviceProp prop;
  return device_properties(index, &prop) ? std::string(prop.name) : std::string();
}

bool current_cuda_device_is_sm90() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();  // no device: clear the error this probe left
    return false;
  }
  static std::array<std::atomic<int>, 64> verdict{};  // 0 unknown, 1 yes, 2 no
  if (device < 0 || device >= static_cast<int>(verdict.size())) return false;
  int v = verdict[device].load(std::memory_order_relaxed);
  if (v == 0) {
    v = cuda_compute_capability(device) == 90 ? 1 : 2;
    verdict[device].store(v, std::memory_order_relaxed);
  }
  return v == 1;
}

}  // namespace gtron

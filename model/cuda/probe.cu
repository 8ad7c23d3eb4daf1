// Run-time CUDA probe. Linked with the static CUDA runtime, so it loads on machines without a
// driver; cudaGetDeviceCount then fails and we report zero devices.
#include <cuda_runtime.h>

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

}  // namespace gtron

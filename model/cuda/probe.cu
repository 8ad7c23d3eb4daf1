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

}  // namespace gtron

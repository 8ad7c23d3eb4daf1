// DeviceBuffer: raw device memory straight from cudaMalloc, for the cuBLASLt sources' own
// buffers (GEMM workspaces, tune mode's scratch outputs), outside the caching allocator.
#pragma once

#include <cstddef>

#include "model/cuda/check.h"

namespace gtron::cuda {

// `bytes` of memory on the current device (none for 0), freed by the destructor. cudaFree waits
// for the device, so work still reading or writing the buffer finishes first. Non-copyable; the
// destructor never throws (at process exit the runtime may already be unloading, so its error is
// ignored).
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) {
    if (bytes > 0) CUDA_CHECK(cudaMalloc(&ptr_, bytes));
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
};

}  // namespace gtron::cuda

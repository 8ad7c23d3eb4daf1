// The CUDA raw backend under memory::CachingAllocator: cudaMalloc/cudaFree on one device. Only
// segment growth reaches here; a steady-state step makes no calls (see the allocator policy).
#include <memory>
#include <string>

#include "memory/caching_allocator.h"
#include "model/cuda/check.h"

namespace gtron {

namespace {

class CudaBackend : public memory::RawBackend {
 public:
  explicit CudaBackend(int device) : device_(device) {}
  void* raw_alloc(size_t bytes) override {
    CUDA_CHECK(cudaSetDevice(device_));
    void* p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    return p;
  }
  void raw_free(void* ptr) override {
    cudaSetDevice(device_);
    cudaFree(ptr);
  }
  std::string name() const override { return "cuda:" + std::to_string(device_); }

 private:
  int device_;
};

}  // namespace

std::unique_ptr<memory::RawBackend> make_cuda_backend(int device) {
  return std::make_unique<CudaBackend>(device);
}

}  // namespace gtron

#include <cstdint>

#include "model/check.h"
#include "model/cuda/check.h"
#include "model/cuda/runtime.h"

namespace gtron::cuda {

void set_device(int device) { CUDA_CHECK(cudaSetDevice(device)); }

void* stream_create(int device) {
  CUDA_CHECK(cudaSetDevice(device));
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}

void stream_destroy(void* stream) { cudaStreamDestroy(static_cast<cudaStream_t>(stream)); }

void stream_synchronize(void* stream) {
  CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
}

void* event_create(int device) {
  CUDA_CHECK(cudaSetDevice(device));
  cudaEvent_t e;
  CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

void event_destroy(void* event) { cudaEventDestroy(static_cast<cudaEvent_t>(event)); }

void event_record(void* event, void* stream) {
  CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)));
}

void stream_wait_event(void* stream, void* event) {
  CUDA_CHECK(
      cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event), 0));
}

void event_synchronize(void* event) {
  CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
}

void memcpy_async(void* dst, const void* src, size_t bytes, void* stream) {
  CUDA_CHECK(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream)));
}

void memset_async(void* dst, int value, size_t bytes, void* stream) {
  CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, static_cast<cudaStream_t>(stream)));
}

namespace {

struct ZeroRanges {
  uint32_t* dst[kZeroRangesPerLaunch];
  uint64_t words[kZeroRangesPerLaunch];
};

// blockIdx.y: the range; the x blocks stride over its words.
__global__ void zero_ranges_kernel(ZeroRanges z) {
  uint32_t* d = z.dst[blockIdx.y];
  const uint64_t n = z.words[blockIdx.y];
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    d[i] = 0u;
  }
}

}  // namespace

void zero_ranges_async(void* const* dst, const size_t* bytes, int n, void* stream) {
  constexpr int kThreads = 256;
  for (int at = 0; at < n; at += kZeroRangesPerLaunch) {
    const int m = n - at < kZeroRangesPerLaunch ? n - at : kZeroRangesPerLaunch;
    ZeroRanges z = {};
    uint64_t most = 0;
    for (int i = 0; i < m; ++i) {
      GTRON_CHECK(reinterpret_cast<uintptr_t>(dst[at + i]) % 4 == 0 && bytes[at + i] % 4 == 0,
                  "zero_ranges_async: range ", at + i, " is not 4-byte aligned and sized");
      z.dst[i] = static_cast<uint32_t*>(dst[at + i]);
      z.words[i] = bytes[at + i] / 4;
      most = z.words[i] > most ? z.words[i] : most;
    }
    if (most == 0) continue;
    const uint64_t blocks = (most + kThreads - 1) / kThreads;
    const dim3 grid(static_cast<unsigned>(blocks < 64 ? blocks : 64), static_cast<unsigned>(m));
    zero_ranges_kernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(z);
    CUDA_CHECK(cudaGetLastError());
  }
}

void memcpy_2d_async(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                     size_t height, void* stream) {
  if (width == 0 || height == 0) return;
  CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, height, cudaMemcpyDefault,
                               static_cast<cudaStream_t>(stream)));
}

void memset_2d_async(void* dst, size_t pitch, int value, size_t width, size_t height,
                     void* stream) {
  if (width == 0 || height == 0) return;
  CUDA_CHECK(
      cudaMemset2DAsync(dst, pitch, value, width, height, static_cast<cudaStream_t>(stream)));
}

PinnedBuffer::PinnedBuffer(size_t bytes) : bytes_(bytes) {
  CUDA_CHECK(cudaHostAlloc(&ptr_, bytes > 0 ? bytes : 1, cudaHostAllocDefault));
}

PinnedBuffer::~PinnedBuffer() {
  if (ptr_ != nullptr) cudaFreeHost(ptr_);
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) {
  o.ptr_ = nullptr;
  o.bytes_ = 0;
}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_ != nullptr) cudaFreeHost(ptr_);
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

}  // namespace gtron::cuda

// Thin, header-clean wrappers over the CUDA runtime for model/ (no CUDA headers leak out; handles
// are void*). Every call is checked with CUDA_CHECK semantics: a failure aborts with call, file,
// line and device.
#pragma once

#include <cstddef>

namespace gtron::cuda {

// Makes `device` current for this thread's later launches (one GPU per process).
void set_device(int device);
void* stream_create(int device);
void stream_destroy(void* stream);
void stream_synchronize(void* stream);
void* event_create(int device);
void event_destroy(void* event);
void event_record(void* event, void* stream);
void stream_wait_event(void* stream, void* event);
void event_synchronize(void* event);
void memcpy_async(void* dst, const void* src, size_t bytes, void* stream);
void memset_async(void* dst, int value, size_t bytes, void* stream);
// Zeroes n byte ranges, each 4-byte aligned and a multiple of 4 bytes long, in one kernel launch
// per kZeroRangesPerLaunch ranges: many small fills (the small gradients of a bucket, Note [first
// gradient write] in parallel/ddp.h) without a memset node each.
constexpr int kZeroRangesPerLaunch = 32;
void zero_ranges_async(void* const* dst, const size_t* bytes, int n, void* stream);
// Strided copies and fills of `height` rows of `width` bytes (row pitches in bytes): cut and pad
// every row of a matrix in one call.
void memcpy_2d_async(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                     size_t height, void* stream);
void memset_2d_async(void* dst, size_t pitch, int value, size_t width, size_t height, void* stream);

// Page-locked host memory (cudaHostAlloc): a host->device copy from it is a true asynchronous DMA,
// never staged through a driver buffer that may synchronize with the stream. Owns its bytes;
// non-copyable, movable; the destructor never throws.
// REQUIRES: the caller keeps the bytes unchanged until every copy queued from them has run (fence
// with an Event before writing them again).
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& o) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace gtron::cuda

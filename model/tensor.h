// Tensor: shared storage + element offset, a row-major contiguous shape of rank <= 4, a dtype and a
// device. Views exist only along dim 0 (rows()) and as reshapes of the same elements (view()).
//
// Memory comes from the device's memory::CachingAllocator, on the stream given at creation (the
// default stream if none); a tensor's storage goes back to that stream's free list when the last
// view dies.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "memory/caching_allocator.h"
#include "model/check.h"
#include "model/device.h"
#include "model/dtype.h"

namespace gtron {

class Stream;

class Shape {
 public:
  static constexpr int kMaxRank = 4;
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  explicit Shape(const std::vector<int64_t>& dims);

  int rank() const { return rank_; }
  int64_t operator[](int i) const { return dims_[i]; }
  int64_t numel() const;
  bool operator==(const Shape& o) const;
  bool operator!=(const Shape& o) const { return !(*this == o); }
  std::vector<int64_t> vec() const { return {dims_.begin(), dims_.begin() + rank_}; }
  std::string str() const;  // "[2, 3]"

 private:
  std::array<int64_t, kMaxRank> dims_{};
  int rank_ = 0;
};

// The caching allocator of a device (created on first use; CUDA needs the GPU backend linked).
memory::CachingAllocator& allocator_for(Device device);

// While it lives, tensors on `device` allocated in this thread come from the allocator's private
// pool `pool` (a key no stream uses) instead of their stream's pool: graphs/ gives each set of
// captured graphs its own pool, so memory a replay writes is never handed to eager work. Scopes
// do not nest.
class PrivatePoolGuard {
 public:
  PrivatePoolGuard(Device device, uintptr_t pool);
  ~PrivatePoolGuard();
  PrivatePoolGuard(const PrivatePoolGuard&) = delete;
  PrivatePoolGuard& operator=(const PrivatePoolGuard&) = delete;
};

struct Storage {
  void* data = nullptr;
  size_t bytes = 0;
  Device device;
  memory::CachingAllocator* allocator = nullptr;
  ~Storage();
};

class Tensor {
 public:
  Tensor() = default;  // undefined tensor

  // Uninitialized memory. `stream` picks the allocator free list (default stream if null).
  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::cpu(),
                      Stream* stream = nullptr);
  static Tensor zeros(const Shape& shape, DType dtype, Device device = Device::cpu(),
                      Stream* stream = nullptr);
  // CPU tensors from host values (converted to `dtype`).
  static Tensor from_vector(const std::vector<double>& values, const Shape& shape, DType dtype);
  static Tensor from_ints(const std::vector<int32_t>& values, const Shape& shape);
  // A tensor over memory someone else owns (pool and cache buffers); never freed through it.
  // REQUIRES: `ptr` holds shape.numel() elements of `dtype` on `device` for the tensor's lifetime.
  static Tensor from_blob(void* ptr, const Shape& shape, DType dtype,
                          Device device = Device::cpu());

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int rank() const { return shape_.rank(); }
  int64_t dim(int i) const { return shape_[i < 0 ? i + shape_.rank() : i]; }
  int64_t numel() const { return shape_.numel(); }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device : Device::cpu(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }

  void* raw() const {
    GTRON_CHECK(storage_ != nullptr, "raw() of an undefined tensor");
    return static_cast<char*>(storage_->data) + offset_ * dtype_size(dtype_);
  }
  template <typename T>
  T* data() const {
    GTRON_CHECK(DTypeOf<T>::value == dtype_, "data<", dtype_name(DTypeOf<T>::value), ">() on a ",
                dtype_name(dtype_), " tensor");
    return static_cast<T*>(raw());
  }

  // Rows [begin, end) of dim 0, sharing storage.
  Tensor rows(int64_t begin, int64_t end) const;
  // The same elements under another shape of equal numel, sharing storage.
  Tensor view(const Shape& shape) const;
  // True if both tensors are views of the same storage.
  bool shares_storage(const Tensor& o) const { return storage_ == o.storage_; }

  // A new tensor with the same values (on `stream`, or the default stream).
  Tensor clone(Stream* stream = nullptr) const;
  // Conversions. REQUIRES: a CPU tensor for dtype conversions; device copies go through streams.
  Tensor to(DType dtype) const;
  Tensor to(Device device, Stream* stream = nullptr) const;

  void zero_(Stream* stream = nullptr);
  // Copies `src` (same numel and dtype, any device) into this tensor.
  void copy_from(const Tensor& src, Stream* stream = nullptr);

  // Host copy of the values as doubles (tests and logging). Synchronizes.
  std::vector<double> to_vector() const;
  double item() const;

 private:
  std::shared_ptr<Storage> storage_;
  int64_t offset_ = 0;  // in elements
  Shape shape_;
  DType dtype_ = DType::kF32;
};

// Zeroes every tensor of `ts` (all on one device) on `stream` (or the device's current stream):
// on CUDA one kernel launch per cuda::kZeroRangesPerLaunch tensors instead of a memset each.
// REQUIRES: on CUDA, tensors of 4-byte aligned whole words (f32, i32, f64, or bf16 pairs).
void zero_all(const std::vector<Tensor>& ts, Stream* stream = nullptr);

}  // namespace gtron

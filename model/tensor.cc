#include "model/tensor.h"

#include <cstring>
#include <map>
#include <mutex>

#include "model/cuda/runtime.h"
#include "model/stream.h"

namespace gtron {

Shape::Shape(std::initializer_list<int64_t> dims) : Shape(std::vector<int64_t>(dims)) {}

Shape::Shape(const std::vector<int64_t>& dims) {
  GTRON_CHECK(dims.size() <= kMaxRank, "rank ", dims.size(), " > ", kMaxRank);
  rank_ = static_cast<int>(dims.size());
  for (int i = 0; i < rank_; ++i) {
    GTRON_CHECK(dims[i] >= 0, "negative dimension in shape");
    dims_[i] = dims[i];
  }
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank_; ++i) n *= dims_[i];
  return n;
}

bool Shape::operator==(const Shape& o) const {
  if (rank_ != o.rank_) return false;
  for (int i = 0; i < rank_; ++i)
    if (dims_[i] != o.dims_[i]) return false;
  return true;
}

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < rank_; ++i) s += (i ? ", " : "") + std::to_string(dims_[i]);
  return s + "]";
}

std::unique_ptr<memory::RawBackend> make_cuda_backend(int device);  // model/cuda/allocator.cu

memory::CachingAllocator& allocator_for(Device device) {
  static std::mutex mu;
  static std::map<std::pair<int, int>, memory::CachingAllocator*> allocators;  // process lifetime
  std::lock_guard<std::mutex> lock(mu);
  auto key = std::make_pair(static_cast<int>(device.kind), device.index);
  auto it = allocators.find(key);
  if (it == allocators.end()) {
    auto backend = device.is_cpu() ? memory::make_cpu_backend() : make_cuda_backend(device.index);
    it = allocators.emplace(key, new memory::CachingAllocator(std::move(backend))).first;
  }
  return *it->second;
}

Storage::~Storage() {
  if (allocator != nullptr) allocator->deallocate(data);
}

namespace {
struct PoolOverride {
  bool active = false;
  Device device;
  uintptr_t pool = 0;
};
thread_local PoolOverride t_pool;
}  // namespace

PrivatePoolGuard::PrivatePoolGuard(Device device, uintptr_t pool) {
  GTRON_CHECK(!t_pool.active, "nested PrivatePoolGuard");
  t_pool = PoolOverride{true, device, pool};
}

PrivatePoolGuard::~PrivatePoolGuard() { t_pool = PoolOverride{}; }

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device, Stream* stream) {
  Stream& s = stream ? *stream : current_stream(device);
  GTRON_CHECK(s.device() == device, "stream on ", s.device().str(), " for a ", device.str(),
              " tensor");
  auto st = std::make_shared<Storage>();
  st->bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  st->device = device;
  st->allocator = &allocator_for(device);
  const bool pooled = t_pool.active && t_pool.device == device;
  st->data = st->allocator->allocate(st->bytes, pooled ? t_pool.pool : s.id());
  Tensor t;
  t.storage_ = std::move(st);
  t.shape_ = shape;
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device, Stream* stream) {
  Tensor t = empty(shape, dtype, device, stream);
  t.zero_(stream);
  return t;
}

Tensor Tensor::from_vector(const std::vector<double>& values, const Shape& shape, DType dtype) {
  GTRON_CHECK(static_cast<int64_t>(values.size()) == shape.numel(), values.size(),
              " values for shape ", shape.str());
  Tensor t = empty(shape, dtype);
  for (size_t i = 0; i < values.size(); ++i) {
    switch (dtype) {
      case DType::kF32:
        t.data<float>()[i] = static_cast<float>(values[i]);
        break;
      case DType::kF64:
        t.data<double>()[i] = values[i];
        break;
      case DType::kBF16:
        t.data<BF16>()[i] = float_to_bf16(static_cast<float>(values[i]));
        break;
      case DType::kI32:
        t.data<int32_t>()[i] = static_cast<int32_t>(values[i]);
        break;
    }
  }
  return t;
}

Tensor Tensor::from_blob(void* ptr, const Shape& shape, DType dtype, Device device) {
  auto st = std::make_shared<Storage>();
  st->data = ptr;
  st->bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  st->device = device;
  st->allocator = nullptr;  // not owned
  Tensor t;
  t.storage_ = std::move(st);
  t.shape_ = shape;
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::from_ints(const std::vector<int32_t>& values, const Shape& shape) {
  GTRON_CHECK(static_cast<int64_t>(values.size()) == shape.numel(), values.size(),
              " values for shape ", shape.str());
  Tensor t = empty(shape, DType::kI32);
  std::memcpy(t.raw(), values.data(), values.size() * sizeof(int32_t));
  return t;
}

Tensor Tensor::rows(int64_t begin, int64_t end) const {
  GTRON_CHECK(rank() >= 1 && 0 <= begin && begin <= end && end <= dim(0), "rows(", begin, ", ", end,
              ") of ", shape_.str());
  std::vector<int64_t> dims = shape_.vec();
  int64_t row = numel() / (dims[0] == 0 ? 1 : dims[0]);
  dims[0] = end - begin;
  Tensor t = *this;
  t.offset_ = offset_ + begin * row;
  t.shape_ = Shape(dims);
  return t;
}

Tensor Tensor::view(const Shape& shape) const {
  GTRON_CHECK(shape.numel() == numel(), "view ", shape.str(), " of ", shape_.str());
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::clone(Stream* stream) const {
  Tensor t = empty(shape_, dtype_, device(), stream);
  t.copy_from(*this, stream);
  return t;
}

Tensor Tensor::to(DType dtype) const {
  GTRON_CHECK(device().is_cpu(), "dtype conversion of a ", device().str(), " tensor");
  if (dtype == dtype_) return clone();
  std::vector<double> v = to_vector();
  return from_vector(v, shape_, dtype);
}

Tensor Tensor::to(Device device, Stream* stream) const {
  Device src_dev = this->device();
  Stream* s = stream;
  if (s == nullptr) s = &current_stream(device.is_cuda() ? device : src_dev);
  Tensor t = empty(shape_, dtype_, device, device == s->device() ? s : nullptr);
  t.copy_from(*this, s);
  if (device.is_cpu()) s->synchronize();  // host readers expect the data now
  return t;
}

void Tensor::zero_(Stream* stream) {
  if (numel() == 0) return;
  Stream& s = stream ? *stream : current_stream(device());
  if (device().is_cpu()) {
    void* p = raw();
    size_t n = nbytes();
    s.run([p, n] { std::memset(p, 0, n); });
  } else {
    cuda::memset_async(raw(), 0, nbytes(), s.native());
  }
}

void zero_all(const std::vector<Tensor>& ts, Stream* stream) {
  if (ts.empty()) return;
  const Device device = ts.front().device();
  Stream& s = stream ? *stream : current_stream(device);
  std::vector<void*> dst;
  std::vector<size_t> bytes;
  for (const Tensor& t : ts) {
    GTRON_CHECK(t.device() == device, "zero_all: tensors on ", device.str(), " and ",
                t.device().str());
    if (t.numel() == 0) continue;
    dst.push_back(t.raw());
    bytes.push_back(t.nbytes());
  }
  if (device.is_cpu()) {
    s.run([dst, bytes] {
      for (size_t i = 0; i < dst.size(); ++i) std::memset(dst[i], 0, bytes[i]);
    });
  } else {
    cuda::zero_ranges_async(dst.data(), bytes.data(), static_cast<int>(dst.size()), s.native());
  }
}

void Tensor::copy_from(const Tensor& src, Stream* stream) {
  GTRON_CHECK(src.numel() == numel() && src.dtype() == dtype_, "copy of ", src.shape().str(), " ",
              dtype_name(src.dtype()), " into ", shape_.str(), " ", dtype_name(dtype_));
  if (numel() == 0) return;
  Device dev = device().is_cuda() ? device() : src.device();
  Stream& s = stream ? *stream : current_stream(dev);
  if (device().is_cpu() && src.device().is_cpu()) {
    void* d = raw();
    const void* p = src.raw();
    size_t n = nbytes();
    if (s.device().is_cpu()) {
      s.run([d, p, n] { std::memcpy(d, p, n); });
    } else {
      std::memcpy(d, p, n);
    }
  } else {
    cuda::memcpy_async(raw(), src.raw(), nbytes(), s.native());
  }
}

std::vector<double> Tensor::to_vector() const {
  Tensor host = device().is_cpu() ? *this : to(Device::cpu());
  std::vector<double> out(static_cast<size_t>(numel()));
  for (size_t i = 0; i < out.size(); ++i) {
    switch (dtype_) {
      case DType::kF32:
        out[i] = host.data<float>()[i];
        break;
      case DType::kF64:
        out[i] = host.data<double>()[i];
        break;
      case DType::kBF16:
        out[i] = bf16_to_float(host.data<BF16>()[i]);
        break;
      case DType::kI32:
        out[i] = host.data<int32_t>()[i];
        break;
    }
  }
  return out;
}

double Tensor::item() const {
  GTRON_CHECK(numel() == 1, "item() of ", shape_.str());
  return to_vector()[0];
}

}  // namespace gtron

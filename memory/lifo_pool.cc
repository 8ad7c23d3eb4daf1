#include "memory/lifo_pool.h"

#include <cstdlib>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <tuple>

namespace gtron::memory {

bool operator==(const ElemType& a, const ElemType& b) { return a.tag == b.tag && a.size == b.size; }

bool operator<(const ElemType& a, const ElemType& b) {
  return std::tie(a.tag, a.size) < std::tie(b.tag, b.size);
}

bool operator==(const PoolKey& a, const PoolKey& b) {
  return a.numel == b.numel && a.dtype == b.dtype && a.group == b.group;
}

bool operator<(const PoolKey& a, const PoolKey& b) {
  return std::tie(a.numel, a.dtype, a.group) < std::tie(b.numel, b.dtype, b.group);
}

size_t PoolKey::bytes() const {
  if (numel <= 0 || dtype.size <= 0) {
    throw std::logic_error("send pool: invalid key " + to_string() +
                           ": numel and element size must be positive");
  }
  const auto n = static_cast<size_t>(numel);
  const auto s = static_cast<size_t>(dtype.size);
  if (n > std::numeric_limits<size_t>::max() / s) {
    throw std::logic_error("send pool: key " + to_string() + " overflows size_t bytes");
  }
  return n * s;
}

std::string PoolKey::to_string() const {
  std::ostringstream os;
  os << "(numel=" << numel << ", dtype=" << dtype.tag << " (" << dtype.size
     << " bytes), group=" << group << ")";
  return os.str();
}

namespace {

class HostBufferBackend : public BufferBackend {
 public:
  static constexpr size_t kAlign = 256;
  void* allocate(size_t bytes) override {
    // aligned_alloc wants a multiple of the alignment.
    size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
    if (rounded < bytes) return nullptr;
    return std::aligned_alloc(kAlign, rounded);
  }
  void free(void* ptr) noexcept override { std::free(ptr); }
  std::string name() const override { return "host"; }
};

}  // namespace

std::unique_ptr<BufferBackend> make_host_buffer_backend() {
  return std::make_unique<HostBufferBackend>();
}

LifoPool::LifoPool(std::unique_ptr<BufferBackend> backend) : backend_(std::move(backend)) {
  if (!backend_) throw std::logic_error("send pool: null backend");
}

LifoPool::~LifoPool() {
  for (auto it = allocation_order_.rbegin(); it != allocation_order_.rend(); ++it) {
    backend_->free(*it);
  }
}

std::string LifoPool::oom_message(const PoolKey& key) const {
  std::ostringstream os;
  os << "send pool (" << backend_->name() << "): out of memory allocating " << key.bytes()
     << " bytes for key " << key.to_string() << "; the pool already holds " << stats_.bytes_held
     << " bytes in " << buffers_.size() << " buffers (" << stats_.bytes_in_use << " bytes in use).";
  return os.str();
}

void* LifoPool::acquire(const PoolKey& key) {
  const size_t bytes = key.bytes();  // validates the key
  std::lock_guard<std::mutex> lock(mu_);
  auto found = keys_.find(key);
  void* ptr = nullptr;
  if (found != keys_.end() && !found->second.free.empty()) {
    ptr = found->second.free.back();
    found->second.free.pop_back();
  } else {
    if (capturing_) {
      throw std::logic_error("send pool: no free buffer for key " + key.to_string() +
                             " during graph capture; warmup must fill the pool");
    }
    ptr = backend_->allocate(bytes);
    if (ptr == nullptr) throw std::runtime_error(oom_message(key));
    if (buffers_.count(ptr) != 0) {
      throw std::logic_error("send pool: backend " + backend_->name() +
                             " returned an address the pool already owns");
    }
    buffers_[ptr] = Lent{key, false};
    allocation_order_.push_back(ptr);
    keys_[key].held++;
    stats_.bytes_held += bytes;
    stats_.allocations++;
  }
  buffers_[ptr].in_use = true;
  keys_[key].in_use++;
  stats_.acquires++;
  stats_.bytes_in_use += bytes;
  if (stats_.bytes_in_use > stats_.peak_bytes_in_use) {
    stats_.peak_bytes_in_use = stats_.bytes_in_use;
  }
  return ptr;
}

void LifoPool::release(const PoolKey& key, void* ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = buffers_.find(ptr);
  if (it == buffers_.end()) {
    std::ostringstream os;
    os << "send pool: release of " << ptr << " under key " << key.to_string()
       << ": this pool never handed out that pointer";
    throw std::logic_error(os.str());
  }
  Lent& lent = it->second;
  if (!(lent.key == key)) {
    std::ostringstream os;
    os << "send pool: release of " << ptr << " under key " << key.to_string()
       << ", but it was acquired under key " << lent.key.to_string();
    throw std::logic_error(os.str());
  }
  if (!lent.in_use) {
    std::ostringstream os;
    os << "send pool: release of " << ptr << " under key " << key.to_string()
       << ": the buffer is already free (released twice)";
    throw std::logic_error(os.str());
  }
  lent.in_use = false;
  KeyState& state = keys_[key];
  state.free.push_back(ptr);
  state.in_use--;
  stats_.bytes_in_use -= key.bytes();
}

bool LifoPool::has_free(const PoolKey& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = keys_.find(key);
  return it != keys_.end() && !it->second.free.empty();
}

void LifoPool::set_capturing(bool capturing) {
  std::lock_guard<std::mutex> lock(mu_);
  capturing_ = capturing;
}

bool LifoPool::capturing() const {
  std::lock_guard<std::mutex> lock(mu_);
  return capturing_;
}

PoolStats LifoPool::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  PoolStats out = stats_;
  out.keys.reserve(keys_.size());
  for (const auto& [key, state] : keys_) {
    out.keys.push_back(PoolKeyStats{key, state.held, state.in_use});
  }
  return out;
}

}  // namespace gtron::memory

#include "memory/symmetric_pool.h"

#include <cstdlib>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <unordered_map>
#include <utility>

namespace gtron::memory {

namespace {

class PlainSymmetricBackend : public SymmetricBackend {
 public:
  static constexpr size_t kAlign = 256;
  void* allocate(size_t bytes) override {
    size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
    if (rounded < bytes) return nullptr;
    return std::aligned_alloc(kAlign, rounded);
  }
  WindowHandle register_window(void*, size_t) override { return nullptr; }
  void deregister_window(WindowHandle) noexcept override {}
  void free(void* ptr) noexcept override { std::free(ptr); }
  std::string name() const override { return "host-symmetric"; }
};

}  // namespace

std::unique_ptr<SymmetricBackend> make_plain_symmetric_backend() {
  return std::make_unique<PlainSymmetricBackend>();
}

// The LIFO pool's backend: allocation = allocate + register, free = deregister + free. The pool
// calls allocate/free under its own mutex; the window table has its own mutex because window() is
// called without the pool's.
class SymmetricPool::Registry : public BufferBackend {
 public:
  explicit Registry(std::unique_ptr<SymmetricBackend> backend) : backend_(std::move(backend)) {
    if (!backend_) throw std::logic_error("symmetric pool: null backend");
  }

  void* allocate(size_t bytes) override {
    void* ptr = backend_->allocate(bytes);
    if (ptr == nullptr) return nullptr;
    WindowHandle window = nullptr;
    try {
      window = backend_->register_window(ptr, bytes);
    } catch (...) {
      backend_->free(ptr);
      throw;
    }
    std::lock_guard<std::mutex> lock(mu_);
    windows_[ptr] = window;
    return ptr;
  }

  void free(void* ptr) noexcept override {
    WindowHandle window = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = windows_.find(ptr);
      if (it != windows_.end()) {
        window = it->second;
        windows_.erase(it);
      }
    }
    backend_->deregister_window(window);
    backend_->free(ptr);
  }

  std::string name() const override { return backend_->name(); }

  WindowHandle window(const void* ptr) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = windows_.find(const_cast<void*>(ptr));
    if (it == windows_.end()) {
      std::ostringstream os;
      os << "symmetric pool (" << backend_->name() << "): " << ptr
         << " is not a buffer of this pool, so it has no window";
      throw std::logic_error(os.str());
    }
    return it->second;
  }

 private:
  std::unique_ptr<SymmetricBackend> backend_;
  mutable std::mutex mu_;
  std::unordered_map<void*, WindowHandle> windows_;
};

SymmetricPool::SymmetricPool(std::unique_ptr<SymmetricBackend> backend)
    : registry_(new Registry(std::move(backend))),
      pool_(std::unique_ptr<BufferBackend>(registry_)) {}

// pool_'s destructor frees (and so deregisters) every buffer in reverse allocation order.
SymmetricPool::~SymmetricPool() = default;

void* SymmetricPool::acquire(const PoolKey& key) { return pool_.acquire(key); }

void SymmetricPool::release(const PoolKey& key, void* ptr) { pool_.release(key, ptr); }

bool SymmetricPool::has_free(const PoolKey& key) const { return pool_.has_free(key); }

void SymmetricPool::set_capturing(bool capturing) { pool_.set_capturing(capturing); }

bool SymmetricPool::capturing() const { return pool_.capturing(); }

PoolStats SymmetricPool::stats() const { return pool_.stats(); }

std::string SymmetricPool::backend_name() const { return pool_.backend_name(); }

WindowHandle SymmetricPool::window(const void* ptr) const { return registry_->window(ptr); }

}  // namespace gtron::memory

// Test helper: a BufferBackend that hands out fake addresses under a byte limit and records what
// it saw (the pools and the weight cache never touch the memory). The state is shared with the
// test because the pool or cache owns the backend.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "memory/lifo_pool.h"

namespace gtron::memory::testing {

struct FakeState {
  size_t limit = std::numeric_limits<size_t>::max();  // bytes it can hold at once
  size_t live_bytes = 0;
  size_t total_bytes = 0;  // sum over all successful allocations
  int allocs = 0;
  std::vector<uintptr_t> alloc_order;   // addresses in allocation order
  std::vector<uintptr_t> free_order;    // addresses in free order
  std::map<uintptr_t, size_t> live;     // address -> bytes
  uintptr_t next = uintptr_t{1} << 40;  // bump pointer
};

class FakeBackend : public BufferBackend {
 public:
  explicit FakeBackend(std::shared_ptr<FakeState> s) : s_(std::move(s)) {}
  void* allocate(size_t bytes) override {
    if (bytes > s_->limit - s_->live_bytes) return nullptr;
    const uintptr_t p = s_->next;
    s_->next += bytes + 256;
    s_->live_bytes += bytes;
    s_->total_bytes += bytes;
    s_->allocs++;
    s_->live[p] = bytes;
    s_->alloc_order.push_back(p);
    return reinterpret_cast<void*>(p);
  }
  void free(void* ptr) noexcept override {
    const auto p = reinterpret_cast<uintptr_t>(ptr);
    s_->live_bytes -= s_->live.at(p);
    s_->live.erase(p);
    s_->free_order.push_back(p);
  }
  std::string name() const override { return "fake"; }

 private:
  std::shared_ptr<FakeState> s_;
};

}  // namespace gtron::memory::testing

// Test helper of the caching-allocator tests: a RawBackend handing out fake addresses (the
// allocator never touches the memory) under a byte limit, with what it saw shared with the test
// (the allocator owns the backend), and a fixture holding an allocator over it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>

#include "memory/caching_allocator.h"

namespace gtron::memory::raw_testing {

constexpr size_t KiB = size_t{1} << 10;
constexpr size_t MiB = size_t{1} << 20;
constexpr size_t kRound = CachingAllocator::kRound;

// What the fake backend saw; shared with the test because the allocator owns the backend.
struct FakeState {
  size_t limit = std::numeric_limits<size_t>::max();  // bytes the backend can hold at once
  size_t live_bytes = 0;
  int allocs = 0;                       // successful raw_alloc calls
  int frees = 0;                        // raw_free calls
  int failures = 0;                     // raw_alloc calls refused for the limit
  uintptr_t next = uintptr_t{1} << 40;  // bump pointer: segments are contiguous, never reused
  uintptr_t last_ptr = 0;
  size_t last_size = 0;
  std::map<uintptr_t, size_t> live;  // segment base -> size
};

// Hands out fake addresses (the allocator never touches the memory) under a byte limit.
class FakeBackend : public RawBackend {
 public:
  explicit FakeBackend(std::shared_ptr<FakeState> state) : state_(std::move(state)) {}
  void* raw_alloc(size_t bytes) override {
    if (bytes > state_->limit - state_->live_bytes) {
      state_->failures++;
      return nullptr;
    }
    uintptr_t p = state_->next;
    state_->next += bytes;
    state_->live_bytes += bytes;
    state_->allocs++;
    state_->live[p] = bytes;
    state_->last_ptr = p;
    state_->last_size = bytes;
    return reinterpret_cast<void*>(p);
  }
  void raw_free(void* ptr) override {
    auto it = state_->live.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == state_->live.end()) throw std::logic_error("fake backend: unknown segment freed");
    state_->live_bytes -= it->second;
    state_->live.erase(it);
    state_->frees++;
  }
  std::string name() const override { return "fake-gpu:7"; }

 private:
  std::shared_ptr<FakeState> state_;
};

struct Fixture {
  std::shared_ptr<FakeState> fake = std::make_shared<FakeState>();
  CachingAllocator alloc{std::make_unique<FakeBackend>(fake)};
};

inline uintptr_t addr(void* p) { return reinterpret_cast<uintptr_t>(p); }

}  // namespace gtron::memory::raw_testing

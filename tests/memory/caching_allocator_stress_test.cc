// The caching allocator under a fixed-seed stress run, checked against an independent model of
// the policy written at the top of memory/caching_allocator.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <vector>

#include "memory/caching_allocator.h"
#include "tests/memory/fake_raw_backend.h"

namespace gtron::memory {
namespace {

using namespace raw_testing;

// An independent, deliberately naive restatement of the policy: every block of every segment in
// one address-ordered map, best fit by linear scan (smallest size, then lowest address). The
// stress test checks that the allocator returns exactly the addresses and stats this predicts.
class PolicyModel {
 public:
  explicit PolicyModel(const FakeState* fake) : fake_(fake) {}

  // Call right after the real allocate(): on a predicted miss the new segment is the fake
  // backend's last one.
  uintptr_t allocate(size_t bytes, uintptr_t stream) {
    stats_.requests++;
    size_t size = std::max<size_t>(bytes, 1);
    size = (size + kRound - 1) / kRound * kRound;
    bool small = size <= CachingAllocator::kSmallSize;
    uintptr_t best = 0;
    for (const auto& [a, b] : blocks_) {
      if (!b.free || b.stream != stream || b.small != small || b.size < size) continue;
      if (best == 0 || b.size < blocks_[best].size) best = a;  // ties keep the lower address
    }
    if (best == 0) {
      size_t seg = small ? CachingAllocator::kSegment
                         : (size + CachingAllocator::kSegment - 1) / CachingAllocator::kSegment *
                               CachingAllocator::kSegment;
      EXPECT_EQ(fake_->last_size, seg);
      best = fake_->last_ptr;
      blocks_[best] = {seg, stream, small, true};
      segments_[best] = seg;
      stats_.misses++;
      stats_.reserved += seg;
      stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
    }
    Block& b = blocks_[best];
    size_t min_split = small ? kRound : CachingAllocator::kSmallSize;
    if (b.size - size >= min_split) {
      blocks_[best + size] = {b.size - size, stream, small, true};
      b.size = size;
    }
    b.free = false;
    stats_.allocated += b.size;
    stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
    return best;
  }

  void deallocate(uintptr_t a) {
    auto it = blocks_.find(a);
    it->second.free = true;
    stats_.allocated -= it->second.size;
    auto next = std::next(it);
    if (next != blocks_.end() && next->second.free && segments_.count(next->first) == 0) {
      it->second.size += next->second.size;
      blocks_.erase(next);
    }
    if (segments_.count(a) == 0) {  // not a segment head: the block before is in the segment
      auto prev = std::prev(it);
      if (prev->second.free) {
        prev->second.size += it->second.size;
        blocks_.erase(it);
      }
    }
  }

  void empty_cache() {
    for (auto it = segments_.begin(); it != segments_.end();) {
      const Block& b = blocks_[it->first];
      if (b.free && b.size == it->second) {
        stats_.reserved -= it->second;
        blocks_.erase(it->first);
        it = segments_.erase(it);
      } else {
        ++it;
      }
    }
  }

  const AllocatorStats& stats() const { return stats_; }

 private:
  struct Block {
    size_t size;
    uintptr_t stream;
    bool small;
    bool free;
  };
  const FakeState* fake_;
  std::map<uintptr_t, Block> blocks_;
  std::map<uintptr_t, size_t> segments_;  // base -> size
  AllocatorStats stats_;
};

void expect_stats_eq(const AllocatorStats& got, const AllocatorStats& want, int op) {
  EXPECT_EQ(got.allocated, want.allocated) << "op " << op;
  EXPECT_EQ(got.reserved, want.reserved) << "op " << op;
  EXPECT_EQ(got.peak_allocated, want.peak_allocated) << "op " << op;
  EXPECT_EQ(got.peak_reserved, want.peak_reserved) << "op " << op;
  EXPECT_EQ(got.requests, want.requests) << "op " << op;
  EXPECT_EQ(got.misses, want.misses) << "op " << op;
}

size_t random_size(std::mt19937_64& rng) {
  uint64_t r = rng() % 100;
  if (r < 3) return 0;
  if (r < 65) return 1 + rng() % (64 * KiB);
  if (r < 88) return 1 + rng() % MiB;  // up to the largest small request
  return MiB + 1 + rng() % (7 * MiB);  // large
}

TEST(CachingAllocator, RandomizedStressMatchesThePolicyModel) {
  Fixture f;
  PolicyModel model(f.fake.get());
  std::mt19937_64 rng(20240520);
  std::map<uintptr_t, size_t> live;  // address -> rounded request size
  const int kOps = 20000;
  for (int op = 0; op < kOps; ++op) {
    bool alloc = live.size() < 8 || (live.size() < 96 && rng() % 100 < 55);
    if (alloc) {
      size_t bytes = random_size(rng);
      uintptr_t stream = 1 + rng() % 2;
      uintptr_t got = addr(f.alloc.allocate(bytes, stream));
      uintptr_t want = model.allocate(bytes, stream);
      ASSERT_EQ(got, want) << "op " << op << ": " << bytes << " bytes on stream " << stream;
      ASSERT_EQ(got % kRound, 0u);
      // No overlap with any live block: check both address-order neighbours.
      size_t len = std::max<size_t>(bytes, 1);
      auto next = live.lower_bound(got);
      if (next != live.end()) ASSERT_LE(got + len, next->first) << "op " << op;
      if (next != live.begin()) {
        auto prev = std::prev(next);
        ASSERT_LE(prev->first + prev->second, got) << "op " << op;
      }
      live[got] = len;
    } else {
      auto it = live.begin();
      std::advance(it, static_cast<std::ptrdiff_t>(rng() % live.size()));
      f.alloc.deallocate(reinterpret_cast<void*>(it->first));
      model.deallocate(it->first);
      live.erase(it);
    }
    if (op % 750 == 749) {
      f.alloc.empty_cache();
      model.empty_cache();
    }
    expect_stats_eq(f.alloc.stats(), model.stats(), op);
    ASSERT_EQ(f.fake->live_bytes, f.alloc.stats().reserved) << "op " << op;
    if (HasFailure()) return;
  }
  EXPECT_GT(f.alloc.stats().misses, 20u);  // the run did exercise growth
  EXPECT_LT(f.alloc.stats().misses, static_cast<uint64_t>(kOps / 10));  // and mostly reuse
  for (const auto& [a, len] : live) {
    f.alloc.deallocate(reinterpret_cast<void*>(a));
    model.deallocate(a);
  }
  f.alloc.empty_cache();
  model.empty_cache();
  expect_stats_eq(f.alloc.stats(), model.stats(), kOps);
  EXPECT_EQ(f.alloc.stats().reserved, 0u);
  EXPECT_EQ(f.fake->live_bytes, 0u);
}

}  // namespace
}  // namespace gtron::memory

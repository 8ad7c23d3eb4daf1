// Tests of the send-buffer pool policy written at the top of memory/lifo_pool.h: LIFO reuse per
// key, key isolation, has_free, the capture guard, exact stats, no shrinking, rejected releases,
// and a fixed-seed stress run checked against an independent model of the policy.
#include "memory/lifo_pool.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tests/memory/fake_backend.h"

namespace gtron::memory {
namespace {

constexpr ElemType kF32{0, 4};
constexpr ElemType kBF16{1, 2};

using testing::FakeBackend;
using testing::FakeState;

struct Fixture {
  std::shared_ptr<FakeState> state = std::make_shared<FakeState>();
  std::unique_ptr<LifoPool> pool = std::make_unique<LifoPool>(std::make_unique<FakeBackend>(state));
};

PoolKeyStats key_stats(const PoolStats& s, const PoolKey& key) {
  for (const PoolKeyStats& k : s.keys) {
    if (k.key == key) return k;
  }
  return PoolKeyStats{key, 0, 0};
}

TEST(LifoPool, LastReleasedComesBackFirst) {
  Fixture f;
  const PoolKey key{1000, kF32, 0};
  void* a = f.pool->acquire(key);
  void* b = f.pool->acquire(key);
  void* c = f.pool->acquire(key);
  EXPECT_EQ(f.state->allocs, 3);
  f.pool->release(key, a);
  f.pool->release(key, c);
  f.pool->release(key, b);
  EXPECT_EQ(f.pool->acquire(key), b);
  EXPECT_EQ(f.pool->acquire(key), c);
  f.pool->release(key, c);
  EXPECT_EQ(f.pool->acquire(key), c);
  EXPECT_EQ(f.pool->acquire(key), a);
  EXPECT_EQ(f.state->allocs, 3);
  EXPECT_EQ(f.state->live[reinterpret_cast<uintptr_t>(a)], 4000u);
}

TEST(LifoPool, KeysIsolateNumelDtypeAndGroup) {
  Fixture f;
  const PoolKey base{512, kBF16, 3};
  const std::vector<PoolKey> others = {
      {513, kBF16, 3},           // numel
      {512, kF32, 3},            // dtype tag and size
      {512, ElemType{7, 2}, 3},  // dtype tag only: same bytes, still a different key
      {512, kBF16, 4},           // group
  };
  void* p = f.pool->acquire(base);
  f.pool->release(base, p);
  EXPECT_TRUE(f.pool->has_free(base));
  for (const PoolKey& k : others) {
    EXPECT_FALSE(f.pool->has_free(k)) << k.to_string();
    void* q = f.pool->acquire(k);
    EXPECT_NE(q, p) << k.to_string();
    f.pool->release(k, q);
  }
  EXPECT_EQ(f.state->allocs, 5);
  EXPECT_EQ(f.pool->acquire(base), p);  // still on top of its own list
  EXPECT_EQ(f.state->allocs, 5);
}

TEST(LifoPool, HasFreeTellsWhetherAcquireAllocates) {
  Fixture f;
  const PoolKey key{64, kF32, 1};
  EXPECT_FALSE(f.pool->has_free(key));
  void* a = f.pool->acquire(key);
  EXPECT_FALSE(f.pool->has_free(key));
  f.pool->release(key, a);
  EXPECT_TRUE(f.pool->has_free(key));
  EXPECT_EQ(f.pool->acquire(key), a);
  EXPECT_FALSE(f.pool->has_free(key));
  EXPECT_EQ(f.state->allocs, 1);
}

TEST(LifoPool, CaptureGuardThrowsOnlyWhenItWouldAllocate) {
  Fixture f;
  const PoolKey key{4096, kBF16, 2};
  void* warm = f.pool->acquire(key);
  f.pool->release(key, warm);
  f.pool->set_capturing(true);
  EXPECT_TRUE(f.pool->capturing());
  void* p = f.pool->acquire(key);  // pops: allowed under capture
  EXPECT_EQ(p, warm);
  try {
    f.pool->acquire(key);
    FAIL() << "an allocation under capture must throw";
  } catch (const std::logic_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("no free buffer for key (numel=4096, dtype=1 (2 bytes), group=2)"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("during graph capture; warmup must fill the pool"), std::string::npos)
        << msg;
  }
  EXPECT_EQ(f.state->allocs, 1);
  EXPECT_EQ(key_stats(f.pool->stats(), key).in_use, 1u);  // the failed acquire changed nothing
  f.pool->set_capturing(false);
  void* q = f.pool->acquire(key);
  EXPECT_NE(q, p);
  EXPECT_EQ(f.state->allocs, 2);
}

TEST(LifoPool, StatsAddUp) {
  Fixture f;
  const PoolKey a{100, kF32, 0};   // 400 B
  const PoolKey b{300, kBF16, 0};  // 600 B
  void* a1 = f.pool->acquire(a);
  void* a2 = f.pool->acquire(a);
  void* b1 = f.pool->acquire(b);
  PoolStats s = f.pool->stats();
  EXPECT_EQ(s.bytes_held, 1400u);
  EXPECT_EQ(s.bytes_held, f.state->total_bytes);
  EXPECT_EQ(s.bytes_in_use, 1400u);
  EXPECT_EQ(s.peak_bytes_in_use, 1400u);
  EXPECT_EQ(s.allocations, 3u);
  EXPECT_EQ(s.acquires, 3u);
  ASSERT_EQ(s.keys.size(), 2u);
  EXPECT_EQ(key_stats(s, a).held, 2u);
  EXPECT_EQ(key_stats(s, a).in_use, 2u);
  EXPECT_EQ(key_stats(s, b).held, 1u);

  f.pool->release(a, a1);
  f.pool->release(b, b1);
  s = f.pool->stats();
  EXPECT_EQ(s.bytes_held, 1400u);
  EXPECT_EQ(s.bytes_in_use, 400u);
  EXPECT_EQ(s.peak_bytes_in_use, 1400u);
  EXPECT_EQ(key_stats(s, a).held, 2u);
  EXPECT_EQ(key_stats(s, a).in_use, 1u);
  EXPECT_EQ(key_stats(s, b).in_use, 0u);

  f.pool->acquire(b);
  s = f.pool->stats();
  EXPECT_EQ(s.allocations, 3u);
  EXPECT_EQ(s.acquires, 4u);
  EXPECT_EQ(s.bytes_in_use, 1000u);
  f.pool->release(a, a2);
}

TEST(LifoPool, NeverShrinksAndFreesInReverseAllocationOrder) {
  Fixture f;
  const PoolKey a{10, kF32, 0};
  const PoolKey b{20, kF32, 0};
  std::vector<void*> as, bs;
  for (int i = 0; i < 3; ++i) as.push_back(f.pool->acquire(a));
  for (int i = 0; i < 2; ++i) bs.push_back(f.pool->acquire(b));
  for (void* p : as) f.pool->release(a, p);
  for (void* p : bs) f.pool->release(b, p);
  EXPECT_TRUE(f.state->free_order.empty());
  EXPECT_EQ(f.pool->stats().bytes_held, 3 * 40u + 2 * 80u);
  EXPECT_EQ(f.state->live_bytes, 280u);
  f.pool.reset();
  std::vector<uintptr_t> reversed(f.state->alloc_order.rbegin(), f.state->alloc_order.rend());
  EXPECT_EQ(f.state->free_order, reversed);
  EXPECT_EQ(f.state->live_bytes, 0u);
}

TEST(LifoPool, RejectsForeignWrongKeyAndDoubleRelease) {
  Fixture f;
  const PoolKey key{8, kF32, 0};
  const PoolKey other{8, kF32, 1};
  void* p = f.pool->acquire(key);
  int local = 0;
  EXPECT_THROW(f.pool->release(key, &local), std::logic_error);
  EXPECT_THROW(f.pool->release(key, nullptr), std::logic_error);
  EXPECT_THROW(f.pool->release(other, p), std::logic_error);
  f.pool->release(key, p);
  try {
    f.pool->release(key, p);
    FAIL() << "a double release must throw";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("released twice"), std::string::npos) << e.what();
  }
  PoolStats s = f.pool->stats();
  EXPECT_EQ(s.bytes_in_use, 0u);
  EXPECT_EQ(key_stats(s, key).held, 1u);
  EXPECT_EQ(key_stats(s, other).held, 0u);
  EXPECT_EQ(f.pool->acquire(key), p);
  EXPECT_FALSE(f.pool->has_free(key));  // the rejected releases pushed nothing
}

TEST(LifoPool, InvalidKeysAndOutOfMemory) {
  Fixture f;
  EXPECT_THROW(f.pool->acquire(PoolKey{0, kF32, 0}), std::logic_error);
  EXPECT_THROW(f.pool->acquire(PoolKey{-5, kF32, 0}), std::logic_error);
  EXPECT_THROW(f.pool->acquire(PoolKey{5, ElemType{0, 0}, 0}), std::logic_error);
  EXPECT_THROW(f.pool->acquire(PoolKey{std::numeric_limits<int64_t>::max(), kF32, 0}),
               std::logic_error);
  f.state->limit = 1000;
  const PoolKey key{200, kF32, 0};  // 800 B fits once, not twice
  f.pool->acquire(key);
  try {
    f.pool->acquire(key);
    FAIL() << "out of memory must throw";
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("send pool (fake): out of memory allocating 800 bytes"), std::string::npos)
        << msg;
    EXPECT_NE(msg.find("already holds 800 bytes in 1 buffers"), std::string::npos) << msg;
  }
  EXPECT_EQ(f.pool->stats().allocations, 1u);
}

// Random acquire/release sequences against a model of the policy: per key a stack of free
// pointers; acquire returns the top or a fresh allocation, and has_free predicts which.
TEST(LifoPool, StressMatchesModel) {
  Fixture f;
  std::mt19937 rng(1234);
  const std::vector<PoolKey> keys = {{64, kF32, 0}, {64, kBF16, 0}, {128, kF32, 0}, {64, kF32, 1}};
  std::map<PoolKey, std::vector<void*>> model_free;
  std::vector<std::pair<PoolKey, void*>> lent;
  size_t model_bytes = 0;
  for (int step = 0; step < 4000; ++step) {
    if (lent.empty() || rng() % 2 == 0) {
      const PoolKey& k = keys[rng() % keys.size()];
      const bool expect_pop = !model_free[k].empty();
      ASSERT_EQ(f.pool->has_free(k), expect_pop);
      const int allocs = f.state->allocs;
      void* p = f.pool->acquire(k);
      if (expect_pop) {
        ASSERT_EQ(p, model_free[k].back());
        model_free[k].pop_back();
        ASSERT_EQ(f.state->allocs, allocs);
      } else {
        ASSERT_EQ(f.state->allocs, allocs + 1);
        model_bytes += k.bytes();
      }
      lent.emplace_back(k, p);
    } else {
      const size_t i = rng() % lent.size();
      auto [k, p] = lent[i];
      lent.erase(lent.begin() + static_cast<std::ptrdiff_t>(i));
      f.pool->release(k, p);
      model_free[k].push_back(p);
    }
  }
  PoolStats s = f.pool->stats();
  EXPECT_EQ(s.bytes_held, model_bytes);
  EXPECT_EQ(s.bytes_held, f.state->total_bytes);
  size_t held = 0;
  for (const PoolKeyStats& k : s.keys) {
    EXPECT_EQ(k.held - k.in_use, model_free[k.key].size());
    held += k.held;
  }
  EXPECT_EQ(held, static_cast<size_t>(f.state->allocs));
  size_t free_bytes = 0;
  for (const auto& [k, v] : model_free) free_bytes += v.size() * k.bytes();
  EXPECT_EQ(s.bytes_in_use + free_bytes, s.bytes_held);
}

TEST(LifoPool, ConcurrentAcquireReleaseKeepsCounts) {
  Fixture f;
  const PoolKey key{256, kF32, 0};
  constexpr int kThreads = 4;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) f.pool->release(key, f.pool->acquire(key));
    });
  }
  for (std::thread& t : threads) t.join();
  PoolStats s = f.pool->stats();
  EXPECT_EQ(s.acquires, kThreads * 2000u);
  EXPECT_EQ(s.bytes_in_use, 0u);
  EXPECT_LE(s.allocations, static_cast<uint64_t>(kThreads));
  EXPECT_EQ(key_stats(s, key).held, s.allocations);
}

TEST(LifoPool, HostBackendGivesUsableAlignedMemory) {
  LifoPool pool(make_host_buffer_backend());
  EXPECT_EQ(pool.backend_name(), "host");
  const PoolKey key{1001, kBF16, 0};
  auto* p = static_cast<unsigned char*>(pool.acquire(key));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u);
  std::memset(p, 0xab, key.bytes());
  EXPECT_EQ(p[key.bytes() - 1], 0xab);
  pool.release(key, p);
  EXPECT_EQ(pool.acquire(key), p);
}

}  // namespace
}  // namespace gtron::memory

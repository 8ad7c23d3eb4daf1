// Tests of the ticket cache policy written at the top of memory/weight_cache.h: stable addresses,
// sharing between same-shape non-neighbours, neighbours never sharing (fixed-seed random chains),
// shape and direction isolation, late neighbour declarations, stats and teardown.
#include "memory/weight_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "tests/memory/fake_backend.h"

namespace gtron::memory {
namespace {

constexpr ElemType kF32{0, 4};
constexpr ElemType kBF16{1, 2};
constexpr Direction kFwd = Direction::kForward;
constexpr Direction kBwd = Direction::kBackward;

using testing::FakeBackend;
using testing::FakeState;

struct Fixture {
  std::shared_ptr<FakeState> state = std::make_shared<FakeState>();
  std::unique_ptr<WeightCache> cache =
      std::make_unique<WeightCache>(std::make_unique<FakeBackend>(state));

  void* take(int64_t id, Direction dir, int64_t numel, ElemType dt = kBF16) {
    return cache->buffer(cache->ticket(id, dir, numel, dt));
  }
};

TEST(WeightCache, TicketAddressesAreStable) {
  Fixture f;
  f.cache->declare_chain({0, 1, 2, 3});
  std::map<std::pair<int64_t, Direction>, void*> first;
  for (int64_t id = 0; id < 4; ++id) {
    for (Direction d : {kFwd, kBwd}) first[{id, d}] = f.take(id, d, 1024);
  }
  const int allocs = f.state->allocs;
  std::mt19937 rng(5);
  for (int i = 0; i < 2000; ++i) {
    const auto id = static_cast<int64_t>(rng() % 4);
    const Direction d = rng() % 2 ? kFwd : kBwd;
    Ticket t = f.cache->ticket(id, d, 1024, kBF16);
    ASSERT_TRUE(t.valid());
    ASSERT_EQ(t.weight_id, id);
    ASSERT_EQ(t.direction, d);
    ASSERT_EQ(f.cache->buffer(t), (first[{id, d}]));
    // Unrelated weights arriving later must not move existing tickets.
    if (i % 100 == 0) f.take(1000 + i, d, 1024);
  }
  EXPECT_EQ(f.cache->buffer(f.cache->ticket(2, kFwd, 1024, kBF16)), (first[{2, kFwd}]));
  EXPECT_EQ(f.state->allocs, allocs);  // the extra non-neighbour weights all shared
}

TEST(WeightCache, SameShapeNonNeighboursShare) {
  Fixture f;
  // Chain a(s1) x(s2) c(s1) y(s2) e(s1): same-shape weights are never adjacent.
  f.cache->declare_chain({10, 11, 12, 13, 14});
  void* a = f.take(10, kFwd, 4096);
  void* x = f.take(11, kFwd, 512);
  void* c = f.take(12, kFwd, 4096);
  void* y = f.take(13, kFwd, 512);
  void* e = f.take(14, kFwd, 4096);
  EXPECT_EQ(a, c);
  EXPECT_EQ(c, e);
  EXPECT_EQ(x, y);
  EXPECT_NE(a, x);
  EXPECT_EQ(f.state->allocs, 2);
  // Weights never declared as anyone's neighbour share too.
  EXPECT_EQ(f.take(99, kFwd, 4096), a);
}

TEST(WeightCache, AdjacentSameShapeAlternateBetweenTwoBuffers) {
  Fixture f;
  std::vector<int64_t> chain = {0, 1, 2, 3, 4, 5};
  f.cache->declare_chain(chain);
  std::vector<void*> bufs;
  for (int64_t id : chain) bufs.push_back(f.take(id, kFwd, 256));
  for (size_t i = 0; i < bufs.size(); ++i) EXPECT_EQ(bufs[i], bufs[i % 2]);
  EXPECT_NE(bufs[0], bufs[1]);
  EXPECT_EQ(f.state->allocs, 2);
}

TEST(WeightCache, DifferentShapesNeverShare) {
  Fixture f;
  std::set<void*> seen;
  seen.insert(f.take(1, kFwd, 1000, kF32));
  seen.insert(f.take(2, kFwd, 1001, kF32));            // numel
  seen.insert(f.take(3, kFwd, 1000, kBF16));           // tag and size
  seen.insert(f.take(4, kFwd, 1000, ElemType{9, 4}));  // tag only
  seen.insert(f.take(5, kFwd, 1000, ElemType{0, 8}));  // size only
  EXPECT_EQ(seen.size(), 5u);
  EXPECT_EQ(f.cache->stats().classes, 5u);
  EXPECT_EQ(f.state->live.at(reinterpret_cast<uintptr_t>(f.take(5, kFwd, 1000, ElemType{0, 8}))),
            8000u);
}

TEST(WeightCache, DirectionsAreKeyedSeparately) {
  Fixture f;
  Ticket fwd = f.cache->ticket(7, kFwd, 300, kF32);
  EXPECT_FALSE(f.cache->has_ticket(7, kBwd));
  Ticket bwd = f.cache->ticket(7, kBwd, 300, kF32);
  EXPECT_TRUE(f.cache->has_ticket(7, kFwd));
  EXPECT_TRUE(f.cache->has_ticket(7, kBwd));
  EXPECT_EQ(fwd.direction, kFwd);
  EXPECT_EQ(bwd.direction, kBwd);
  EXPECT_NE(f.cache->buffer(fwd), f.cache->buffer(bwd));
  // Within a direction, a non-neighbour of the same shape shares that direction's buffer.
  EXPECT_EQ(f.take(8, kFwd, 300, kF32), f.cache->buffer(fwd));
  EXPECT_EQ(f.take(8, kBwd, 300, kF32), f.cache->buffer(bwd));
  EXPECT_EQ(f.state->allocs, 2);
  // A ticket of one direction does not name the other direction's buffer.
  Ticket forged{7, kBwd, fwd.slot};
  EXPECT_THROW(f.cache->buffer(forged), std::logic_error);
}

struct Chain {
  std::vector<int64_t> ids;
  std::vector<int64_t> numel;  // per position
};

// 50 weights with ids shuffled (so ids carry no order) and shapes drawn from 3 classes.
Chain random_chain(uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t shapes[] = {4096, 1024, 768};
  Chain c;
  for (int64_t i = 0; i < 50; ++i) c.ids.push_back(100 + 7 * i);
  std::shuffle(c.ids.begin(), c.ids.end(), rng);
  for (size_t i = 0; i < c.ids.size(); ++i) c.numel.push_back(shapes[rng() % 3]);
  return c;
}

// For every adjacent pair in the chain and each direction, the buffers differ; per (direction,
// shape) class at most `max_per_class` buffers; and a class with no adjacent same-shape pair
// holds exactly one buffer.
void check_chain(Fixture& f, const Chain& c, size_t max_per_class) {
  for (Direction d : {kFwd, kBwd}) {
    std::map<int64_t, std::set<void*>> per_class;
    std::set<int64_t> adjacent_same;
    for (size_t i = 0; i < c.ids.size(); ++i) {
      void* b = f.take(c.ids[i], d, c.numel[i]);
      per_class[c.numel[i]].insert(b);
      if (i == 0) continue;
      void* prev = f.take(c.ids[i - 1], d, c.numel[i - 1]);
      ASSERT_NE(b, prev) << "chain positions " << i - 1 << " and " << i << " share ("
                         << direction_name(d) << ")";
      if (c.numel[i] == c.numel[i - 1]) adjacent_same.insert(c.numel[i]);
    }
    for (const auto& [numel, bufs] : per_class) {
      EXPECT_LE(bufs.size(), max_per_class) << "numel " << numel;
      if (adjacent_same.count(numel) == 0) {
        EXPECT_EQ(bufs.size(), 1u) << "numel " << numel;
      }
    }
  }
}

TEST(WeightCache, NeighboursNeverShareInChainOrder) {
  for (uint32_t seed : {1u, 2u, 3u, 4u, 5u}) {
    SCOPED_TRACE(seed);
    Fixture f;
    const Chain c = random_chain(seed);
    f.cache->declare_chain(c.ids);
    // Forward tickets in chain order, backward tickets in reverse, as training takes them.
    for (size_t i = 0; i < c.ids.size(); ++i) f.take(c.ids[i], kFwd, c.numel[i]);
    for (size_t i = c.ids.size(); i-- > 0;) f.take(c.ids[i], kBwd, c.numel[i]);
    check_chain(f, c, 2);
  }
}

TEST(WeightCache, NeighboursNeverShareInRandomOrder) {
  for (uint32_t seed : {11u, 12u, 13u, 14u, 15u}) {
    SCOPED_TRACE(seed);
    Fixture f;
    const Chain c = random_chain(seed);
    f.cache->declare_chain(c.ids);
    std::vector<std::pair<size_t, Direction>> order;
    for (size_t i = 0; i < c.ids.size(); ++i) {
      order.emplace_back(i, kFwd);
      order.emplace_back(i, kBwd);
    }
    std::mt19937 rng(seed);
    std::shuffle(order.begin(), order.end(), rng);
    for (auto [i, d] : order) f.take(c.ids[i], d, c.numel[i]);
    check_chain(f, c, 3);
  }
}

TEST(WeightCache, ChainBuiltDuringTheFirstForward) {
  // The first forward learns the chain as it goes: declare (prev, i), then take i's ticket.
  Fixture f;
  const Chain c = random_chain(21);
  for (size_t i = 0; i < c.ids.size(); ++i) {
    if (i > 0) f.cache->declare_neighbors(c.ids[i - 1], c.ids[i]);
    f.take(c.ids[i], kFwd, c.numel[i]);
  }
  f.cache->declare_chain(c.ids);  // re-declaring the same pairs later is a no-op
  check_chain(f, c, 2);
}

TEST(WeightCache, LateOrInvalidNeighboursAreRejected) {
  Fixture f;
  EXPECT_THROW(f.cache->declare_neighbors(3, 3), std::logic_error);
  f.take(1, kFwd, 64);
  f.take(2, kFwd, 64);  // not neighbours yet: shares with 1
  try {
    f.cache->declare_neighbors(1, 2);
    FAIL() << "a pair declared after both took forward tickets must throw";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("neighbours 1 and 2 declared after both took forward"),
              std::string::npos)
        << e.what();
  }
  // Tickets in different directions only: the pair constrains nothing already assigned.
  f.take(5, kBwd, 64);
  f.cache->declare_neighbors(1, 5);
  EXPECT_NE(f.take(1, kBwd, 64), f.take(5, kBwd, 64));
  EXPECT_NE(f.take(5, kFwd, 64), f.take(1, kFwd, 64));
}

TEST(WeightCache, MismatchedOrForeignTicketsAreRejected) {
  Fixture f;
  Ticket t = f.cache->ticket(4, kFwd, 128, kF32);
  EXPECT_THROW(f.cache->ticket(4, kFwd, 129, kF32), std::logic_error);
  EXPECT_THROW(f.cache->ticket(4, kFwd, 128, kBF16), std::logic_error);
  EXPECT_THROW(f.cache->ticket(5, kFwd, 0, kF32), std::logic_error);
  EXPECT_THROW(f.cache->ticket(5, kFwd, 8, ElemType{0, 0}), std::logic_error);
  EXPECT_THROW(f.cache->buffer(Ticket{}), std::logic_error);
  EXPECT_THROW(f.cache->buffer(Ticket{4, kFwd, t.slot + 1}), std::logic_error);
  EXPECT_THROW(f.cache->buffer(Ticket{6, kFwd, t.slot}), std::logic_error);
  EXPECT_EQ(f.cache->stats().tickets, 1u);
}

TEST(WeightCache, StatsTeardownAndOutOfMemory) {
  Fixture f;
  f.cache->declare_chain({1, 2, 3});
  f.take(1, kFwd, 100, kF32);  // 400 B
  f.take(2, kFwd, 100, kF32);  // neighbour of 1: 400 B more
  f.take(3, kFwd, 100, kF32);  // shares with 1
  f.take(3, kBwd, 50, kBF16);  // the other direction, a class of its own: 100 B
  WeightCacheStats s = f.cache->stats();
  EXPECT_EQ(s.tickets, 4u);
  EXPECT_EQ(s.buffers, 3u);
  EXPECT_EQ(s.bytes, 900u);
  EXPECT_EQ(s.bytes, f.state->total_bytes);
  EXPECT_EQ(s.classes, 2u);

  f.state->limit = f.state->live_bytes + 100;
  try {
    f.take(9, kFwd, 1000, kF32);
    FAIL() << "out of memory must throw";
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("weight cache (fake): out of memory allocating 4000 bytes for the gather "
                       "buffer of weight 9 (forward); the cache already holds 900 bytes in 3"),
              std::string::npos)
        << msg;
  }
  EXPECT_FALSE(f.cache->has_ticket(9, kFwd));
  EXPECT_EQ(f.cache->stats().classes, 2u);  // a failed ticket leaves no trace

  f.cache.reset();
  std::vector<uintptr_t> reversed(f.state->alloc_order.rbegin(), f.state->alloc_order.rend());
  EXPECT_EQ(f.state->free_order, reversed);
  EXPECT_EQ(f.state->live_bytes, 0u);
}

}  // namespace
}  // namespace gtron::memory

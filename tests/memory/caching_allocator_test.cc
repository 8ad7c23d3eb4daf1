// Tests of the caching allocator policy written at the top of memory/caching_allocator.h: size
// classes, best fit, splitting and merging, per-stream reuse, exact stats, the out-of-memory retry
// and message, and private pools. The fixed-seed stress run against an independent model of the
// policy is caching_allocator_stress_test.cc.
#include "memory/caching_allocator.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tests/memory/fake_raw_backend.h"

namespace gtron::memory {
namespace {

using namespace raw_testing;

TEST(CachingAllocator, RoundsTo512AndZeroIsAUniqueBlock) {
  Fixture f;
  void* a = f.alloc.allocate(1);
  EXPECT_EQ(f.alloc.stats().allocated, 512u);
  void* b = f.alloc.allocate(513);
  EXPECT_EQ(f.alloc.stats().allocated, 512u + 1024u);
  void* c = f.alloc.allocate(0);
  void* d = f.alloc.allocate(0);
  EXPECT_EQ(f.alloc.stats().allocated, 512u + 1024u + 512u + 512u);
  EXPECT_NE(c, d);
  // Blocks are carved back to back from one segment: the offsets show the rounded sizes.
  EXPECT_EQ(addr(b) - addr(a), 512u);
  EXPECT_EQ(addr(c) - addr(b), 1024u);
  EXPECT_EQ(addr(d) - addr(c), 512u);
  for (void* p : {a, b, c, d}) f.alloc.deallocate(p);
  EXPECT_EQ(f.alloc.stats().allocated, 0u);
}

TEST(CachingAllocator, CpuBackendBlocksAreAlignedToRound) {
  CachingAllocator alloc(make_cpu_backend());
  EXPECT_EQ(alloc.backend_name(), "cpu");
  std::vector<void*> ptrs;
  for (size_t bytes : {size_t{1}, size_t{700}, 3 * MiB, size_t{100}, 5 * MiB + 3}) {
    ptrs.push_back(alloc.allocate(bytes));
    EXPECT_EQ(addr(ptrs.back()) % kRound, 0u) << bytes << " bytes";
  }
  // The memory is real: write the whole of a large block.
  std::fill_n(static_cast<char*>(ptrs[2]), 3 * MiB, 'x');
  for (void* p : ptrs) alloc.deallocate(p);
  alloc.empty_cache();
  EXPECT_EQ(alloc.stats().reserved, 0u);
}

TEST(CachingAllocator, SmallRequestsShareTwoMiBSegments) {
  Fixture f;
  void* a = f.alloc.allocate(MiB);  // the largest small request
  EXPECT_EQ(f.fake->last_size, 2 * MiB);
  void* b = f.alloc.allocate(MiB);  // the second half of the same segment
  EXPECT_EQ(addr(b), addr(a) + MiB);
  EXPECT_EQ(f.fake->allocs, 1);
  void* c = f.alloc.allocate(4 * KiB);  // the segment is full: a new one
  EXPECT_EQ(f.fake->allocs, 2);
  EXPECT_EQ(f.fake->last_size, 2 * MiB);
  AllocatorStats s = f.alloc.stats();
  EXPECT_EQ(s.reserved, 4 * MiB);
  EXPECT_EQ(s.allocated, 2 * MiB + 4 * KiB);
  EXPECT_EQ(s.misses, 2u);
  for (void* p : {a, b, c}) f.alloc.deallocate(p);
}

TEST(CachingAllocator, LargeRequestsRoundToTwoMiBAndPoolsNeverMix) {
  Fixture f;
  // 1 MiB + 1 rounds to 1 MiB + 512: large, one 2 MiB segment. The tail (1 MiB - 512) is below
  // the large split threshold, so the block keeps the whole segment and counts as allocated.
  void* a = f.alloc.allocate(MiB + 1);
  EXPECT_EQ(f.fake->last_size, 2 * MiB);
  EXPECT_EQ(f.alloc.stats().allocated, 2 * MiB);
  // 5 MiB: a 6 MiB segment; the 1 MiB tail is split off and stays free in the large pool.
  void* b = f.alloc.allocate(5 * MiB);
  EXPECT_EQ(f.fake->last_size, 6 * MiB);
  EXPECT_EQ(f.alloc.stats().allocated, 7 * MiB);
  // 2.5 MiB: a 4 MiB segment, 1.5 MiB tail split off; a 1.25 MiB request then takes that whole
  // tail (its 0.25 MiB remainder is below the split threshold).
  void* c = f.alloc.allocate(2 * MiB + 512 * KiB);
  EXPECT_EQ(f.fake->last_size, 4 * MiB);
  void* d = f.alloc.allocate(MiB + 256 * KiB);
  EXPECT_EQ(addr(d), addr(c) + 2 * MiB + 512 * KiB);
  EXPECT_EQ(f.fake->allocs, 3);
  // A free large block is never used for a small request, nor a free small block for a large one.
  f.alloc.deallocate(a);
  void* e = f.alloc.allocate(4 * KiB);
  EXPECT_EQ(f.fake->allocs, 4);
  EXPECT_EQ(f.fake->last_size, 2 * MiB);
  EXPECT_EQ(addr(e), f.fake->last_ptr);
  f.alloc.deallocate(e);
  void* g = f.alloc.allocate(MiB + 512);  // reuses a's large block, not e's free small segment
  EXPECT_EQ(g, a);
  EXPECT_EQ(f.fake->allocs, 4);
  AllocatorStats s = f.alloc.stats();
  EXPECT_EQ(s.reserved, 2 * MiB + 6 * MiB + 4 * MiB + 2 * MiB);
  EXPECT_EQ(s.allocated, 2 * MiB + 5 * MiB + (2 * MiB + 512 * KiB) + (MiB + 512 * KiB));
  for (void* p : {b, c, d, g}) f.alloc.deallocate(p);
}

TEST(CachingAllocator, BestFitTakesTheSmallestAdequateFreeBlock) {
  Fixture f;
  // Free holes of 64, 16 and 32 KiB, kept apart by live separators, then the segment's tail.
  void* h64 = f.alloc.allocate(64 * KiB);
  void* s1 = f.alloc.allocate(KiB);
  void* h16 = f.alloc.allocate(16 * KiB);
  void* s2 = f.alloc.allocate(KiB);
  void* h32 = f.alloc.allocate(32 * KiB);
  void* s3 = f.alloc.allocate(KiB);
  for (void* p : {h64, h16, h32}) f.alloc.deallocate(p);
  uint64_t misses = f.alloc.stats().misses;

  EXPECT_EQ(f.alloc.allocate(20 * KiB), h32);         // 16 is too small; 32 beats 64 and the tail
  void* rest32 = static_cast<char*>(h32) + 20 * KiB;  // the 12 KiB split remainder
  EXPECT_EQ(f.alloc.allocate(12 * KiB), rest32);      // an exact fit
  EXPECT_EQ(f.alloc.allocate(16 * KiB), h16);
  EXPECT_EQ(f.alloc.allocate(40 * KiB), h64);
  EXPECT_EQ(f.alloc.stats().misses, misses);
  for (void* p : {s1, s2, s3}) f.alloc.deallocate(p);
}

TEST(CachingAllocator, AdjacentFreeBlocksMergeAndServeALargerRequest) {
  Fixture f;
  void* a = f.alloc.allocate(256 * KiB);
  void* b = f.alloc.allocate(256 * KiB);
  void* c = f.alloc.allocate(256 * KiB);  // keeps a+b apart from the segment's free tail
  EXPECT_EQ(addr(b), addr(a) + 256 * KiB);
  f.alloc.deallocate(a);
  f.alloc.deallocate(b);
  uint64_t misses = f.alloc.stats().misses;
  // 512 KiB fits only the merged a+b (the tail is 1.25 MiB, a worse fit).
  void* ab = f.alloc.allocate(512 * KiB);
  EXPECT_EQ(ab, a);
  EXPECT_EQ(f.alloc.stats().misses, misses);
  // Freeing everything merges the segment back into one block: a 2 MiB-segment-sized request
  // (the largest small one, twice) fits without a miss.
  f.alloc.deallocate(ab);
  f.alloc.deallocate(c);
  void* x = f.alloc.allocate(MiB);
  void* y = f.alloc.allocate(MiB);
  EXPECT_EQ(x, a);
  EXPECT_EQ(addr(y), addr(a) + MiB);
  EXPECT_EQ(f.alloc.stats().misses, misses);
  f.alloc.deallocate(y);  // merges with nothing on the right, then x merges with y
  f.alloc.deallocate(x);
  f.alloc.empty_cache();
  EXPECT_EQ(f.fake->frees, 1);  // one whole segment again
  EXPECT_EQ(f.alloc.stats().reserved, 0u);
}

TEST(CachingAllocator, BlocksFreedOnOneStreamAreNotReusedByAnother) {
  Fixture f;
  void* a = f.alloc.allocate(64 * KiB, /*stream=*/1);
  f.alloc.deallocate(a);
  void* b = f.alloc.allocate(64 * KiB, /*stream=*/2);
  EXPECT_EQ(f.alloc.stats().misses, 2u);  // stream 2 had nothing cached
  EXPECT_NE(b, a);
  // Stream 2's segment is not stream 1's: b is at the start of a second segment.
  EXPECT_EQ(addr(b), f.fake->last_ptr);
  void* c = f.alloc.allocate(64 * KiB, /*stream=*/1);
  EXPECT_EQ(c, a);
  EXPECT_EQ(f.alloc.stats().misses, 2u);
  f.alloc.deallocate(b);
  f.alloc.deallocate(c);
}

TEST(CachingAllocator, ReleasedPrivatePoolFreesIdleSegmentsAndHandsTheRestToAStream) {
  // A graph's private pool is a stream key of its own: eager work (stream 1) never reuses its
  // blocks; releasing it frees its idle segments and moves the busy one's blocks to stream 1.
  Fixture f;
  const uintptr_t pool = 0xabc0;
  void* idle = f.alloc.allocate(3 * MiB, pool);   // its own large segment
  void* kept = f.alloc.allocate(64 * KiB, pool);  // a small segment, stays live
  f.alloc.deallocate(idle);
  void* eager = f.alloc.allocate(3 * MiB, /*stream=*/1);
  EXPECT_NE(eager, idle);
  EXPECT_EQ(f.alloc.stats().misses, 3u);
  f.alloc.deallocate(eager);
  const size_t reserved = f.alloc.stats().reserved;
  f.alloc.release_pool(pool, /*stream=*/1);
  EXPECT_EQ(f.alloc.stats().reserved, reserved - 4 * MiB);  // the idle segment went back
  EXPECT_EQ(f.fake->frees, 1);
  // The small segment now belongs to stream 1: its free remainder serves stream 1 at no miss.
  void* s1 = f.alloc.allocate(64 * KiB, /*stream=*/1);
  EXPECT_EQ(f.alloc.stats().misses, 3u);
  EXPECT_EQ(addr(s1), addr(kept) + 64 * KiB);
  f.alloc.deallocate(kept);
  f.alloc.deallocate(s1);
  void* again = f.alloc.allocate(128 * KiB, /*stream=*/1);
  EXPECT_EQ(again, kept);  // merged back into one free block of stream 1
  f.alloc.deallocate(again);
}

TEST(CachingAllocator, StatsAddUpExactly) {
  Fixture f;
  void* a = f.alloc.allocate(100 * KiB);  // miss: small segment
  void* b = f.alloc.allocate(3 * MiB);    // miss: 4 MiB large segment (1 MiB tail split)
  AllocatorStats s = f.alloc.stats();
  EXPECT_EQ(s.requests, 2u);
  EXPECT_EQ(s.misses, 2u);
  EXPECT_EQ(s.allocated, 100 * KiB + 3 * MiB);
  EXPECT_EQ(s.reserved, 2 * MiB + 4 * MiB);
  EXPECT_EQ(s.peak_allocated, s.allocated);
  EXPECT_EQ(s.peak_reserved, s.reserved);

  f.alloc.deallocate(b);
  void* c = f.alloc.allocate(10 * KiB);  // hit in a's segment
  s = f.alloc.stats();
  EXPECT_EQ(s.requests, 3u);
  EXPECT_EQ(s.misses, 2u);
  EXPECT_EQ(s.allocated, 110 * KiB);
  EXPECT_EQ(s.peak_allocated, 100 * KiB + 3 * MiB);
  EXPECT_EQ(s.reserved, 6 * MiB);

  f.alloc.empty_cache();  // the large segment is unused now
  s = f.alloc.stats();
  EXPECT_EQ(s.reserved, 2 * MiB);
  EXPECT_EQ(s.peak_reserved, 6 * MiB);
  EXPECT_EQ(f.fake->live_bytes, s.reserved);

  f.alloc.reset_peak();
  s = f.alloc.stats();
  EXPECT_EQ(s.peak_allocated, 110 * KiB);
  EXPECT_EQ(s.peak_reserved, 2 * MiB);
  f.alloc.deallocate(a);
  f.alloc.deallocate(c);
  s = f.alloc.stats();
  EXPECT_EQ(s.allocated, 0u);
  EXPECT_EQ(s.peak_allocated, 110 * KiB);
}

// Note [allocation kinds]: live bytes per kind follow allocate/deallocate, the innermost scope
// wins, and the peak's split is the one at the moment of the peak.
TEST(CachingAllocator, PeakSplitsByAllocationKind) {
  Fixture f;
  const auto kind = [](AllocKind k) { return static_cast<int>(k); };
  void* w;
  void* x;
  void* y;
  {
    AllocKindScope weights(AllocKind::kWeights);
    w = f.alloc.allocate(3 * MiB);
    AllocKindScope forward(AllocKind::kForward);
    x = f.alloc.allocate(5 * MiB);
  }
  EXPECT_EQ(current_alloc_kind(), AllocKind::kOther);
  y = f.alloc.allocate(1 * MiB);  // other
  AllocatorStats s = f.alloc.stats();
  EXPECT_EQ(s.allocated_by_kind[kind(AllocKind::kWeights)], 3 * MiB);
  EXPECT_EQ(s.allocated_by_kind[kind(AllocKind::kForward)], 5 * MiB);
  EXPECT_EQ(s.allocated_by_kind[kind(AllocKind::kOther)], 1 * MiB);
  f.alloc.deallocate(x);  // the peak (9 MiB) stays split as it was
  {
    AllocKindScope backward(AllocKind::kBackward);
    x = f.alloc.allocate(2 * MiB);
  }
  s = f.alloc.stats();
  EXPECT_EQ(s.peak_allocated, 9 * MiB);
  EXPECT_EQ(s.peak_by_kind[kind(AllocKind::kForward)], 5 * MiB);
  EXPECT_EQ(s.peak_by_kind[kind(AllocKind::kBackward)], 0u);
  EXPECT_EQ(s.allocated_by_kind[kind(AllocKind::kForward)], 0u);
  EXPECT_EQ(s.allocated_by_kind[kind(AllocKind::kBackward)], 2 * MiB);
  size_t sum = 0;
  for (size_t b : s.peak_by_kind) sum += b;
  EXPECT_EQ(sum, s.peak_allocated);
  f.alloc.reset_peak();  // the split restarts from what is live
  s = f.alloc.stats();
  EXPECT_EQ(s.peak_by_kind[kind(AllocKind::kBackward)], 2 * MiB);
  EXPECT_EQ(s.peak_by_kind[kind(AllocKind::kForward)], 0u);
  EXPECT_STREQ(alloc_kind_name(AllocKind::kCommunication), "communication");
  for (void* p : {w, x, y}) f.alloc.deallocate(p);
  s = f.alloc.stats();
  for (size_t b : s.allocated_by_kind) EXPECT_EQ(b, 0u);
}

TEST(CachingAllocator, SteadyStateStepsMakeNoMisses) {
  Fixture f;
  // One "training step": activations allocated in forward order, some freed early, the rest in
  // reverse order in backward, with gradient buffers in between; on two streams.
  const std::vector<size_t> sizes = {3 * KiB, 700 * KiB, 5 * MiB, 48 * KiB, 1536 * KiB,
                                     200,     MiB,       9 * MiB, 33 * KiB};
  std::vector<uintptr_t> first_addresses;
  auto step = [&](std::vector<uintptr_t>* addresses) {
    std::vector<void*> acts;
    for (size_t i = 0; i < sizes.size(); ++i) {
      acts.push_back(f.alloc.allocate(sizes[i], i % 3 == 0 ? 2 : 1));
      addresses->push_back(addr(acts.back()));
      if (i % 4 == 1) {  // a temporary
        void* t = f.alloc.allocate(sizes[i] / 2 + 1, 1);
        addresses->push_back(addr(t));
        f.alloc.deallocate(t);
      }
    }
    for (size_t i = acts.size(); i-- > 0;) {
      void* g = f.alloc.allocate(sizes[i], 1);
      addresses->push_back(addr(g));
      f.alloc.deallocate(acts[i]);
      f.alloc.deallocate(g);
    }
  };
  for (int warmup = 0; warmup < 2; ++warmup) {
    first_addresses.clear();
    step(&first_addresses);
  }
  AllocatorStats warm = f.alloc.stats();
  for (int i = 0; i < 20; ++i) {
    std::vector<uintptr_t> addresses;
    step(&addresses);
    EXPECT_EQ(addresses, first_addresses) << "step " << i;
  }
  AllocatorStats s = f.alloc.stats();
  EXPECT_EQ(s.misses, warm.misses);
  EXPECT_EQ(s.reserved, warm.reserved);
  EXPECT_EQ(s.requests, warm.requests + 20 * (warm.requests / 2));
  EXPECT_EQ(s.allocated, 0u);
}

TEST(CachingAllocator, EmptyCacheReturnsOnlyUnusedSegments) {
  Fixture f;
  void* a = f.alloc.allocate(KiB, 1);      // segment 1 (small, stream 1): stays in use
  void* b = f.alloc.allocate(KiB, 2);      // segment 2 (small, stream 2): freed
  void* c = f.alloc.allocate(3 * MiB, 1);  // segment 3 (large): freed
  void* d = f.alloc.allocate(8 * MiB, 1);  // segment 4 (large): stays in use
  f.alloc.deallocate(b);
  f.alloc.deallocate(c);
  EXPECT_EQ(f.alloc.stats().reserved, 2 * MiB + 2 * MiB + 4 * MiB + 8 * MiB);
  f.alloc.empty_cache();
  EXPECT_EQ(f.fake->frees, 2);
  EXPECT_EQ(f.alloc.stats().reserved, 2 * MiB + 8 * MiB);
  EXPECT_EQ(f.fake->live_bytes, 10 * MiB);
  EXPECT_EQ(f.fake->live.count(addr(a)), 1u);
  EXPECT_EQ(f.fake->live.count(addr(d)), 1u);
  // After the release a request on stream 2 is a miss again.
  void* e = f.alloc.allocate(KiB, 2);
  EXPECT_EQ(f.fake->allocs, 5);
  for (void* p : {a, d, e}) f.alloc.deallocate(p);
  f.alloc.empty_cache();
  EXPECT_EQ(f.fake->live_bytes, 0u);
  EXPECT_EQ(f.alloc.stats().reserved, 0u);
}

TEST(CachingAllocator, OutOfMemoryReleasesCachedSegmentsAndRetries) {
  Fixture f;
  f.fake->limit = 10 * MiB;
  void* live = f.alloc.allocate(3 * MiB, 2);  // 4 MiB segment, stays live
  void* s1 = f.alloc.allocate(KiB, 1);        // two cached small segments, both freed
  void* s2 = f.alloc.allocate(KiB, 2);
  void* big = f.alloc.allocate(MiB + KiB, 1);  // a cached 2 MiB large segment
  for (void* p : {s1, s2, big}) f.alloc.deallocate(p);
  EXPECT_EQ(f.fake->live_bytes, 10 * MiB);

  // 5 MiB needs a 6 MiB segment: the backend refuses, the allocator returns the 6 MiB of unused
  // segments (of every stream and pool) and the retry succeeds.
  void* x = f.alloc.allocate(5 * MiB, 1);
  EXPECT_EQ(f.fake->failures, 1);
  EXPECT_EQ(f.fake->frees, 3);
  EXPECT_EQ(addr(x), f.fake->last_ptr);
  AllocatorStats s = f.alloc.stats();
  EXPECT_EQ(s.reserved, 10 * MiB);
  EXPECT_EQ(s.allocated, 3 * MiB + 5 * MiB);
  EXPECT_EQ(s.misses, 5u);
  EXPECT_EQ(f.fake->live_bytes, s.reserved);
  f.alloc.deallocate(x);
  f.alloc.deallocate(live);
}

TEST(CachingAllocator, OutOfMemoryRetryAndEmptyCacheSpareKeptPrivatePools) {
  // Note [private pools keep their segments]: a captured graph replays into the free blocks of its
  // pool, so neither the out-of-memory retry nor empty_cache returns them until release_pool.
  Fixture f;
  f.fake->limit = 10 * MiB;
  const uintptr_t pool = 0xabc0;
  f.alloc.keep_pool(pool);
  void* graph_tmp = f.alloc.allocate(3 * MiB, pool);  // a 4 MiB segment of the pool, then freed
  void* eager = f.alloc.allocate(3 * MiB, 1);         // a 4 MiB eager segment, then freed
  f.alloc.deallocate(graph_tmp);
  f.alloc.deallocate(eager);
  // 5 MiB needs a 6 MiB segment: only the eager segment may go back; 6 of 10 MiB then fit.
  void* x = f.alloc.allocate(5 * MiB, 1);
  EXPECT_EQ(f.fake->failures, 1);
  EXPECT_EQ(f.fake->frees, 1);
  EXPECT_EQ(f.fake->live.count(addr(graph_tmp)), 1u);
  EXPECT_EQ(f.fake->live.count(addr(eager)), 0u);
  f.alloc.deallocate(x);
  f.alloc.empty_cache();  // x's segment goes; the pool's stays
  EXPECT_EQ(f.fake->frees, 2);
  EXPECT_EQ(f.alloc.stats().reserved, 4 * MiB);
  // Past the limit with only the kept segment cached: out of memory, the segment still held.
  EXPECT_THROW(f.alloc.allocate(7 * MiB, 1), std::runtime_error);
  EXPECT_EQ(f.fake->live.count(addr(graph_tmp)), 1u);
  f.alloc.release_pool(pool, 1);  // the pool ends: its idle segment goes back
  EXPECT_EQ(f.fake->frees, 3);
  EXPECT_EQ(f.alloc.stats().reserved, 0u);
}

TEST(CachingAllocator, OutOfMemoryMessageSaysWhereTheMemoryIs) {
  Fixture f;
  f.fake->limit = 8 * MiB;
  void* live = f.alloc.allocate(3 * MiB);  // 4 MiB segment: 3 MiB live, 1 MiB free tail (cached)
  void* small = f.alloc.allocate(KiB);     // 2 MiB small segment, mostly free (cached)
  // 3 MiB needs 4 MiB; 2 MiB are left and no segment is wholly unused, so the retry fails too.
  try {
    f.alloc.allocate(3 * MiB);
    FAIL() << "expected an out-of-memory error";
  } catch (const std::runtime_error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("fake-gpu:7"), std::string::npos) << msg;
    EXPECT_NE(msg.find("asked for 3.000 MiB (3145728 bytes)"), std::string::npos) << msg;
    // allocated = 3 MiB + 1 KiB; cached = 6 MiB reserved - allocated.
    EXPECT_NE(msg.find("(3146752 bytes) allocated"), std::string::npos) << msg;
    EXPECT_NE(msg.find("(3144704 bytes) cached"), std::string::npos) << msg;
    EXPECT_NE(msg.find("(6291456 bytes) reserved"), std::string::npos) << msg;
  }
  EXPECT_EQ(f.fake->failures, 2);  // the first try and the retry
  EXPECT_EQ(f.fake->frees, 0);     // nothing was unused
  AllocatorStats s = f.alloc.stats();
  EXPECT_EQ(s.requests, 3u);
  EXPECT_EQ(s.misses, 3u);  // the failed call went to the backend too
  EXPECT_EQ(s.reserved, 6 * MiB);
  EXPECT_EQ(s.allocated, 3 * MiB + KiB);
  // The allocator still works after the error, and freeing makes room.
  f.alloc.deallocate(live);
  void* again = f.alloc.allocate(3 * MiB);
  EXPECT_EQ(again, live);
  f.alloc.deallocate(again);
  f.alloc.deallocate(small);
}

TEST(CachingAllocator, HugeRequestsAreOutOfMemoryNotATinyBlock) {
  Fixture f;
  f.fake->limit = size_t{1} << 30;
  // Rounding SIZE_MAX up to 512 would wrap to 0; the request must fail, not succeed.
  for (size_t bytes : {std::numeric_limits<size_t>::max(), std::numeric_limits<size_t>::max() - 100,
                       std::numeric_limits<size_t>::max() / 2}) {
    EXPECT_THROW(f.alloc.allocate(bytes), std::runtime_error) << bytes;
  }
  EXPECT_EQ(f.alloc.stats().allocated, 0u);
  EXPECT_EQ(f.alloc.stats().reserved, 0u);
}

TEST(CachingAllocator, FreeOfUnknownPointerIsAnErrorAndNullIsANoOp) {
  Fixture f;
  f.alloc.deallocate(nullptr);
  void* a = f.alloc.allocate(KiB);
  EXPECT_THROW(f.alloc.deallocate(static_cast<char*>(a) + 512), std::logic_error);
  f.alloc.deallocate(a);
  EXPECT_THROW(f.alloc.deallocate(a), std::logic_error);  // double free
}

TEST(CachingAllocator, ConcurrentUseKeepsAccountsExact) {
  Fixture f;
  std::atomic<uint64_t> allocations{0};
  auto worker = [&](uintptr_t stream, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<void*> live;
    for (int i = 0; i < 2000; ++i) {
      if (live.size() < 4 || (live.size() < 32 && rng() % 2 == 0)) {
        live.push_back(f.alloc.allocate(rng() % (64 * KiB), stream));
        allocations++;
      } else {
        size_t k = rng() % live.size();
        f.alloc.deallocate(live[k]);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
      }
    }
    for (void* p : live) f.alloc.deallocate(p);
  };
  std::thread t1(worker, 1, 11);
  std::thread t2(worker, 2, 22);
  t1.join();
  t2.join();
  AllocatorStats s = f.alloc.stats();
  EXPECT_EQ(s.allocated, 0u);
  EXPECT_EQ(s.requests, allocations.load());
  EXPECT_EQ(f.fake->live_bytes, s.reserved);
  f.alloc.empty_cache();
  EXPECT_EQ(f.fake->live_bytes, 0u);
}

}  // namespace
}  // namespace gtron::memory

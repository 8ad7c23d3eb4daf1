// Tests of memory/symmetric_pool.h: buffers are registered as they are allocated, in an order that
// depends only on the acquire/release sequence (two "ranks" fed the same sequence register the
// same sizes in the same order), deregistered in reverse before they are freed, and a failed
// registration leaves the pool unchanged.
#include "memory/symmetric_pool.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace gtron::memory {
namespace {

constexpr ElemType kF32{0, 4};
constexpr ElemType kBF16{1, 2};

// One backend call, as a "rank" would issue it to the communicator.
struct Event {
  std::string op;  // "alloc", "register", "deregister", "free"
  size_t bytes;    // for alloc/register; 0 otherwise
  int window;      // window id for register/deregister (ids count from 1 per backend); 0 otherwise
  uintptr_t ptr;   // for alloc/register/free

  bool operator==(const Event& o) const {
    return op == o.op && bytes == o.bytes && window == o.window;  // addresses differ per rank
  }
};

struct FakeState {
  std::vector<Event> log;
  std::map<int, uintptr_t> open_windows;  // window id -> registered address
  std::map<uintptr_t, size_t> live;       // allocated address -> bytes
  int fail_register_at = -1;              // register call number (from 1) that throws
  int registers = 0;
  uintptr_t next;
};

// Registration that records the order of every call; window handles are small integer ids.
class RecordingBackend : public SymmetricBackend {
 public:
  RecordingBackend(std::shared_ptr<FakeState> s, uintptr_t base) : s_(std::move(s)) {
    s_->next = base;
  }
  void* allocate(size_t bytes) override {
    uintptr_t p = s_->next;
    s_->next += bytes + 4096;
    s_->live[p] = bytes;
    s_->log.push_back({"alloc", bytes, 0, p});
    return reinterpret_cast<void*>(p);
  }
  WindowHandle register_window(void* ptr, size_t bytes) override {
    const int id = ++s_->registers;
    if (id == s_->fail_register_at) throw std::runtime_error("fake register failure");
    auto p = reinterpret_cast<uintptr_t>(ptr);
    s_->open_windows[id] = p;
    s_->log.push_back({"register", bytes, id, p});
    return reinterpret_cast<WindowHandle>(static_cast<uintptr_t>(id));
  }
  void deregister_window(WindowHandle window) noexcept override {
    const int id = static_cast<int>(reinterpret_cast<uintptr_t>(window));
    s_->log.push_back({"deregister", 0, id, s_->open_windows[id]});
    s_->open_windows.erase(id);
  }
  void free(void* ptr) noexcept override {
    auto p = reinterpret_cast<uintptr_t>(ptr);
    s_->live.erase(p);
    s_->log.push_back({"free", 0, 0, p});
  }
  std::string name() const override { return "recording"; }

 private:
  std::shared_ptr<FakeState> s_;
};

std::vector<Event> only(const std::vector<Event>& log, const std::string& op) {
  std::vector<Event> out;
  for (const Event& e : log) {
    if (e.op == op) out.push_back(e);
  }
  return out;
}

// A fixed-seed acquire/release program over a few keys, as every GTP rank would run it.
void run_program(SymmetricPool& pool, uint32_t seed) {
  std::mt19937 rng(seed);
  const std::vector<PoolKey> keys = {{1000, kF32, 0}, {1000, kBF16, 0}, {333, kF32, 0}};
  std::vector<std::pair<PoolKey, void*>> lent;
  for (int step = 0; step < 600; ++step) {
    if (lent.empty() || rng() % 5 < 3) {
      const PoolKey& k = keys[rng() % keys.size()];
      lent.emplace_back(k, pool.acquire(k));
    } else {
      const size_t i = rng() % lent.size();
      pool.release(lent[i].first, lent[i].second);
      lent.erase(lent.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }
  for (auto& [k, p] : lent) pool.release(k, p);
}

TEST(SymmetricPool, RanksFedTheSameSequenceRegisterIdentically) {
  auto rank0 = std::make_shared<FakeState>();
  auto rank1 = std::make_shared<FakeState>();
  {
    // Different base addresses: registration order must not depend on addresses.
    SymmetricPool pool0(std::make_unique<RecordingBackend>(rank0, uintptr_t{1} << 40));
    SymmetricPool pool1(std::make_unique<RecordingBackend>(rank1, uintptr_t{3} << 41));
    run_program(pool0, 77);
    run_program(pool1, 77);
    EXPECT_EQ(pool0.stats().bytes_held, pool1.stats().bytes_held);
    EXPECT_GT(rank0->registers, 3);
  }
  ASSERT_EQ(rank0->log.size(), rank1->log.size());
  EXPECT_EQ(rank0->log, rank1->log);  // ops, sizes and window ids, in the same order
  EXPECT_EQ(only(rank0->log, "register").size(), only(rank0->log, "deregister").size());
  EXPECT_TRUE(rank0->open_windows.empty());
  EXPECT_TRUE(rank0->live.empty());
}

TEST(SymmetricPool, DeregistersInReverseBeforeFreeing) {
  auto s = std::make_shared<FakeState>();
  {
    SymmetricPool pool(std::make_unique<RecordingBackend>(s, uintptr_t{1} << 40));
    const PoolKey a{100, kF32, 0};
    const PoolKey b{50, kBF16, 1};
    void* a1 = pool.acquire(a);
    void* b1 = pool.acquire(b);
    void* a2 = pool.acquire(a);
    pool.release(a, a1);
    pool.release(b, b1);
    EXPECT_EQ(pool.acquire(a), a1);  // LIFO over registered memory: no new registration
    pool.release(a, a1);
    pool.release(a, a2);
    EXPECT_EQ(s->registers, 3);
    EXPECT_EQ(only(s->log, "deregister").size(), 0u);  // never shrinks
  }
  const std::vector<Event> regs = only(s->log, "register");
  ASSERT_EQ(regs.size(), 3u);
  EXPECT_EQ(regs[0].bytes, 400u);
  EXPECT_EQ(regs[1].bytes, 100u);
  EXPECT_EQ(regs[2].bytes, 400u);
  // Teardown: for each buffer, newest first, deregister then free.
  std::vector<Event> tail(s->log.end() - 6, s->log.end());
  for (int i = 0; i < 3; ++i) {
    const Event& reg = regs[static_cast<size_t>(2 - i)];
    EXPECT_EQ(tail[2 * i].op, "deregister");
    EXPECT_EQ(tail[2 * i].window, reg.window);
    EXPECT_EQ(tail[2 * i].ptr, reg.ptr);
    EXPECT_EQ(tail[2 * i + 1].op, "free");
    EXPECT_EQ(tail[2 * i + 1].ptr, reg.ptr);
  }
  EXPECT_TRUE(s->live.empty());
}

TEST(SymmetricPool, WindowIsKeptAlongsideEachBuffer) {
  auto s = std::make_shared<FakeState>();
  SymmetricPool pool(std::make_unique<RecordingBackend>(s, uintptr_t{1} << 40));
  const PoolKey k{64, kF32, 0};
  void* p = pool.acquire(k);
  void* q = pool.acquire(k);
  EXPECT_EQ(pool.window(p), reinterpret_cast<WindowHandle>(uintptr_t{1}));
  EXPECT_EQ(pool.window(q), reinterpret_cast<WindowHandle>(uintptr_t{2}));
  pool.release(k, p);
  EXPECT_EQ(pool.window(p), reinterpret_cast<WindowHandle>(uintptr_t{1}));  // free, still owned
  int local = 0;
  EXPECT_THROW(pool.window(&local), std::logic_error);
  pool.release(k, q);
}

TEST(SymmetricPool, FailedRegistrationFreesTheMemoryAndChangesNothing) {
  auto s = std::make_shared<FakeState>();
  s->fail_register_at = 2;
  SymmetricPool pool(std::make_unique<RecordingBackend>(s, uintptr_t{1} << 40));
  const PoolKey k{10, kF32, 0};
  void* p = pool.acquire(k);
  EXPECT_THROW(pool.acquire(k), std::runtime_error);
  EXPECT_EQ(s->live.size(), 1u);  // the second allocation went back
  PoolStats st = pool.stats();
  EXPECT_EQ(st.allocations, 1u);
  EXPECT_EQ(st.bytes_held, 40u);
  EXPECT_EQ(st.bytes_in_use, 40u);
  void* q = pool.acquire(k);  // the third register call succeeds
  EXPECT_NE(q, p);
  EXPECT_EQ(pool.stats().allocations, 2u);
  pool.release(k, p);
  pool.release(k, q);
}

TEST(SymmetricPool, SharesTheLifoContracts) {
  auto s = std::make_shared<FakeState>();
  SymmetricPool pool(std::make_unique<RecordingBackend>(s, uintptr_t{1} << 40));
  EXPECT_EQ(pool.backend_name(), "recording");
  const PoolKey k{8, kBF16, 5};
  EXPECT_FALSE(pool.has_free(k));
  void* p = pool.acquire(k);
  pool.release(k, p);
  EXPECT_TRUE(pool.has_free(k));
  EXPECT_THROW(pool.release(k, p), std::logic_error);
  pool.set_capturing(true);
  EXPECT_TRUE(pool.capturing());
  void* q = pool.acquire(k);
  EXPECT_EQ(q, p);
  EXPECT_THROW(pool.acquire(k), std::logic_error);
  EXPECT_EQ(s->registers, 1);
  pool.set_capturing(false);
  pool.release(k, q);
}

TEST(SymmetricPool, PlainBackendIsUsableHostMemory) {
  SymmetricPool pool(make_plain_symmetric_backend());
  const PoolKey k{777, kF32, 0};
  auto* p = static_cast<float*>(pool.acquire(k));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u);
  for (int i = 0; i < 777; ++i) p[i] = static_cast<float>(i);
  EXPECT_EQ(p[776], 776.0f);
  EXPECT_EQ(pool.window(p), nullptr);
  pool.release(k, p);
  EXPECT_EQ(pool.acquire(k), p);
  pool.release(k, p);
}

}  // namespace
}  // namespace gtron::memory

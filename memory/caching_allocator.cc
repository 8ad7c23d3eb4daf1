#include "memory/caching_allocator.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <limits>
#include <stdexcept>
#include <vector>

namespace gtron::memory {

namespace {
thread_local AllocKind t_kind = AllocKind::kOther;
}  // namespace

const char* alloc_kind_name(AllocKind kind) {
  static const char* const names[kAllocKinds] = {"other",         "weights",   "gradients",
                                                 "optimizer",     "forward",   "backward",
                                                 "communication", "checkpoint"};
  return names[static_cast<int>(kind)];
}

AllocKind current_alloc_kind() { return t_kind; }

AllocKindScope::AllocKindScope(AllocKind kind) : prev_(t_kind) { t_kind = kind; }
AllocKindScope::~AllocKindScope() { t_kind = prev_; }

struct CachingAllocator::Block {
  char* ptr;
  size_t size;
  uintptr_t stream;
  bool small;
  bool free = true;
  uint8_t kind = 0;       // AllocKind of the live block
  Block* prev = nullptr;  // neighbours inside one segment
  Block* next = nullptr;
};

bool CachingAllocator::BySize::operator()(const Block* a, const Block* b) const {
  if (a->size != b->size) return a->size < b->size;
  return a->ptr < b->ptr;
}

namespace {

class CpuBackend : public RawBackend {
 public:
  // Aligned to kRound so that every block (segment base + a multiple of kRound) is too. Segment
  // sizes are multiples of kSegment, as aligned_alloc requires.
  void* raw_alloc(size_t bytes) override {
    return std::aligned_alloc(CachingAllocator::kRound, bytes);
  }
  void raw_free(void* ptr) override { std::free(ptr); }
  std::string name() const override { return "cpu"; }
};

// "1.500 MiB (1572864 bytes)": a readable unit plus the exact count (small test limits and
// off-by-a-segment questions need the exact number).
std::string format_bytes(size_t bytes) {
  const char* unit = "GiB";
  double scale = static_cast<double>(size_t{1} << 30);
  if (bytes < (size_t{1} << 20)) {
    unit = "KiB";
    scale = 1024.0;
  } else if (bytes < (size_t{1} << 30)) {
    unit = "MiB";
    scale = static_cast<double>(size_t{1} << 20);
  }
  char buf[80];
  std::snprintf(buf, sizeof buf, "%.3f %s (%zu bytes)", static_cast<double>(bytes) / scale, unit,
                bytes);
  return buf;
}

// Largest request whose rounding to kRound and to kSegment cannot overflow size_t.
constexpr size_t kMaxRequest = std::numeric_limits<size_t>::max() - CachingAllocator::kSegment;

}  // namespace

std::unique_ptr<RawBackend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

CachingAllocator::CachingAllocator(std::unique_ptr<RawBackend> backend)
    : backend_(std::move(backend)) {}

CachingAllocator::~CachingAllocator() {
  // Live blocks at destruction are leaked on purpose (static teardown order); free segments go
  // back.
  release_unused_segments();
}

size_t CachingAllocator::round_size(size_t bytes) {
  if (bytes == 0) bytes = 1;
  return (bytes + kRound - 1) / kRound * kRound;
}

CachingAllocator::FreeSet& CachingAllocator::free_set(uintptr_t stream, bool small) {
  return free_[{stream, small}];
}

CachingAllocator::Block* CachingAllocator::find_free(FreeSet& set, size_t size, uintptr_t stream) {
  Block key{nullptr, size, stream, false};
  auto it = set.lower_bound(&key);
  if (it == set.end()) return nullptr;
  Block* b = *it;
  set.erase(it);
  return b;
}

CachingAllocator::Block* CachingAllocator::new_segment(size_t size, uintptr_t stream, bool small) {
  size_t seg = small ? kSegment : (size + kSegment - 1) / kSegment * kSegment;
  stats_.misses++;  // this request goes to the backend, whether or not the backend can serve it
  void* p = backend_->raw_alloc(seg);
  if (p == nullptr) {
    release_unused_segments();
    p = backend_->raw_alloc(seg);
    if (p == nullptr) return nullptr;
  }
  stats_.reserved += seg;
  if (stats_.reserved > stats_.peak_reserved) stats_.peak_reserved = stats_.reserved;
  Block* b = new Block{static_cast<char*>(p), seg, stream, small};
  segments_.insert(b);
  return b;
}

void* CachingAllocator::allocate(size_t bytes, uintptr_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.requests++;
  // A request near SIZE_MAX would wrap around in the rounding below and come back as a tiny block.
  if (bytes > kMaxRequest) throw std::runtime_error(oom_message(bytes));
  size_t size = round_size(bytes);
  bool small = size <= kSmallSize;
  FreeSet& set = free_set(stream, small);
  Block* b = find_free(set, size, stream);
  if (b == nullptr) b = new_segment(size, stream, small);
  if (b == nullptr) throw std::runtime_error(oom_message(size));
  size_t min_split = small ? kRound : kSmallSize;
  if (b->size - size >= min_split) {
    Block* rest = new Block{b->ptr + size, b->size - size, stream, small};
    rest->prev = b;
    rest->next = b->next;
    if (b->next) b->next->prev = rest;
    b->next = rest;
    b->size = size;
    set.insert(rest);
  }
  b->free = false;
  live_[b->ptr] = b;
  stats_.allocated += b->size;
  b->kind = static_cast<uint8_t>(current_alloc_kind());
  stats_.allocated_by_kind[b->kind] += b->size;
  if (stats_.allocated > stats_.peak_allocated) {
    stats_.peak_allocated = stats_.allocated;
    std::copy(std::begin(stats_.allocated_by_kind), std::end(stats_.allocated_by_kind),
              std::begin(stats_.peak_by_kind));
  }
  return b->ptr;
}

void CachingAllocator::deallocate(void* ptr) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(ptr);
  if (it == live_.end()) throw std::logic_error("CachingAllocator: free of an unknown pointer");
  Block* b = it->second;
  live_.erase(it);
  stats_.allocated -= b->size;
  stats_.allocated_by_kind[b->kind] -= b->size;
  b->free = true;
  FreeSet& set = free_set(b->stream, b->small);
  // Merge with free neighbours; the segment head (prev == nullptr) keeps its identity.
  if (b->next && b->next->free) {
    Block* n = b->next;
    set.erase(n);
    b->size += n->size;
    b->next = n->next;
    if (n->next) n->next->prev = b;
    delete n;
  }
  if (b->prev && b->prev->free) {
    Block* p = b->prev;
    set.erase(p);
    p->size += b->size;
    p->next = b->next;
    if (b->next) b->next->prev = p;
    delete b;
    b = p;
  }
  set.insert(b);
}

// Note [private pools keep their segments]
// A graph captured into a private pool holds the addresses of every block it used, the ones freed
// before the capture ended included: each replay writes them again. Returning such a segment to
// the backend while the graph lives leaves the graph writing memory it no longer owns. On CUDA
// that showed as a failed instantiation (the Qwen3-MoE step, 2026-12-07, an H100: the backend ran
// out mid-capture, the retry freed idle segments of the capture's own pool, and the memset nodes
// into them made cudaGraphInstantiate answer "invalid argument"; with the memsets as kernels the
// replay read freed memory). So kept pools are skipped here; release_pool() ends them.
void CachingAllocator::release_unused_segments() {
  std::vector<Block*> unused;
  for (Block* head : segments_) {
    if (head->free && head->next == nullptr && kept_pools_.count(head->stream) == 0) {
      unused.push_back(head);
    }
  }
  for (Block* head : unused) {
    free_set(head->stream, head->small).erase(head);
    segments_.erase(head);
    stats_.reserved -= head->size;
    backend_->raw_free(head->ptr);
    delete head;
  }
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  release_unused_segments();
}

void CachingAllocator::keep_pool(uintptr_t pool) {
  std::lock_guard<std::mutex> lock(mu_);
  kept_pools_.insert(pool);
}

void CachingAllocator::release_pool(uintptr_t pool, uintptr_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  kept_pools_.erase(pool);
  std::vector<Block*> heads;
  for (Block* head : segments_) {
    if (head->stream == pool) heads.push_back(head);
  }
  for (Block* head : heads) {
    if (head->free && head->next == nullptr) {
      free_set(pool, head->small).erase(head);
      segments_.erase(head);
      stats_.reserved -= head->size;
      backend_->raw_free(head->ptr);
      delete head;
      continue;
    }
    for (Block* b = head; b != nullptr; b = b->next) {
      if (b->free) {
        free_set(pool, b->small).erase(b);
        free_set(stream, b->small).insert(b);
      }
      b->stream = stream;
    }
  }
  free_.erase({pool, true});
  free_.erase({pool, false});
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_allocated = stats_.allocated;
  stats_.peak_reserved = stats_.reserved;
  std::copy(std::begin(stats_.allocated_by_kind), std::end(stats_.allocated_by_kind),
            std::begin(stats_.peak_by_kind));
}

std::string CachingAllocator::oom_message(size_t asked) const {
  size_t cached = stats_.reserved - stats_.allocated;
  return "out of memory on " + backend_->name() + ": asked for " + format_bytes(asked) + "; " +
         format_bytes(stats_.allocated) + " allocated in live tensors, " + format_bytes(cached) +
         " cached but unused (fragmented across streams/pools), " + format_bytes(stats_.reserved) +
         " reserved in all. Hint: lower train.micro_batch or train.seq_len.";
}

}  // namespace gtron::memory

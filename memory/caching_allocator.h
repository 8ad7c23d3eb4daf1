// Caching allocator: one policy for every backend, over a raw backend (malloc on CPU, cudaMalloc on
// CUDA).
//
// Policy (written down first, then coded; after PyTorch's CUDA caching allocator):
// - Sizes are rounded up to a multiple of kRound (512 B). A request of at most kSmallSize (1 MiB)
//   is served from 2 MiB segments ("small pool"); larger requests from segments of the rounded size
//   rounded up to 2 MiB ("large pool"). Pools never mix.
// - Free blocks are kept per (stream, pool) ordered by size; a request takes the best fit: the
//   smallest free block of the same stream and pool that is large enough.
// - If the chosen block is larger than needed by at least kRound (small pool) or kSmallSize (large
//   pool), it is split; the remainder stays free. On free, a block merges with free neighbours of
//   its segment.
// - A block freed on stream S is reused only by requests on S: on CUDA, work queued on S that still
//   reads it runs before any later work on S. Cross-stream use must be fenced by the caller.
// - Only when no cached block fits does the allocator call the backend (a "miss"). If the backend
//   fails, all unused cached segments are returned (except those of kept private pools: Note
//   [private pools keep their segments]) and the request is retried once; if it still fails, the
//   error says how much is allocated, cached and asked for.
// - Stats: allocated (bytes in live blocks), reserved (bytes held from the backend), their peaks,
//   and the number of requests and misses. A steady-state training step must make zero misses.
//
// Thread safety: every public method takes the allocator's mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>

namespace gtron::memory {

// Note [allocation kinds]
// What the bytes at the peak are for. A thread-local kind, set by scopes where the memory is
// asked for (the model's parameters, the gradient buffers, the optimizer's state, the forward,
// the backward, communication buffers), travels with each block from allocate() to deallocate();
// the allocator keeps live bytes per kind and copies them at every new peak of `allocated`, so
// the peak can be told apart (a copy of kAllocKinds numbers per new peak, none in steady state).
// Nested scopes win: the gradient bucket a backward allocates counts as gradients.
enum class AllocKind : uint8_t {
  kOther,
  kWeights,        // fp32 masters and their bf16 copies
  kGradients,      // fp32 gradient buffers (main_grad, DP buckets)
  kOptimizer,      // AdamW moments and the norm's scratch
  kForward,        // what the forward allocates: activations kept for the backward, its scratch
  kBackward,       // activation gradients and the backward's scratch
  kCommunication,  // gathered weights, send and staging buffers of collectives
  kCheckpoint,     // the copies a checkpoint write gathers
};
constexpr int kAllocKinds = 8;
const char* alloc_kind_name(AllocKind kind);  // "weights", "gradients", ...
AllocKind current_alloc_kind();
// Sets the calling thread's kind for its lifetime (RAII).
class AllocKindScope {
 public:
  explicit AllocKindScope(AllocKind kind);
  ~AllocKindScope();
  AllocKindScope(const AllocKindScope&) = delete;
  AllocKindScope& operator=(const AllocKindScope&) = delete;

 private:
  AllocKind prev_;
};

struct AllocatorStats {
  size_t allocated = 0;       // bytes in live blocks (rounded sizes)
  size_t reserved = 0;        // bytes held from the backend
  size_t peak_allocated = 0;  // high-water mark of `allocated`
  size_t peak_reserved = 0;   // high-water mark of `reserved`
  uint64_t requests = 0;      // allocate() calls
  uint64_t misses = 0;        // allocate() calls that went to the backend
  // Note [allocation kinds]: live bytes by AllocKind now, and at the peak of `allocated`.
  size_t allocated_by_kind[kAllocKinds] = {};
  size_t peak_by_kind[kAllocKinds] = {};
};

// Raw memory source under the caching policy. Returns nullptr on failure (never throws).
class RawBackend {
 public:
  virtual ~RawBackend() = default;
  virtual void* raw_alloc(size_t bytes) = 0;
  virtual void raw_free(void* ptr) = 0;
  virtual std::string name() const = 0;  // "cpu", "cuda:0": for error messages
};

std::unique_ptr<RawBackend> make_cpu_backend();

class CachingAllocator {
 public:
  static constexpr size_t kRound = 512;
  static constexpr size_t kSmallSize = size_t{1} << 20;
  static constexpr size_t kSegment = size_t{2} << 20;

  explicit CachingAllocator(std::unique_ptr<RawBackend> backend);
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // Returns a block of at least `bytes` bytes (aligned to kRound) for use on `stream` (an opaque
  // stream identity; 0 is the default stream). Throws std::runtime_error on out-of-memory with a
  // message that says where the memory is. `bytes` == 0 returns a valid unique block.
  void* allocate(size_t bytes, uintptr_t stream = 0);
  // REQUIRES: `ptr` came from allocate() of this allocator and was not freed since.
  void deallocate(void* ptr);
  // Returns every segment with no live block to the backend.
  void empty_cache();
  // Starts the private pool `pool` (a stream key that only a graph's captures allocate with; see
  // PrivatePoolGuard in model/tensor.h). Note [private pools keep their segments]: until
  // release_pool(pool), neither empty_cache() nor the out-of-memory retry returns a segment of it
  // to the backend, free or not: a captured graph replays into its free blocks.
  void keep_pool(uintptr_t pool);
  // Ends the private pool `pool`: its segments with no live block go back to the backend, the
  // blocks of the others join `stream`'s pool (live ones are freed there later).
  void release_pool(uintptr_t pool, uintptr_t stream = 0);

  AllocatorStats stats() const;
  void reset_peak();
  std::string backend_name() const { return backend_->name(); }

 private:
  struct Block;
  struct BySize {
    bool operator()(const Block* a, const Block* b) const;
  };
  using FreeSet = std::set<Block*, BySize>;

  static size_t round_size(size_t bytes);
  FreeSet& free_set(uintptr_t stream, bool small);
  Block* find_free(FreeSet& set, size_t size, uintptr_t stream);
  Block* new_segment(size_t size, uintptr_t stream, bool small);
  void release_unused_segments();
  std::string oom_message(size_t asked) const;

  std::unique_ptr<RawBackend> backend_;
  mutable std::mutex mu_;
  std::map<std::pair<uintptr_t, bool>, FreeSet> free_;  // (stream, small) -> free blocks
  std::unordered_map<void*, Block*> live_;              // ptr -> live block
  std::set<Block*> segments_;                           // first block of every segment
  std::set<uintptr_t> kept_pools_;                      // keep_pool() without release_pool()
  AllocatorStats stats_;
};

}  // namespace gtron::memory

// LIFO send-buffer pool: the buffers GTP's wgrad GEMMs write full-size gradients into before the
// reduce-scatter (ARCHITECTURE.md).
//
// Policy (the contract; the code follows it):
// - Keys. A buffer belongs to one key (numel, dtype, group): element count, element type (an opaque
//   tag plus its size in bytes) and the communicator group it is reduced over. Buffers never move
//   between keys, and keys that differ in any field never share a buffer.
// - acquire(key) pops the most recently released free buffer of that key (LIFO: the buffer most
//   likely still warm in cache/TLB and, under graph capture, the one warmup left on top). With no
//   free buffer it allocates exactly numel * elem_size bytes from the backend.
// - release(key, ptr) pushes the buffer back on its key's free list. Releasing a pointer this pool
//   did not hand out, under another key, or twice, is an invariant failure (std::logic_error).
// - has_free(key) is true exactly when acquire(key) would pop rather than allocate.
// - The pool never shrinks: buffers go back to the backend only in the destructor, in the reverse
//   of their allocation order. So every buffer the pool holds is live at the memory peak, and
//   bytes_held is both the current footprint and its peak.
// - Determinism: whether acquire allocates depends only on the sequence of acquire/release keys
//   (never on addresses or timing), so two pools fed the same sequence make the same allocations,
//   of the same sizes, in the same order. Collective backends (symmetric memory) rely on this.
// - Capture guard. While capturing (set_capturing(true)) a graph, an acquire that would allocate
//   throws std::logic_error: an allocation inside capture would bake an address the replay cannot
//   own, so warmup must fill the pool first.
// - Backend failure (allocate returns nullptr) throws std::runtime_error naming the key, the bytes
//   asked for and what the pool already holds.
//
// Thread safety: every public method of LifoPool takes the pool's mutex. The backend is called only
// under that mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace gtron::memory {

// An element type as the memory layer sees it (memory/ does not know model::DType): an opaque tag
// chosen by the caller (gtron passes static_cast<int>(DType)) and the size of one element.
struct ElemType {
  int32_t tag = 0;
  int32_t size = 0;  // bytes per element, > 0
};

bool operator==(const ElemType& a, const ElemType& b);
bool operator<(const ElemType& a, const ElemType& b);

struct PoolKey {
  int64_t numel = 0;  // elements per buffer, > 0
  ElemType dtype;
  int64_t group = 0;  // id of the communicator group the buffer is reduced over

  // REQUIRES: numel > 0, dtype.size > 0, and the product fits in size_t (else std::logic_error).
  size_t bytes() const;
  // "(numel=4096, dtype=1 (2 bytes), group=0)": for error messages and logs.
  std::string to_string() const;
};

bool operator==(const PoolKey& a, const PoolKey& b);
bool operator<(const PoolKey& a, const PoolKey& b);

// Raw memory under the pool. allocate returns nullptr on failure and never throws; free never
// throws (it runs from destructors).
class BufferBackend {
 public:
  virtual ~BufferBackend() = default;
  virtual void* allocate(size_t bytes) = 0;
  virtual void free(void* ptr) noexcept = 0;
  virtual std::string name() const = 0;  // "host", "nccl-symmetric:gtp0": for messages
};

// Host memory, 256-byte aligned (std::aligned_alloc). For Gloo/CPU runs and tests.
std::unique_ptr<BufferBackend> make_host_buffer_backend();

struct PoolKeyStats {
  PoolKey key;
  size_t held = 0;    // buffers of this key the pool owns (free + in use)
  size_t in_use = 0;  // of those, handed out and not yet released
};

struct PoolStats {
  size_t bytes_held = 0;           // sum of all allocations; never decreases (so also its peak)
  size_t bytes_in_use = 0;         // bytes of buffers handed out and not released
  size_t peak_bytes_in_use = 0;    // high-water mark of bytes_in_use
  uint64_t allocations = 0;        // backend allocations (acquires that found no free buffer)
  uint64_t acquires = 0;           // all successful acquire() calls
  std::vector<PoolKeyStats> keys;  // one entry per key ever acquired, ordered by key
};

class LifoPool {
 public:
  explicit LifoPool(std::unique_ptr<BufferBackend> backend);
  // Frees every buffer, in the reverse of allocation order. Buffers still in use are freed too: the
  // pool owns them, and a holder that outlives the pool is the caller's bug.
  ~LifoPool();
  LifoPool(const LifoPool&) = delete;
  LifoPool& operator=(const LifoPool&) = delete;

  // Returns a buffer of key.bytes() bytes, owned by the pool, lent to the caller until release().
  // Throws std::logic_error for an invalid key or an allocation under capture, std::runtime_error
  // when the backend is out of memory.
  void* acquire(const PoolKey& key);
  // REQUIRES: ptr came from acquire(key) of this pool and was not released since.
  void release(const PoolKey& key, void* ptr);
  // True when acquire(key) would pop a free buffer (and so not allocate).
  bool has_free(const PoolKey& key) const;

  void set_capturing(bool capturing);
  bool capturing() const;

  PoolStats stats() const;
  std::string backend_name() const { return backend_->name(); }

 private:
  struct KeyState {
    std::vector<void*> free;  // top of the stack = back
    size_t held = 0;
    size_t in_use = 0;
  };
  struct Lent {
    PoolKey key;
    bool in_use = false;
  };

  std::string oom_message(const PoolKey& key) const;

  std::unique_ptr<BufferBackend> backend_;
  mutable std::mutex mu_;
  std::map<PoolKey, KeyState> keys_;
  std::unordered_map<void*, Lent> buffers_;  // every buffer the pool owns -> its key and state
  std::vector<void*> allocation_order_;      // freed back to front by the destructor
  bool capturing_ = false;
  PoolStats stats_;  // `keys` is filled by stats() from keys_
};

}  // namespace gtron::memory

// Symmetric send-buffer pool: the LIFO pool (memory/lifo_pool.h, whose policy applies unchanged)
// over memory that is registered with a communicator as a symmetric window, so NCCL can run its
// symmetric reduce-scatter kernels on the send buffers.
//
// Policy (in addition to the LIFO pool's):
// - Every buffer is allocated and then registered (SymmetricBackend::allocate, then
//   register_window); the returned window handle is kept alongside the pointer for the buffer's
//   whole life and is available through window(ptr).
// - Registration is collective on NCCL (ncclCommWindowRegister with NCCL_WIN_COLL_SYMMETRIC): every
//   rank of the group must register the same sizes in the same order. The LIFO pool allocates in
//   an order fixed by the sequence of acquire/release keys alone, so ranks that issue the same
//   sequence (GTP ranks run the same program) register identically. A rank that acquires a key the
//   others do not deadlocks the group: callers keep their acquire/release sequence
//   rank-independent.
// - At destruction every buffer is deregistered and then freed, one buffer at a time, in the
//   reverse of allocation order (also collective and identical on every rank). The communicator
//   behind the backend must outlive the pool.
// - If registration throws, the just-allocated memory is freed and the error propagates; the pool
//   is unchanged.
//
// The NCCL backend (ncclMemAlloc + ncclCommWindowRegister) lives in parallel/, next to the
// communicator; memory/ never includes nccl.h. make_plain_symmetric_backend() is the Gloo/CPU
// backend: host memory and a no-op registration, so both backends run the same pool code.
//
// Thread safety: every public method of SymmetricPool is safe to call concurrently (the LIFO pool's
// mutex plus the window table's own mutex). Backends are called from one thread at a time.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "memory/lifo_pool.h"

namespace gtron::memory {

// Opaque registration handle (an ncclWindow_t on NCCL; nullptr for plain memory).
using WindowHandle = void*;

class SymmetricBackend {
 public:
  virtual ~SymmetricBackend() = default;
  // Returns `bytes` bytes suitable for registration, or nullptr on failure; never throws.
  virtual void* allocate(size_t bytes) = 0;
  // Registers [ptr, ptr + bytes) as a symmetric window. Collective on NCCL. Throws on failure.
  virtual WindowHandle register_window(void* ptr, size_t bytes) = 0;
  // Undoes register_window. Collective on NCCL. Never throws (runs from destructors).
  virtual void deregister_window(WindowHandle window) noexcept = 0;
  // Frees memory from allocate(), after its window was deregistered. Never throws.
  virtual void free(void* ptr) noexcept = 0;
  virtual std::string name() const = 0;
};

// Host memory (std::aligned_alloc, 256 B) with a no-op registration returning nullptr: Gloo/CPU.
std::unique_ptr<SymmetricBackend> make_plain_symmetric_backend();

class SymmetricPool {
 public:
  explicit SymmetricPool(std::unique_ptr<SymmetricBackend> backend);
  // Deregisters and frees every buffer in the reverse of allocation order (see the policy).
  ~SymmetricPool();
  SymmetricPool(const SymmetricPool&) = delete;
  SymmetricPool& operator=(const SymmetricPool&) = delete;

  // Same contracts as LifoPool's methods of the same names.
  void* acquire(const PoolKey& key);
  void release(const PoolKey& key, void* ptr);
  bool has_free(const PoolKey& key) const;
  void set_capturing(bool capturing);
  bool capturing() const;
  PoolStats stats() const;
  std::string backend_name() const;

  // The window registered for `ptr`. REQUIRES: ptr is a buffer of this pool (else
  // std::logic_error); it need not be in use.
  WindowHandle window(const void* ptr) const;

 private:
  class Registry;  // a BufferBackend that registers on allocate and deregisters on free

  Registry* registry_;  // owned by pool_ (as its backend); outlives every use through pool_
  LifoPool pool_;
};

}  // namespace gtron::memory

// Ticket cache for GTP gather buffers: where the full (all-gathered) copy of a sharded weight lives
// while a GEMM reads it (ARCHITECTURE.md).
//
// Policy (the contract; the code follows it):
// - Tickets. A ticket names the gather buffer of one (weight id, direction). Asking again for the
//   same (weight, direction) returns the same ticket, and a ticket's buffer address never changes
//   for the life of the cache: captured graphs bake it in. Asking with another numel or element
//   type than the first time is an invariant failure (std::logic_error).
// - Classes. Buffers are grouped in classes by (direction, numel, element type). A ticket only ever
//   uses a buffer of its own class: different shapes never share, and forward and backward tickets
//   never share (each direction's prefetch chain runs over its own buffers, so what the forward
//   chain holds in flight can never be overwritten by the backward chain and vice versa).
// - Neighbours. The caller declares which weights are neighbours (the prefetch chain: weight i is
//   in use while weight i+1 (forward) or i-1 (backward) is being gathered). The relation is
//   symmetric and holds in both directions. Neighbours never share a buffer: a prefetch into a
//   shared buffer would overwrite the weight still being read.
// - Assignment (greedy colouring). A new ticket takes the first buffer of its class (in creation
//   order) that no neighbour's ticket of the same direction holds; if every buffer is held by a
//   neighbour, it allocates a new one for the class. Same-shape non-neighbours therefore share.
//   Over a chain (each weight has at most two neighbours) a class never needs more than 3 buffers,
//   and 2 when tickets are taken in chain order.
// - Declaring late. A neighbour pair may be declared at any time unless both weights already hold
//   tickets of a common direction: those were assigned without the constraint, so adding it then
//   is an invariant failure (std::logic_error). This allows building the chain during the first
//   forward (declare (prev, i), then take i's ticket). Re-declaring an existing pair is a no-op; a
//   weight cannot be its own neighbour.
// - Lifetime. The cache never frees a buffer before its destructor, which frees them in the reverse
//   of allocation order. A backend out of memory is a std::runtime_error naming the weight.
//
// Thread safety: every public method takes the cache's mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "memory/lifo_pool.h"

namespace gtron::memory {

enum class Direction : uint8_t { kForward, kBackward };

const char* direction_name(Direction dir);  // "forward", "backward"

struct Ticket {
  int64_t weight_id = -1;
  Direction direction = Direction::kForward;
  int32_t slot = -1;  // index of the buffer in its cache; -1 for a default (empty) ticket

  bool valid() const { return slot >= 0; }
};

struct WeightCacheStats {
  size_t buffers = 0;  // buffers allocated (all classes, both directions)
  size_t bytes = 0;    // their total size
  size_t tickets = 0;  // (weight, direction) pairs holding a ticket
  size_t classes = 0;  // (direction, numel, element type) classes seen
};

class WeightCache {
 public:
  explicit WeightCache(std::unique_ptr<BufferBackend> backend);
  ~WeightCache();
  WeightCache(const WeightCache&) = delete;
  WeightCache& operator=(const WeightCache&) = delete;

  // Declares `a` and `b` neighbours (symmetric). Throws std::logic_error if a == b, or if both
  // already hold tickets of a common direction and the pair is new.
  void declare_neighbors(int64_t a, int64_t b);
  // Declares every consecutive pair of `order` (the prefetch chain, in forward order).
  void declare_chain(const std::vector<int64_t>& order);

  // The ticket of (weight_id, dir), assigned on first call (see the policy). REQUIRES: numel > 0,
  // dtype.size > 0, and the same numel/dtype on every call for one (weight, direction).
  Ticket ticket(int64_t weight_id, Direction dir, int64_t numel, ElemType dtype);
  // The ticket's buffer (numel * dtype.size bytes). REQUIRES: `t` came from this cache's ticket().
  void* buffer(const Ticket& t) const;
  bool has_ticket(int64_t weight_id, Direction dir) const;

  WeightCacheStats stats() const;
  std::string backend_name() const { return backend_->name(); }

 private:
  struct ClassKey {
    Direction dir;
    int64_t numel;
    ElemType dtype;
    bool operator<(const ClassKey& o) const;
  };
  struct Buffer {
    void* ptr;
    size_t bytes;
  };
  struct Assigned {
    int32_t slot;
    int64_t numel;
    ElemType dtype;
  };
  using TicketKey = std::pair<int64_t, Direction>;

  bool holds_slot(int64_t weight_id, Direction dir, int32_t slot) const;
  int32_t choose_slot(int64_t weight_id, const ClassKey& cls, size_t bytes);

  std::unique_ptr<BufferBackend> backend_;
  mutable std::mutex mu_;
  std::unordered_map<int64_t, std::set<int64_t>> neighbors_;
  std::map<TicketKey, Assigned> tickets_;
  std::map<ClassKey, std::vector<int32_t>> classes_;  // class -> its slots, in creation order
  std::vector<Buffer> buffers_;                       // slot -> buffer, in allocation order
  size_t bytes_ = 0;
};

}  // namespace gtron::memory

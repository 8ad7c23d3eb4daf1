#include "memory/weight_cache.h"

#include <limits>
#include <sstream>
#include <stdexcept>
#include <tuple>

namespace gtron::memory {

const char* direction_name(Direction dir) {
  return dir == Direction::kForward ? "forward" : "backward";
}

namespace {

constexpr Direction kDirections[] = {Direction::kForward, Direction::kBackward};

std::string ticket_name(int64_t weight_id, Direction dir) {
  std::ostringstream os;
  os << "weight " << weight_id << " (" << direction_name(dir) << ")";
  return os.str();
}

}  // namespace

bool WeightCache::ClassKey::operator<(const ClassKey& o) const {
  return std::tie(dir, numel, dtype) < std::tie(o.dir, o.numel, o.dtype);
}

WeightCache::WeightCache(std::unique_ptr<BufferBackend> backend) : backend_(std::move(backend)) {
  if (!backend_) throw std::logic_error("weight cache: null backend");
}

WeightCache::~WeightCache() {
  for (auto it = buffers_.rbegin(); it != buffers_.rend(); ++it) backend_->free(it->ptr);
}

void WeightCache::declare_neighbors(int64_t a, int64_t b) {
  std::lock_guard<std::mutex> lock(mu_);
  if (a == b) {
    throw std::logic_error("weight cache: weight " + std::to_string(a) +
                           " declared its own neighbour");
  }
  if (neighbors_[a].count(b) != 0) return;
  for (Direction dir : kDirections) {
    if (tickets_.count({a, dir}) != 0 && tickets_.count({b, dir}) != 0) {
      throw std::logic_error("weight cache: neighbours " + std::to_string(a) + " and " +
                             std::to_string(b) + " declared after both took " +
                             direction_name(dir) +
                             " tickets; declare a pair before the second of them takes a ticket");
    }
  }
  neighbors_[a].insert(b);
  neighbors_[b].insert(a);
}

void WeightCache::declare_chain(const std::vector<int64_t>& order) {
  for (size_t i = 1; i < order.size(); ++i) declare_neighbors(order[i - 1], order[i]);
}

bool WeightCache::holds_slot(int64_t weight_id, Direction dir, int32_t slot) const {
  auto it = tickets_.find({weight_id, dir});
  return it != tickets_.end() && it->second.slot == slot;
}

// First buffer of the class that no neighbour of the same direction holds, else a new one.
int32_t WeightCache::choose_slot(int64_t weight_id, const ClassKey& cls, size_t bytes) {
  static const std::vector<int32_t> kNone;
  auto cls_it = classes_.find(cls);
  const std::vector<int32_t>& slots = cls_it == classes_.end() ? kNone : cls_it->second;
  auto nb = neighbors_.find(weight_id);
  for (int32_t slot : slots) {
    bool taken = false;
    if (nb != neighbors_.end()) {
      for (int64_t other : nb->second) {
        if (holds_slot(other, cls.dir, slot)) {
          taken = true;
          break;
        }
      }
    }
    if (!taken) return slot;
  }
  void* ptr = backend_->allocate(bytes);
  if (ptr == nullptr) {
    std::ostringstream os;
    os << "weight cache (" << backend_->name() << "): out of memory allocating " << bytes
       << " bytes for the gather buffer of " << ticket_name(weight_id, cls.dir)
       << "; the cache already holds " << bytes_ << " bytes in " << buffers_.size() << " buffers.";
    throw std::runtime_error(os.str());
  }
  buffers_.push_back(Buffer{ptr, bytes});
  bytes_ += bytes;
  const auto slot = static_cast<int32_t>(buffers_.size() - 1);
  classes_[cls].push_back(slot);
  return slot;
}

Ticket WeightCache::ticket(int64_t weight_id, Direction dir, int64_t numel, ElemType dtype) {
  if (numel <= 0 || dtype.size <= 0 ||
      static_cast<uint64_t>(numel) > std::numeric_limits<size_t>::max() / dtype.size) {
    std::ostringstream os;
    os << "weight cache: " << ticket_name(weight_id, dir) << " asked for numel=" << numel << " of "
       << dtype.size << "-byte elements; both must be positive and fit size_t bytes";
    throw std::logic_error(os.str());
  }
  const size_t bytes = static_cast<size_t>(numel) * static_cast<size_t>(dtype.size);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tickets_.find({weight_id, dir});
  if (it != tickets_.end()) {
    const Assigned& a = it->second;
    if (a.numel != numel || !(a.dtype == dtype)) {
      std::ostringstream os;
      os << "weight cache: " << ticket_name(weight_id, dir) << " asked for numel=" << numel
         << ", dtype=" << dtype.tag << " (" << dtype.size
         << " bytes), but its ticket has numel=" << a.numel << ", dtype=" << a.dtype.tag << " ("
         << a.dtype.size << " bytes)";
      throw std::logic_error(os.str());
    }
    return Ticket{weight_id, dir, a.slot};
  }
  const int32_t slot = choose_slot(weight_id, ClassKey{dir, numel, dtype}, bytes);
  tickets_[{weight_id, dir}] = Assigned{slot, numel, dtype};
  return Ticket{weight_id, dir, slot};
}

void* WeightCache::buffer(const Ticket& t) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!t.valid() || !holds_slot(t.weight_id, t.direction, t.slot)) {
    throw std::logic_error("weight cache: " + ticket_name(t.weight_id, t.direction) +
                           ": ticket was not issued by this cache");
  }
  return buffers_[static_cast<size_t>(t.slot)].ptr;
}

bool WeightCache::has_ticket(int64_t weight_id, Direction dir) const {
  std::lock_guard<std::mutex> lock(mu_);
  return tickets_.count({weight_id, dir}) != 0;
}

WeightCacheStats WeightCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  WeightCacheStats out;
  out.buffers = buffers_.size();
  out.bytes = bytes_;
  out.tickets = tickets_.size();
  out.classes = classes_.size();
  return out;
}

}  // namespace gtron::memory

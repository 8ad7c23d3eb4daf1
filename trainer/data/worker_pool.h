// A fixed set of CPU threads that run one parallel loop at a time (`gtron prepare` and
// `gtron tokenizer train` encode and count documents on them).
//
// Policy [deterministic parallel loops]: parallel_for(n, fn) calls fn(i, worker) once for every i;
// which worker runs which i depends on scheduling, so callers keep results per index i (or per
// worker, combined with an order-independent operation such as integer sums) and never let the
// worker number reach their output. Then the output is the same for any thread count.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace gtron {

// The hardware threads this process may run on (its CPU affinity), at least 1.
int usable_hardware_threads();

// REQUIRES: threads >= 1. Non-copyable, non-movable (its threads point at it). Not thread-safe:
// one thread drives it.
class WorkerPool {
 public:
  explicit WorkerPool(int threads);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  int size() const { return static_cast<int>(threads_.size()) + 1; }

  // Calls fn(i, worker) for every i in [0, n), worker in [0, size()) (the caller's thread is
  // worker 0), and returns when every call has returned. Indices are handed out one at a time, so
  // uneven items balance. If calls throw, the rest of the loop is skipped and the exception of
  // the smallest index that threw is rethrown (the same one for any thread count when the calls
  // that throw depend only on i).
  void parallel_for(size_t n, const std::function<void(size_t i, int worker)>& fn);

 private:
  void worker_loop(int worker);
  void run_items(int worker);

  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable start_, done_;
  const std::function<void(size_t, int)>* fn_ = nullptr;  // the loop in flight
  size_t n_ = 0;
  std::atomic<size_t> next_{0};  // the next index to hand out
  std::atomic<bool> failed_{false};
  int busy_ = 0;             // pool threads inside the current loop (under mu_)
  uint64_t generation_ = 0;  // bumped per loop: wakes the pool threads (under mu_)
  bool stop_ = false;        // under mu_
  size_t error_index_ = 0;   // the smallest index that threw, and its exception (under mu_)
  std::exception_ptr error_;
};

}  // namespace gtron

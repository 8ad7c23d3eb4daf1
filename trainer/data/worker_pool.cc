#include "trainer/data/worker_pool.h"

#include <sched.h>

#include <algorithm>
#include <utility>

#include "model/check.h"

namespace gtron {

int usable_hardware_threads() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

WorkerPool::WorkerPool(int threads) {
  GTRON_CHECK(threads >= 1, "WorkerPool needs at least one thread, got ", threads);
  for (int w = 1; w < threads; ++w) threads_.emplace_back([this, w] { worker_loop(w); });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void WorkerPool::parallel_for(size_t n, const std::function<void(size_t, int)>& fn) {
  if (n == 0) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    n_ = n;
    next_ = 0;
    failed_ = false;
    error_ = nullptr;
    busy_ = static_cast<int>(threads_.size());
    ++generation_;
  }
  start_.notify_all();
  run_items(0);
  std::unique_lock<std::mutex> lock(mu_);
  done_.wait(lock, [this] { return busy_ == 0; });
  fn_ = nullptr;
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void WorkerPool::worker_loop(int worker) {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    run_items(worker);
    std::lock_guard<std::mutex> lock(mu_);
    if (--busy_ == 0) done_.notify_one();
  }
}

// Indices go out in increasing order, so when index k throws every index below k has already been
// handed out and runs to its end: the smallest index that throws is always recorded.
void WorkerPool::run_items(int worker) {
  for (;;) {
    if (failed_.load(std::memory_order_relaxed)) return;
    const size_t i = next_.fetch_add(1, std::memory_order_relaxed);
    if (i >= n_) return;
    try {
      (*fn_)(i, worker);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_ || i < error_index_) {
        error_ = std::current_exception();
        error_index_ = i;
      }
      failed_ = true;
    }
  }
}

}  // namespace gtron

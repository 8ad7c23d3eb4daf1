// The CPU backend of Communicator, on Gloo over TCP.
//
// Policy:
// - Each communicator owns one Gloo context (a full mesh of TCP pairs, bootstrapped through the
//   store under the communicator's name) and ONE worker thread. A collective call arms a CPU event,
//   queues a task and returns; the worker runs the queue in submission order and completes each
//   event, so collectives really run asynchronously and in the same order on every rank.
// - The queueing itself runs as a closure on the caller's current CPU stream: eagerly that is at
//   once; while the stream is capturing, the collective is recorded and re-issued at every replay.
// - Types: all_gather and broadcast move bytes, so any dtype works; reductions take f32 and f64
//   (sum; max for all_reduce and reduce_scatter).
// - reduce_scatter = Gloo allreduce of a scratch copy of `in`, then a copy of this rank's chunk:
//   twice the traffic of a true reduce-scatter, but every rank gets bit-identical sums.
// - all_to_all = Gloo alltoallv over bytes (any dtype); zero-sized blocks are allowed, and a
//   rank with nothing to send or receive still takes part (its buffers stand in as one byte).
// - A failure (peer gone, timeout) breaks the communicator: see communicator.h, "Errors".
// - Destruction waits for the collectives already queued (every rank issued them) and then stops
//   the worker.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "parallel/communicator.h"
#include "parallel/grid.h"
#include "parallel/store.h"

namespace gloo {
class Context;
}

namespace gtron::parallel {

struct GlooOptions {
  // End-to-end limit of one collective, counted from the moment this rank starts it. Generous:
  // a peer may arrive late after a checkpoint or a slow data shard.
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
  // The address peers use to reach this process. Empty: the local address of the store
  // connection, i.e. the interface that reaches rank 0.
  std::string hostname;
};

class GlooCommunicator final : public Communicator {
 public:
  // Collective over the `size` ranks: connects the full mesh through `store`, keys under `name`.
  // REQUIRES: `name` unique per store; 0 <= rank < size.
  GlooCommunicator(StoreClient& store, const std::string& name, int rank, int size,
                   const GlooOptions& options = {});
  ~GlooCommunicator() override;
  GlooCommunicator(const GlooCommunicator&) = delete;
  GlooCommunicator& operator=(const GlooCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override { return Device::cpu(); }
  const std::string& name() const override { return name_; }

  Work all_gather(const Tensor& in, Tensor& out) override;
  Work reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op = ReduceOp::kSum) override;
  Work all_reduce(Tensor& inout, ReduceOp op = ReduceOp::kSum) override;
  Work broadcast(Tensor& inout, int root) override;
  Work all_to_all(const Tensor& in, const std::vector<int64_t>& send_counts, Tensor& out,
                  const std::vector<int64_t>& recv_counts) override;
  void barrier() override;

 private:
  class GlooCompletion;
  // A queued collective: runs on the worker thread with its Gloo tag (the same on every rank,
  // since tags are numbered in execution order).
  struct Task {
    std::string what;
    std::function<void(uint32_t tag)> run;
    std::shared_ptr<GlooCompletion> completion;
  };
  Work submit(const std::string& what, std::function<void(uint32_t tag)> run);
  void worker_loop();

  std::string name_;
  int rank_ = 0;
  int size_ = 1;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<gloo::Context> context_;  // null when size_ == 1: collectives are local

  std::mutex mu_;  // guards queue_ and stop_
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool stop_ = false;
  std::string broken_;     // the first failure; worker thread only
  uint32_t next_tag_ = 0;  // worker thread only
  std::thread worker_;
};

// A GlooCommunicator as a Communicator (a CommunicatorFactory for make_grid).
std::unique_ptr<Communicator> make_gloo_communicator(StoreClient& store, const std::string& name,
                                                     int rank, int size,
                                                     const GlooOptions& options = {});

// make_grid with Gloo communicators.
Grid make_gloo_grid(StoreClient& store, int world_rank, int world_size, int gtp, int tp = 1,
                    const GlooOptions& options = {}, const std::string& prefix = "grid");

}  // namespace gtron::parallel

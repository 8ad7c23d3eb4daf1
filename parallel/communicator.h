// Collectives behind one interface: NCCL on GPU, Gloo on CPU.
//
// Contract, the same for every backend:
// - Every rank of a communicator issues the same collectives in the same order (SPMD), from one
//   thread at a time.
// - A call returns at once with a Work. The collective runs on the backend's own stream (NCCL) or
//   worker thread (Gloo): after the work already queued on the caller's current stream of the
//   tensors' device (current_stream(device)), and after every collective issued earlier on this
//   communicator.
// - Buffers: the Work keeps its tensors alive. Until the Work is waited (wait(stream) or
//   synchronize()) the caller must not read `out`/`inout`, nor write `in`/`inout`.
// - all_gather: `out` (size * in.numel() elements) holds rank r's `in` at elements
//   [r * n, (r + 1) * n). reduce_scatter: `in` (size * out.numel()) is reduced over ranks and rank
//   r receives chunk r. Every rank receives bit-identical reduced values for identical inputs.
// - all_to_all (all-to-all-v): `in` is size() blocks laid end to end in rank order, block p
//   (send_counts[p] elements) going to rank p; `out` receives size() blocks in rank order, block q
//   (recv_counts[q] elements) coming from rank q. Counts are in elements and may be zero or differ
//   between peers; recv_counts[q] on rank p must equal send_counts[p] on rank q (exchange the
//   counts first when they are data-dependent: an all_to_all of one count per peer). Bytes are
//   moved as they are, so any dtype works. Block p == rank() is a local copy.
// - Errors: a failed collective (a peer died, a timeout) throws CommError from synchronize(), and
//   from wait() on a CPU stream that is not capturing. The communicator is then broken: every later
//   collective fails the same way.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/device.h"
#include "model/stream.h"
#include "model/tensor.h"

namespace gtron::parallel {

enum class ReduceOp { kSum, kMax };
const char* reduce_op_name(ReduceOp op);

class CommError : public std::runtime_error {
 public:
  explicit CommError(const std::string& what) : std::runtime_error(what) {}
};

// The completion of one collective; each backend implements it. Thread-safe.
class Completion {
 public:
  virtual ~Completion() = default;
  // Makes later work on `stream` wait for the collective (CPU stream: blocks, or records the wait).
  virtual void wait(Stream& stream) = 0;
  // Blocks the host until the collective is done.
  virtual void synchronize() = 0;
  // True if the collective is done (non-blocking).
  virtual bool done() = 0;
};

// A handle on an issued collective. Copyable; copies share the completion. A default-constructed
// Work is already complete.
class Work {
 public:
  Work() = default;
  explicit Work(std::shared_ptr<Completion> completion) : completion_(std::move(completion)) {}

  void wait(Stream& stream) const {
    if (completion_) completion_->wait(stream);
  }
  void synchronize() const {
    if (completion_) completion_->synchronize();
  }
  // Non-blocking query. Never call it while capturing a graph.
  bool completed() const { return !completion_ || completion_->done(); }

 private:
  std::shared_ptr<Completion> completion_;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The device whose tensors this communicator moves (cpu for Gloo, cuda:N for NCCL).
  virtual Device device() const = 0;
  // A name for messages ("world", "grid/gtp1", ...).
  virtual const std::string& name() const = 0;

  // REQUIRES: same dtype; out.numel() == size() * in.numel(); `in` and `out` do not overlap.
  virtual Work all_gather(const Tensor& in, Tensor& out) = 0;
  // REQUIRES: same dtype; in.numel() == size() * out.numel(); no overlap.
  virtual Work reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op = ReduceOp::kSum) = 0;
  virtual Work all_reduce(Tensor& inout, ReduceOp op = ReduceOp::kSum) = 0;
  // REQUIRES: 0 <= root < size().
  virtual Work broadcast(Tensor& inout, int root) = 0;
  // REQUIRES: same dtype; size() counts each, every count >= 0; in.numel() == Σ send_counts,
  // out.numel() == Σ recv_counts; no overlap. Backends without it throw CommError ("not built")
  // at the call: this default.
  virtual Work all_to_all(const Tensor& in, const std::vector<int64_t>& send_counts, Tensor& out,
                          const std::vector<int64_t>& recv_counts);
  // Returns when every rank has reached it and every collective issued before it is done.
  virtual void barrier() = 0;
};

// Argument checks shared by the backends. A violation is a caller bug: GTRON_CHECK.
void check_all_gather_args(const Communicator& comm, const Tensor& in, const Tensor& out);
void check_reduce_scatter_args(const Communicator& comm, const Tensor& in, const Tensor& out);
void check_tensor_args(const Communicator& comm, const char* op, const Tensor& t);
void check_broadcast_root(const Communicator& comm, int root);
void check_all_to_all_args(const Communicator& comm, const Tensor& in,
                           const std::vector<int64_t>& send_counts, const Tensor& out,
                           const std::vector<int64_t>& recv_counts);

}  // namespace gtron::parallel

// The GPU backend of Communicator, on NCCL.
//
// Policy:
// - Bootstrap: rank 0 of the group creates the NCCL unique id and publishes it in the store under
//   "<name>/nccl_id"; every rank then joins with ncclCommInitRank on its device.
// - Each communicator owns its CUDA stream. A collective makes that stream wait the caller's
//   current stream of the device (an event recorded there), runs on it, and records a fresh event
//   after it; the Work waits or queries that event. No host synchronization on the hot path.
// - Types: f32, bf16, f64 and i32; sum and max.
// - Errors from NCCL or CUDA calls abort with call, file, line and device (the backend-call policy
//   of model/check.h).
//
// This header includes no CUDA or NCCL header: handles are opaque pointers.
#pragma once

#include <memory>
#include <string>

#include "memory/symmetric_pool.h"
#include "model/stream.h"
#include "model/tensor.h"
#include "parallel/communicator.h"
#include "parallel/grid.h"
#include "parallel/store.h"

namespace gtron::parallel {

// Time spent in this communicator's collectives (on its stream) and stalled on them (the caller's
// stream waiting in Work::wait), in milliseconds, measured with CUDA event pairs.
struct CommTiming {
  double all_gather_ms = 0, reduce_scatter_ms = 0, all_reduce_ms = 0, broadcast_ms = 0;
  double exposed_ms = 0;  // caller-stream time blocked in waits: communication not hidden
  int64_t collectives = 0;
};

class NcclTimer;  // nccl_communicator.cc

class NcclCommunicator final : public Communicator {
 public:
  // Collective over the `size` ranks. REQUIRES: `name` unique per store; `device` a CUDA device.
  NcclCommunicator(StoreClient& store, const std::string& name, int rank, int size, Device device);
  // Waits for the communicator's stream, then destroys the NCCL communicator.
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override { return device_; }
  const std::string& name() const override { return name_; }
  // The communicator's own stream (collectives run there).
  Stream& stream() { return stream_; }
  // The ncclComm_t, for window registration.
  void* nccl_comm() const { return comm_; }

  Work all_gather(const Tensor& in, Tensor& out) override;
  Work reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op = ReduceOp::kSum) override;
  Work all_reduce(Tensor& inout, ReduceOp op = ReduceOp::kSum) override;
  Work broadcast(Tensor& inout, int root) override;
  void barrier() override;

  // Timing (off by default): an event pair around every collective and every Work::wait outside
  // graph capture. take_timing() waits for the recorded pairs (a host sync: call it at log time),
  // returns the totals since the last call and resets them.
  void set_timing(bool on);
  CommTiming take_timing();

 private:
  // Orders the communicator's stream after the caller's, runs `call` on it (the cudaStream_t is
  // passed as void*), and returns a Work that keeps `a` and `b` alive.
  template <typename Call>
  Work launch(const Tensor& a, const Tensor& b, int kind, Call call);

  std::string name_;
  int rank_ = 0;
  int size_ = 1;
  Device device_;
  void* comm_ = nullptr;  // ncclComm_t
  Stream stream_;
  Event ready_;                       // recorded on the caller's stream before each collective
  Tensor barrier_buf_;                // [1] f32 on device_, for barrier()
  std::shared_ptr<NcclTimer> timer_;  // null: timing off
};

std::unique_ptr<Communicator> make_nccl_communicator(StoreClient& store, const std::string& name,
                                                     int rank, int size, Device device);

// The NCCL backend of the GTP send pool (memory/symmetric_pool.h): buffers from ncclMemAlloc,
// registered as NCCL_WIN_COLL_SYMMETRIC windows of `comm` (ncclCommWindowRegister), so NCCL can run
// its symmetric-memory reduce-scatter kernels on them. Registration is collective: every rank of
// `comm` must allocate in the same order (the pool's order is deterministic). The pool must be
// destroyed — windows deregistered — before `comm`.
std::unique_ptr<memory::SymmetricBackend> make_nccl_symmetric_backend(NcclCommunicator& comm);

// make_grid with NCCL communicators on `device`.
Grid make_nccl_grid(StoreClient& store, int world_rank, int world_size, int gtp, Device device,
                    const std::string& prefix = "grid", int tp = 1);

}  // namespace gtron::parallel

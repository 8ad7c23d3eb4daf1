// The GPU backend of Communicator, on NCCL.
//
// Policy:
// - Bootstrap: rank 0 of the group creates the NCCL unique id and publishes it in the store under
//   "<name>/nccl_id"; every rank then joins with ncclCommInitRank on its device.
// - Streams, the ordering against the caller's stream, Works and timing: parallel/cuda_comm.h.
// - Types: f32, bf16, f64 and i32; sum and max.
// - all_to_all: one NCCL group of a send and a receive per peer (zero-count blocks skipped),
//   counts in elements of the tensors' dtype.
// - Errors from NCCL or CUDA calls abort with call, file, line and device (the backend-call policy
//   of model/check.h).
//
// This header includes no CUDA or NCCL header: handles are opaque pointers.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "memory/symmetric_pool.h"
#include "model/stream.h"
#include "model/tensor.h"
#include "parallel/communicator.h"
#include "parallel/cuda_comm.h"
#include "parallel/grid.h"
#include "parallel/store.h"

namespace gtron::parallel {

class NcclCommunicator final : public CudaCommunicator {
 public:
  // Collective over the `size` ranks. REQUIRES: `name` unique per store; `device` a CUDA device.
  NcclCommunicator(StoreClient& store, const std::string& name, int rank, int size, Device device);
  // Waits for the communicator's stream, then destroys the NCCL communicator.
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  // The ncclComm_t, for window registration.
  void* nccl_comm() const { return comm_; }

  Work all_gather(const Tensor& in, Tensor& out) override;
  Work reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op = ReduceOp::kSum) override;
  Work all_reduce(Tensor& inout, ReduceOp op = ReduceOp::kSum) override;
  Work broadcast(Tensor& inout, int root) override;
  Work all_to_all(const Tensor& in, const std::vector<int64_t>& send_counts, Tensor& out,
                  const std::vector<int64_t>& recv_counts) override;
  void barrier() override;

 private:
  std::string name_;
  int rank_ = 0;
  int size_ = 1;
  void* comm_ = nullptr;  // ncclComm_t
  Tensor barrier_buf_;    // [1] f32 on the device, for barrier()
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

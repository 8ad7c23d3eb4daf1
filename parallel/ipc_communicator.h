// A GPU backend of Communicator for several ranks (processes) on ONE machine, usually one GPU:
// collectives are kernels that read the peers' memory through CUDA IPC. It runs every multi-rank
// GPU path (GTP chains and send pool, readiness before replay, TP) where NCCL cannot: NCCL refuses
// two ranks of one communicator on one GPU. NCCL's transport is the one thing it does not run.
//
// Policy:
// - Bootstrap: each rank allocates its arena (Note [IPC arena] in parallel/ipc_kernels.h: flags
//   and two staging slots, the same offsets on every rank), zeroes the flags, publishes its
//   cudaIpcGetMemHandle under "<name>/ipc/<rank>" and opens every peer's handle.
// - Streams, ordering, Works and timing: parallel/cuda_comm.h. Each collective is stage, barrier,
//   consume on the communicator's stream, cut into chunks that fit a slot; the counters are
//   advanced by the kernels, so every call is graph-capturable and replays correctly.
// - Reductions combine ranks in the order 0, 1, ..., P − 1 (bf16 in fp32, rounded once), so every
//   rank gets the same bits and reruns are bit-identical. all_reduce reduces every element on
//   every rank (one barrier per chunk); reduce_scatter reduces this rank's chunk only.
// - Types: f32, bf16, f64 and i32; sum and max. At most ipc::kMaxRanks ranks.
// - A peer that does not arrive within `timeout_s` ends the wait (Note [IPC bounded wait]): the
//   next collective, synchronize() or done() throws CommError naming the communicator and the
//   peer, and so does every call after it.
// - Teardown: a last barrier (skipped once broken) so no peer still reads this arena when it is
//   freed; then peers' handles are closed and the arena freed.
//
// This header includes no CUDA header.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "parallel/cuda_comm.h"
#include "parallel/grid.h"
#include "parallel/ipc_kernels.h"
#include "parallel/store.h"

namespace gtron::parallel {

struct IpcOptions {
  double timeout_s = 120;               // the bounded wait for a peer (parallel.ipc_timeout_s)
  size_t slot_bytes = size_t{8} << 20;  // one staging slot; collectives larger than it are chunked
};

struct IpcErrorState;  // ipc_communicator.cc

class IpcCommunicator final : public CudaCommunicator {
 public:
  // Collective over the `size` ranks. REQUIRES: `name` unique per store; `device` a CUDA device
  // that every rank's process can reach through CUDA IPC; 1 <= size <= ipc::kMaxRanks.
  IpcCommunicator(StoreClient& store, const std::string& name, int rank, int size, Device device,
                  const IpcOptions& options = {});
  ~IpcCommunicator() override;
  IpcCommunicator(const IpcCommunicator&) = delete;
  IpcCommunicator& operator=(const IpcCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }

  Work all_gather(const Tensor& in, Tensor& out) override;
  Work reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op = ReduceOp::kSum) override;
  Work all_reduce(Tensor& inout, ReduceOp op = ReduceOp::kSum) override;
  Work broadcast(Tensor& inout, int root) override;
  void barrier() override;

 private:
  // Throws CommError if a bounded wait has failed; else launches `chunks` on the stream through
  // CudaCommunicator::launch.
  Work run(const Tensor& a, const Tensor& b, CollectiveKind kind,
           const std::function<void(void* stream)>& chunks);
  void barrier_on(void* stream);

  std::string name_;
  int rank_ = 0;
  int size_ = 1;
  IpcOptions options_;
  void* arena_ = nullptr;  // this rank's arena (cudaMalloc)
  ipc::Peers peers_;       // every rank's arena base here (peers' opened through IPC)
  std::shared_ptr<IpcErrorState> errors_;  // the host-mapped error word (also in Works)
};

std::unique_ptr<Communicator> make_ipc_communicator(StoreClient& store, const std::string& name,
                                                    int rank, int size, Device device,
                                                    const IpcOptions& options = {});

// make_grid with IPC communicators on `device`.
Grid make_ipc_grid(StoreClient& store, int world_rank, int world_size, int gtp, Device device,
                   const IpcOptions& options, const std::string& prefix = "grid", int tp = 1);

}  // namespace gtron::parallel

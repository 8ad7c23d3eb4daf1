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
// - Windows (Note [IPC windows]): buffers every rank registers in the same order; a
//   reduce_scatter from a window reads the peers' inputs in place. The GTP send pool lives in them
//   (make_ipc_symmetric_backend), as it lives in NCCL symmetric windows on NCCL.
// - all_to_all moves bytes through the same slots in one launch that runs as many rounds as the
//   largest pair of any two ranks needs (Note [IPC all_to_all] in parallel/ipc_kernels.h), since
//   no rank knows its peers' counts with each other; the counters stay on the device, so it
//   captures and replays like the rest (with the counts it was captured with).
// - Teardown: a last barrier (skipped once broken) so no peer still reads this arena when it is
//   freed; then peers' handles are closed and the arena freed.
//
// This header includes no CUDA header.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "memory/symmetric_pool.h"
#include "parallel/cuda_comm.h"
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
  Work all_to_all(const Tensor& in, const std::vector<int64_t>& send_counts, Tensor& out,
                  const std::vector<int64_t>& recv_counts) override;
  void barrier() override;

  // Note [IPC windows]
  // A window is a whole cudaMalloc allocation that every rank of the communicator registers, in
  // the same order and with the same size (collective: the handles go through the store under
  // "<name>/win/<n>/<rank>"); each rank opens the others'. A reduce_scatter whose input lies in a
  // window (at the same offset on every rank, as the send pool's buffers are) skips the staging:
  // barrier, reduce straight from the peers' windows, barrier (the second keeps a peer from
  // refilling its buffer while others still read it). Two barriers and no copies or chunking,
  // against one barrier per slot-sized chunk plus copies.
  //
  // Registers [ptr, ptr + bytes), which must be a whole cudaMalloc allocation; returns the
  // window's handle. Throws UserError if the ranks register different sizes.
  memory::WindowHandle register_window(void* ptr, size_t bytes);
  // Closes the peers' mappings of the window (local; the caller frees ptr). Never throws.
  void deregister_window(memory::WindowHandle window) noexcept;

 private:
  struct Window;
  // Throws CommError if a bounded wait has failed; else launches `chunks` on the stream through
  // CudaCommunicator::launch.
  Work run(const Tensor& a, const Tensor& b, CollectiveKind kind,
           const std::function<void(void* stream)>& chunks);
  void barrier_on(void* stream);
  // The window holding [p, p + bytes), or null.
  const Window* window_of(const void* p, size_t bytes) const;

  StoreClient& store_;  // outlives the communicator (the job's rendezvous)
  std::string name_;
  int rank_ = 0;
  int size_ = 1;
  IpcOptions options_;
  void* arena_ = nullptr;  // this rank's arena (cudaMalloc)
  ipc::Peers peers_;       // every rank's arena base here (peers' opened through IPC)
  std::shared_ptr<IpcErrorState> errors_;  // the host-mapped error word (also in Works)
  std::vector<std::unique_ptr<Window>> windows_;
  int64_t windows_registered_ = 0;
};

std::unique_ptr<Communicator> make_ipc_communicator(StoreClient& store, const std::string& name,
                                                    int rank, int size, Device device,
                                                    const IpcOptions& options = {});

// The IPC backend of the GTP send pool (memory/symmetric_pool.h): each buffer its own cudaMalloc,
// registered as a window of `comm` (Note [IPC windows]). The pool must be destroyed before `comm`.
std::unique_ptr<memory::SymmetricBackend> make_ipc_symmetric_backend(IpcCommunicator& comm);

}  // namespace gtron::parallel

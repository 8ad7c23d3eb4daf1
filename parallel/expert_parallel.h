// The expert-parallel group of the model (model/ops/ep_comm.h) over a Communicator: the routed
// tokens' all-to-all of Note [expert parallelism] in model/moe.h.
//
// Ordering: every exchange is issued on the current stream of the tensors' device (Gloo queues it
// from a closure of the CPU stream) and the stream then waits for it (a CPU stream blocks). No host
// sync of its own, except for host tensors over a CUDA communicator (NCCL, IPC: a CUDA MoE
// layer's counts), which are staged through the device; the host then waits for the result.
//
// Thread safety: one thread (the training thread) drives it.
#pragma once

#include <cstdint>
#include <vector>

#include "model/ops/ep_comm.h"
#include "parallel/communicator.h"

namespace gtron::parallel {

class CommExpertParallel final : public ExpertParallelGroup {
 public:
  // REQUIRES: `comm` outlives this object.
  explicit CommExpertParallel(Communicator* comm) : comm_(comm) {}

  int rank() const override { return comm_->rank(); }
  int size() const override { return comm_->size(); }
  void all_to_all(const Tensor& in, const std::vector<int64_t>& send, Tensor& out,
                  const std::vector<int64_t>& recv) override;

 private:
  Communicator* comm_;
};

}  // namespace gtron::parallel

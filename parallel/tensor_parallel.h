// The tensor-parallel group of the model (model/ops/tp_comm.h) over a Communicator, and the
// collective halves of unsharded checkpoints at TP > 1 (Note [tensor-parallel layout] in
// model/tensor_parallel.h).
//
// Ordering: every collective is issued on the current stream of the tensor's device (Gloo queues
// it from a closure of the CPU stream, so a capture records it) and the stream then waits for it
// (a CPU stream blocks, or records the wait while capturing). No host sync of its own.
//
// Thread safety: one thread (the training thread) drives it.
#pragma once

#include <vector>

#include "model/tensor_parallel.h"
#include "parallel/communicator.h"

namespace gtron::parallel {

class CommTensorParallel final : public TensorParallelGroup {
 public:
  // REQUIRES: `comm` outlives this object.
  explicit CommTensorParallel(Communicator* comm) : comm_(comm) {}

  int rank() const override { return comm_->rank(); }
  int size() const override { return comm_->size(); }
  void all_reduce(Tensor& t, TpReduce op) override;
  void all_gather(const Tensor& in, Tensor& out) override;

  // The full CPU tensor of which `local` (shape of this rank's part) is this rank's part, split
  // as `slice` says. Collective over the group.
  Tensor gather_full(const Tensor& local, const TpSlice& slice);

  // Sums copies of replicated rows' gradients over the `replicas` consecutive ranks holding them
  // (Note [replicated key/value heads] in model/tensor_parallel.h): afterwards each of `copies`
  // holds the sum of the R ranks' copies, bit-identical on all of them. One all-reduce over the
  // group, each rank's copies at its head's slot r / R of a zeroed buffer, so the sum is the
  // group's fixed reduction order. REQUIRES: every rank passes copies of the same sizes in the
  // same order, f32 on the communicator's device; R > 1 divides size(). Collective; ordered on
  // the current stream (no host sync).
  void sum_replicated(const std::vector<Tensor>& copies, int replicas);

 private:
  Communicator* comm_;
};

}  // namespace gtron::parallel

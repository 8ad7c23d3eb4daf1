#include "parallel/tensor_parallel.h"

#include "model/stream.h"

namespace gtron::parallel {

void CommTensorParallel::all_reduce(Tensor& t, TpReduce op) {
  Work w = comm_->all_reduce(t, op == TpReduce::kMax ? ReduceOp::kMax : ReduceOp::kSum);
  w.wait(current_stream(t.device()));
}

void CommTensorParallel::all_gather(const Tensor& in, Tensor& out) {
  Work w = comm_->all_gather(in, out);
  w.wait(current_stream(out.device()));
}

Tensor CommTensorParallel::gather_full(const Tensor& local, const TpSlice& slice) {
  // Gathered on local's device (NCCL reads device memory), cut into place on the host.
  Tensor flat = local.clone().view(Shape{local.numel()});
  Tensor parts = Tensor::empty(Shape{local.numel() * size()}, local.dtype(), local.device());
  comm_->all_gather(flat, parts).synchronize();
  if (parts.device().is_cuda()) parts = parts.to(Device::cpu());
  return tp_full_of(parts, local.shape(), slice, size());
}

}  // namespace gtron::parallel

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

void CommTensorParallel::sum_replicated(const std::vector<Tensor>& copies, int replicas) {
  GTRON_CHECK(replicas > 1 && size() % replicas == 0, "sum_replicated: groups of ", replicas,
              " in a TP group of ", size());
  int64_t m = 0;
  for (const Tensor& t : copies) {
    GTRON_CHECK(t.dtype() == DType::kF32 && t.device() == comm_->device(),
                "sum_replicated: f32 tensors on ", comm_->device().str());
    m += t.numel();
  }
  if (m == 0) return;
  Stream& s = current_stream(comm_->device());
  // [size / R, m]: slot j holds the copies of the ranks sharing head j; the others stay zero, and
  // x + 0 is x, so the sum is over the R copies only.
  Tensor buf = Tensor::zeros({size() / replicas * m}, DType::kF32, comm_->device(), &s);
  const int64_t slot = rank() / replicas * m;
  int64_t off = slot;
  for (const Tensor& t : copies) {
    buf.rows(off, off + t.numel()).copy_from(t.view({t.numel()}), &s);
    off += t.numel();
  }
  comm_->all_reduce(buf, ReduceOp::kSum).wait(s);
  off = slot;
  for (const Tensor& t : copies) {
    Tensor dst = t.view({t.numel()});
    dst.copy_from(buf.rows(off, off + t.numel()), &s);
    off += t.numel();
  }
}

}  // namespace gtron::parallel

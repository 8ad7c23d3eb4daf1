#include "parallel/self_communicator.h"

namespace gtron::parallel {

Work SelfCommunicator::all_gather(const Tensor& in, Tensor& out) {
  check_all_gather_args(*this, in, out);
  out.copy_from(in);  // on the current stream: ordered after earlier work, as the contract says
  return Work();
}

Work SelfCommunicator::reduce_scatter(const Tensor& in, Tensor& out, ReduceOp) {
  check_reduce_scatter_args(*this, in, out);
  out.copy_from(in);
  return Work();
}

Work SelfCommunicator::all_reduce(Tensor& inout, ReduceOp) {
  check_tensor_args(*this, "all_reduce", inout);
  return Work();
}

Work SelfCommunicator::broadcast(Tensor& inout, int root) {
  check_tensor_args(*this, "broadcast", inout);
  check_broadcast_root(*this, root);
  return Work();
}

Work SelfCommunicator::all_to_all(const Tensor& in, const std::vector<int64_t>& send_counts,
                                  Tensor& out, const std::vector<int64_t>& recv_counts) {
  check_all_to_all_args(*this, in, send_counts, out, recv_counts);
  if (in.numel() > 0) out.copy_from(in);
  return Work();
}

}  // namespace gtron::parallel

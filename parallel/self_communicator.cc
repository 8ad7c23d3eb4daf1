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

}  // namespace gtron::parallel

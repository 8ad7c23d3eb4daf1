#include "parallel/communicator.h"

#include "model/check.h"

namespace gtron::parallel {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMax:
      return "max";
  }
  return "?";
}

void check_tensor_args(const Communicator& comm, const char* op, const Tensor& t) {
  GTRON_CHECK(t.defined(), op, " on communicator '", comm.name(), "': undefined tensor");
  GTRON_CHECK(t.device() == comm.device(), op, " on communicator '", comm.name(), "' (",
              comm.device().str(), "): tensor on ", t.device().str());
}

void check_all_gather_args(const Communicator& comm, const Tensor& in, const Tensor& out) {
  check_tensor_args(comm, "all_gather", in);
  check_tensor_args(comm, "all_gather", out);
  GTRON_CHECK(in.dtype() == out.dtype(), "all_gather: in is ", dtype_name(in.dtype()), ", out is ",
              dtype_name(out.dtype()));
  GTRON_CHECK(out.numel() == comm.size() * in.numel(), "all_gather on '", comm.name(),
              "': out has ", out.numel(), " elements, expected size ", comm.size(), " x ",
              in.numel());
}

void check_reduce_scatter_args(const Communicator& comm, const Tensor& in, const Tensor& out) {
  check_tensor_args(comm, "reduce_scatter", in);
  check_tensor_args(comm, "reduce_scatter", out);
  GTRON_CHECK(in.dtype() == out.dtype(), "reduce_scatter: in is ", dtype_name(in.dtype()),
              ", out is ", dtype_name(out.dtype()));
  GTRON_CHECK(in.numel() == comm.size() * out.numel(), "reduce_scatter on '", comm.name(),
              "': in has ", in.numel(), " elements, expected size ", comm.size(), " x ",
              out.numel());
}

void check_broadcast_root(const Communicator& comm, int root) {
  GTRON_CHECK(root >= 0 && root < comm.size(), "broadcast on '", comm.name(), "': root ", root,
              " outside [0, ", comm.size(), ")");
}

}  // namespace gtron::parallel

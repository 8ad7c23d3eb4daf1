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

Work Communicator::all_to_all(const Tensor& in, const std::vector<int64_t>& send_counts,
                              Tensor& out, const std::vector<int64_t>& recv_counts) {
  (void)in;
  (void)send_counts;
  (void)out;
  (void)recv_counts;
  throw CommError(str_cat("all_to_all is not built for communicator '", name(), "' on ",
                          device().str(),
                          ". Hint: expert parallelism (parallel.ep) runs over Gloo (the CPU) "
                          "and NCCL; use one of them"));
}

void check_all_to_all_args(const Communicator& comm, const Tensor& in,
                           const std::vector<int64_t>& send_counts, const Tensor& out,
                           const std::vector<int64_t>& recv_counts) {
  check_tensor_args(comm, "all_to_all", in);
  check_tensor_args(comm, "all_to_all", out);
  GTRON_CHECK(in.dtype() == out.dtype(), "all_to_all: in is ", dtype_name(in.dtype()), ", out is ",
              dtype_name(out.dtype()));
  const size_t n = static_cast<size_t>(comm.size());
  GTRON_CHECK(send_counts.size() == n && recv_counts.size() == n, "all_to_all on '", comm.name(),
              "': ", send_counts.size(), " send and ", recv_counts.size(), " receive counts for ",
              n, " ranks");
  int64_t sent = 0, received = 0;
  for (size_t p = 0; p < n; ++p) {
    GTRON_CHECK(send_counts[p] >= 0 && recv_counts[p] >= 0, "all_to_all on '", comm.name(),
                "': negative count for rank ", p);
    sent += send_counts[p];
    received += recv_counts[p];
  }
  GTRON_CHECK(in.numel() == sent && out.numel() == received, "all_to_all on '", comm.name(),
              "': in has ", in.numel(), " elements for ", sent, " sent, out ", out.numel(), " for ",
              received, " received");
  GTRON_CHECK(send_counts[static_cast<size_t>(comm.rank())] ==
                  recv_counts[static_cast<size_t>(comm.rank())],
              "all_to_all on '", comm.name(), "': rank ", comm.rank(), " sends itself ",
              send_counts[static_cast<size_t>(comm.rank())], " elements but expects ",
              recv_counts[static_cast<size_t>(comm.rank())]);
}

}  // namespace gtron::parallel

#include "model/ops/ep_comm.h"

#include "model/ops/add.h"
#include "model/stream.h"

namespace gtron {

namespace {

int64_t total(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

std::vector<int64_t> times(const std::vector<int64_t>& rows, int64_t C) {
  std::vector<int64_t> out;
  for (int64_t r : rows) out.push_back(r * C);
  return out;
}

}  // namespace

Var ep_all_to_all(const Var& x, const std::vector<int64_t>& send_rows,
                  const std::vector<int64_t>& recv_rows, ExpertParallelGroup& g) {
  GTRON_CHECK(x.shape().rank() == 2, "ep_all_to_all: x ", x.shape().str(), ", expected [rows, C]");
  const int64_t C = x.shape()[1];
  const size_t P = static_cast<size_t>(g.size());
  GTRON_CHECK(send_rows.size() == P && recv_rows.size() == P, "ep_all_to_all: ", send_rows.size(),
              " send and ", recv_rows.size(), " receive counts in a group of ", P);
  GTRON_CHECK(x.shape()[0] == total(send_rows), "ep_all_to_all: x has ", x.shape()[0],
              " rows, the send counts add up to ", total(send_rows));
  Stream& s = current_stream(x.device());
  Tensor y = Tensor::empty({total(recv_rows), C}, x.dtype(), x.device(), &s);
  g.all_to_all(x.value(), times(send_rows, C), y, times(recv_rows, C));
  Var out = Var::output(y, x.requires_grad());
  if (out.requires_grad()) {
    ExpertParallelGroup* group = &g;
    record_backward([x, out, send_rows, recv_rows, C, group] {
      // Every rank exchanges, whether or not its rows got a gradient (zeros then).
      Stream& st = current_stream(out.device());
      const Tensor dy =
          out.has_grad() ? out.grad() : Tensor::zeros(out.shape(), out.dtype(), out.device(), &st);
      Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device(), &st);
      group->all_to_all(dy, times(recv_rows, C), dx, times(send_rows, C));
      hand_on_gradient(x, dx);
    });
  }
  return out;
}

}  // namespace gtron

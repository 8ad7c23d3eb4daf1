// The expert-parallel seam of the ops: the all-to-all an expert-parallel mixture of experts needs
// (Note [expert parallelism] in model/moe.h), behind an interface the model sees
// (parallel/expert_parallel.h implements it over a Communicator), and the autograd op built on it.
//
// Every rank of the group records the same ops in the same order (SPMD): the forward's exchanges
// and, in reverse, the backward's. A rank with no rows to send or receive still takes part.
#pragma once

#include <cstdint>
#include <vector>

#include "model/autograd.h"

namespace gtron {

class ExpertParallelGroup {
 public:
  virtual ~ExpertParallelGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // All-to-all-v in elements (Communicator::all_to_all's contract): `in` holds size() blocks in
  // rank order, send[p] elements for rank p; `out` receives recv[q] elements from each rank q, in
  // rank order. Ordered on the current stream of the tensors' device: it starts after the work
  // queued there, and the work queued after it sees `out` (a CPU stream blocks until then). Host
  // tensors over a device group are staged through the device, and `out` is filled on return.
  virtual void all_to_all(const Tensor& in, const std::vector<int64_t>& send, Tensor& out,
                          const std::vector<int64_t>& recv) = 0;
};

// x: [Σ send_rows, C] -> [Σ recv_rows, C]: block p of x (send_rows[p] rows) goes to rank p, block
// q of the result comes from rank q. REQUIRES: recv_rows[q] here == send_rows[this rank] on rank q.
// Backward accumulates dx += the reverse exchange of dy (recv_rows out, send_rows in); it runs
// even where dy was never written (zeros are sent), so every rank's backward meets its peers'.
Var ep_all_to_all(const Var& x, const std::vector<int64_t>& send_rows,
                  const std::vector<int64_t>& recv_rows, ExpertParallelGroup& g);

}  // namespace gtron

#include "parallel/expert_parallel.h"

#include "model/stream.h"

namespace gtron::parallel {

void CommExpertParallel::all_to_all(const Tensor& in, const std::vector<int64_t>& send, Tensor& out,
                                    const std::vector<int64_t>& recv) {
  Work w = comm_->all_to_all(in, send, out, recv);
  w.wait(current_stream(out.device()));
}

}  // namespace gtron::parallel

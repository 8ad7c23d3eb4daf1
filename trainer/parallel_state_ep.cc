// ParallelState's expert-parallel checkpoint half (parallel_state.h, "× EP"): the EP ranks'
// routed experts gathered into one checkpoint under their global names.
#include "model/moe.h"
#include "trainer/parallel_state.h"

namespace gtron {

void ParallelState::append_experts(std::vector<NamedTensor>& out,
                                   std::vector<NamedTensor>& experts) {
  if (experts.empty()) return;
  GTRON_CHECK(ep_ != nullptr && grid_ != nullptr, "expert tensors to gather without EP");
  parallel::Communicator& comm = *grid_->ep;
  const int P = comm.size(), r = comm.rank();
  const int held = model_.config().moe.E / P;  // experts per EP rank
  // One all-gather of the run laid end to end: every EP rank's run has the same shapes (the same
  // layers, the same number of experts), in the same order.
  int64_t n = 0;
  for (const NamedTensor& t : experts) n += t.tensor.numel();
  Tensor mine = Tensor::empty({n}, DType::kF32);
  int64_t at = 0;
  for (const NamedTensor& t : experts) {
    GTRON_CHECK(t.tensor.dtype() == DType::kF32 && t.tensor.device().is_cpu(), t.name,
                ": expected an f32 host tensor");
    mine.rows(at, at + t.tensor.numel()).copy_from(t.tensor.view({t.tensor.numel()}));
    at += t.tensor.numel();
  }
  Tensor all = Tensor::empty({P * n}, DType::kF32, comm.device());
  comm.all_gather(mine.to(comm.device()), all).synchronize();
  if (all.device().is_cuda()) all = all.to(Device::cpu());
  for (int q = 0; q < P; ++q) {
    at = q * n;
    for (const NamedTensor& t : experts) {
      const std::string name = moe_expert_shifted(t.name, (q - r) * held);
      GTRON_CHECK(!name.empty(), t.name, " is not a routed expert's tensor");
      out.push_back({name, all.rows(at, at + t.tensor.numel()).clone().view(t.tensor.shape())});
      at += t.tensor.numel();
    }
  }
  experts.clear();
}

}  // namespace gtron

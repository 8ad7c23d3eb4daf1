// The Run's mixture-of-experts and model-buffer pieces (run.h): the MoE metric columns, the
// data ranks' expert load sum, and the model's buffers (router biases) from a checkpoint.
#include <string>
#include <utility>
#include <vector>

#include "trainer/run.h"

namespace gtron::internal {

// The MoE layers' load and balance (model/moe.h) as metric columns: per MoE block l, the fewest
// and most routed slots an expert received in the step, their coefficient of variation, the
// balance loss (when weighted) and the router bias norm (sigmoid router).
std::vector<std::pair<std::string, double>> moe_metric_columns(
    const std::vector<MoeLayerStats>& stats, const MoeConfig& moe) {
  std::vector<std::pair<std::string, double>> out;
  for (const MoeLayerStats& s : stats) {
    const std::string p = "moe" + std::to_string(s.layer) + "_";
    out.push_back({p + "load_min", static_cast<double>(s.tokens_min)});
    out.push_back({p + "load_max", static_cast<double>(s.tokens_max)});
    out.push_back({p + "load_cv", s.load_cv});
    if (moe.aux_loss_weight > 0) out.push_back({p + "aux", s.aux_loss});
    if (moe.router == MoeRouterChoice::kSigmoid) out.push_back({p + "bias_norm", s.bias_norm});
  }
  return out;
}

void Run::sum_moe_load() {
  const std::vector<int64_t> load = model_->moe_load();
  std::vector<double> v(load.begin(), load.end());  // exact: counts far below 2^53
  Tensor t = Tensor::from_vector(v, {static_cast<int64_t>(v.size())}, DType::kF64);
  parallel::Communicator& comm = *grid_.data_group();
  if (comm.device().is_cuda()) t = t.to(comm.device());  // NCCL and IPC reduce device memory
  comm.all_reduce(t, parallel::ReduceOp::kSum).synchronize();
  std::vector<int64_t> sum;
  for (double x : t.to_vector()) sum.push_back(static_cast<int64_t>(x));
  model_->set_moe_load(sum);
}

void Run::load_buffers(const CheckpointTensors& c, const std::string& dir) {
  for (auto& [name, tensor] : model_->buffers()) {
    tensor.copy_from(checked_tensor(c.params, name, tensor.shape(), dir + "/model.safetensors"));
  }
}

}  // namespace gtron::internal

#include "model/moe.h"

#include <algorithm>
#include <cmath>

#include "model/ops/add.h"
#include "model/ops/grouped_linear.h"
#include "model/ops/moe_dispatch.h"
#include "model/ops/swiglu.h"

namespace gtron {

MoeLayer::MoeLayer(ParamRegistry& reg, const std::string& name, int64_t C, const MoeDims& d,
                   double std, double resid_std)
    : d_(d), bias_name_(name + ".router.expert_bias"), load_(static_cast<size_t>(d.E), 0) {
  GTRON_CHECK(d.E > 0 && d.top_k >= 1 && d.top_k <= d.E && d.F > 0 && d.num_shared >= 0,
              "MoE layer ", name, ": E ", d.E, ", top_k ", d.top_k, ", F ", d.F, ", shared ",
              d.num_shared);
  GTRON_CHECK(!reg.tensor_parallel().active(), "MoE layer ", name,
              ": tensor parallelism is not built for MoE yet");
  // Note [MoE layout]: the router keeps full precision (not an FP8 linear, nor an FP8 weight).
  const bool fp8 = reg.fp8_linears();
  reg.set_fp8_linears(false);
  router_ = LinearLayer(reg, name + ".router", C, d.E, false, std);
  reg.set_fp8_linears(fp8);
  for (int e = 0; e < d.E; ++e) {
    const std::string ex = name + ".experts." + std::to_string(e);
    gate_up_.emplace_back(reg, ex + ".gate_up", C, 2 * d.F, false, std);
    down_.emplace_back(reg, ex + ".down", d.F, C, false, resid_std);
  }
  if (d.num_shared > 0) {
    const int64_t Fs = d.num_shared * d.F;
    shared_gate_up_ = LinearLayer(reg, name + ".shared.gate_up", C, 2 * Fs, false, std);
    shared_down_ = LinearLayer(reg, name + ".shared.down", Fs, C, false, resid_std);
  }
  bias_ = Tensor::zeros({d.E}, reg.dtype());
}

Var MoeLayer::forward(const Var& g, WeightAccess& w) {
  GTRON_CHECK(!g.device().is_cuda(), "model.moe: the CUDA path is not built yet");
  const bool sigmoid = d_.router == MoeRouterKind::kSigmoid;
  const bool counting = grad_enabled();

  const Var scores = router_scores(router_.forward(g, w), d_.router);  // [..., E]
  const TopKGates top =
      topk_gates(scores, sigmoid ? bias_ : Tensor(), d_.top_k, sigmoid || d_.norm_topk_prob);
  aux_ = Var();
  if (d_.aux_loss_weight > 0) {
    aux_ = moe_aux_loss(scores, top.ids, d_.aux_loss_weight, /*normalize_rows=*/sigmoid);
    if (counting) last_aux_value_ = aux_.value();
  }
  const MoePlan plan = moe_plan(top.ids, d_.E, counting ? load_.data() : nullptr);

  // The experts over the permuted rows: [N·k, C] -> [N·k, 2F] -> [N·k, F] -> [N·k, C].
  const Var xp = moe_dispatch(g, plan);
  auto grouped = [&](const std::vector<LinearLayer>& layers, const Var& in) {
    std::vector<Var> ws;
    for (const LinearLayer& l : layers) ws.push_back(w.use(*l.weight));
    Var out = grouped_linear(in, ws, plan.offsets, layers[0].fp8);
    for (size_t e = 0; e < layers.size(); ++e) w.used(*layers[e].weight, ws[e]);
    return out;
  };
  const Var hp = swiglu(grouped(gate_up_, xp));
  const Var y = moe_combine(grouped(down_, hp), top.gates, plan, g.shape());
  if (d_.num_shared == 0) return y;
  return add(y, shared_down_.forward(swiglu(shared_gate_up_.forward(g, w)), w));
}

Var MoeLayer::take_aux_loss() {
  Var a = aux_;
  aux_ = Var();
  return a;
}

MoeLayerStats MoeLayer::stats(int layer) const {
  MoeLayerStats s;
  s.layer = layer;
  s.tokens = load_;
  s.tokens_min = *std::min_element(load_.begin(), load_.end());
  s.tokens_max = *std::max_element(load_.begin(), load_.end());
  double sum = 0;
  for (int64_t t : load_) sum += static_cast<double>(t);
  const double mean = sum / static_cast<double>(load_.size());
  double var = 0;
  for (int64_t t : load_) var += (static_cast<double>(t) - mean) * (static_cast<double>(t) - mean);
  var /= static_cast<double>(load_.size());
  s.load_cv = mean > 0 ? std::sqrt(var) / mean : 0;
  s.aux_loss = last_aux_value_.defined() ? last_aux_value_.item() : 0;
  double b2 = 0;
  for (double b : bias_.to_vector()) b2 += b * b;
  s.bias_norm = std::sqrt(b2);
  return s;
}

void MoeLayer::update_bias() {
  if (d_.router == MoeRouterKind::kSigmoid && d_.bias_update_rate > 0) {
    int64_t total = 0;
    for (int64_t t : load_) total += t;
    // mean_load − load_e compared in integers: total − E·load_e has the sign of the difference.
    std::vector<double> b = bias_.to_vector();
    for (size_t e = 0; e < b.size(); ++e) {
      const int64_t diff = total - static_cast<int64_t>(b.size()) * load_[e];
      b[e] += d_.bias_update_rate * static_cast<double>((diff > 0) - (diff < 0));
    }
    bias_.copy_from(Tensor::from_vector(b, bias_.shape(), bias_.dtype()));
  }
  reset_load();
}

void MoeLayer::reset_load() { std::fill(load_.begin(), load_.end(), 0); }

}  // namespace gtron

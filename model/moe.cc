#include "model/moe.h"

#include <algorithm>
#include <cmath>

#include "model/ops/add.h"
#include "model/ops/grouped_linear.h"
#include "model/ops/moe_dispatch.h"
#include "model/ops/swiglu.h"
#include "model/stream.h"

namespace gtron {

std::string moe_expert_weight_name(const std::string& layer, int e, const std::string& matrix) {
  return layer + ".experts." + std::to_string(e) + "." + matrix + ".weight";
}

std::string moe_expert_shifted(const std::string& name, int shift) {
  const std::string tag = ".experts.";
  const size_t at = name.find(tag);
  if (at == std::string::npos) return "";
  const size_t begin = at + tag.size();
  const size_t end = name.find('.', begin);
  if (end == std::string::npos || end == begin) return "";
  const std::string digits = name.substr(begin, end - begin);
  if (digits.find_first_not_of("0123456789") != std::string::npos) return "";
  return name.substr(0, begin) + std::to_string(std::stoi(digits) + shift) + name.substr(end);
}

MoeLayer::MoeLayer(ParamRegistry& reg, const std::string& name, int64_t C, const MoeDims& d,
                   double std, double resid_std)
    : d_(d),
      name_(name),
      bias_name_(name + ".router.expert_bias"),
      load_(static_cast<size_t>(d.E), 0) {
  GTRON_CHECK(d.E > 0 && d.top_k >= 1 && d.top_k <= d.E && d.F > 0 && d.num_shared >= 0,
              "MoE layer ", name, ": E ", d.E, ", top_k ", d.top_k, ", F ", d.F, ", shared ",
              d.num_shared);
  GTRON_CHECK(d.ep_size >= 1 && d.E % d.ep_size == 0 && d.ep_rank >= 0 && d.ep_rank < d.ep_size,
              "MoE layer ", name, ": expert parallelism ", d.ep_size, " (rank ", d.ep_rank,
              ") must divide E ", d.E);
  // Note [MoE layout]: the router keeps full precision (not an FP8 linear, nor an FP8 weight).
  const bool fp8 = reg.fp8_linears();
  reg.set_fp8_linears(false);
  router_ = LinearLayer(reg, name + ".router", C, d.E, false, std);
  reg.set_fp8_linears(fp8);
  // Note [expert parallelism]: only this rank's experts, under their global names (the init is a
  // function of the name, so they hold what one process's copies do).
  const int held = d.E / d.ep_size;
  first_expert_ = d.ep_rank * held;
  for (int e = first_expert_; e < first_expert_ + held; ++e) {
    const std::string ex = name + ".experts." + std::to_string(e);
    gate_up_.emplace_back(reg, ex + ".gate_up", C, 2 * d.F, false, std);
    down_.emplace_back(reg, ex + ".down", d.F, C, false, resid_std);
    reg.mark_routed_expert(*gate_up_.back().weight);
    reg.mark_routed_expert(*down_.back().weight);
  }
  if (d.num_shared > 0) {
    const int64_t Fs = d.num_shared * d.F;
    shared_gate_up_ = LinearLayer(reg, name + ".shared.gate_up", C, 2 * Fs, false, std);
    shared_down_ = LinearLayer(reg, name + ".shared.down", Fs, C, false, resid_std);
  }
  const Device dev = router_.weight->data.device();
  if (dev.is_cuda()) {  // Note [MoE on CUDA]: the bias and the load counters on the device
    GTRON_CHECK(d.E <= cuda::kMaxExperts, "MoE layer ", name, ": ", d.E,
                " experts; CUDA takes at most ", cuda::kMaxExperts);
    bias_ = Tensor::zeros({d.E}, DType::kF32, dev);
    load_dev_ = Tensor::zeros({d.E}, DType::kI32, dev);
  } else {
    bias_ = Tensor::zeros({d.E}, reg.dtype());
  }
}

bool MoeLayer::holds_elsewhere(const std::string& name) const {
  const int held = d_.E / d_.ep_size;
  for (int e = 0; e < d_.E; ++e) {
    if (e >= first_expert_ && e < first_expert_ + held) continue;
    for (const char* m : {"gate_up", "down"})
      if (name == moe_expert_weight_name(name_, e, m)) return true;
  }
  return false;
}

Var MoeLayer::experts(const Var& rows, const Tensor& offsets, WeightAccess& w,
                      const MoePlan* gather) {
  auto grouped = [&](const std::vector<LinearLayer>& layers, const Var& in, const MoePlan* plan) {
    // Note [grouped GEMM on fp32 masters]: bf16 rows on CUDA may read the fp32 masters.
    const bool masters = in.device().is_cuda() && in.dtype() == DType::kBF16 && !layers[0].fp8 &&
                         cuda::grouped_master_weights();
    std::vector<Var> ws;
    for (const LinearLayer& l : layers)
      ws.push_back(masters ? w.use_master(*l.weight) : w.use(*l.weight));
    Var out = plan != nullptr ? grouped_linear_gathered(in, *plan, ws, layers[0].fp8)
                              : grouped_linear(in, ws, offsets, layers[0].fp8);
    for (size_t e = 0; e < layers.size(); ++e) w.used(*layers[e].weight, ws[e]);
    return out;
  };
  // [M, C] -> [M, 2F] -> [M, F] -> [M, C]
  return grouped(down_, swiglu(grouped(gate_up_, rows, gather)), nullptr);
}

namespace {

// The one-slot plan that regroups rows arriving as (source rank q, local expert j, token) into
// (j, q, token) order, from counts[q·El + j] (rows of local expert j from rank q); its offsets are
// the local experts'. The inverse regrouping swaps pos and src.
MoePlan regroup_plan(const std::vector<int32_t>& counts, int P, int El) {
  std::vector<int32_t> start(counts.size());  // first arriving row of block (q, j)
  int32_t at = 0;
  for (size_t b = 0; b < counts.size(); ++b) {
    start[b] = at;
    at += counts[b];
  }
  std::vector<int32_t> src, pos(static_cast<size_t>(at)), offsets{0};
  for (int j = 0; j < El; ++j) {
    for (int q = 0; q < P; ++q) {
      const size_t b = static_cast<size_t>(q * El + j);
      for (int32_t i = 0; i < counts[b]; ++i) {
        pos[static_cast<size_t>(start[b] + i)] = static_cast<int32_t>(src.size());
        src.push_back(start[b] + i);
      }
    }
    offsets.push_back(static_cast<int32_t>(src.size()));
  }
  MoePlan p;
  p.N = at;
  p.k = 1;
  p.E = El;
  p.src = Tensor::from_ints(src, {at});
  p.pos = Tensor::from_ints(pos, {at});
  p.offsets = Tensor::from_ints(offsets, {El + 1});
  return p;
}

}  // namespace

Var MoeLayer::exchange_experts(const Var& xp, const MoePlan& plan, WeightAccess& w) {
  GTRON_CHECK(ep_ != nullptr && ep_->size() == d_.ep_size && ep_->rank() == d_.ep_rank,
              "MoE layer ", name_, ": expert parallelism ", d_.ep_size,
              " needs its group set (GPT::set_expert_parallel)");
  GTRON_CHECK(!current_stream(xp.device()).capturing(),
              "expert parallelism reads the routing on the host: no graph capture");
  const int P = d_.ep_size, El = d_.E / P;
  std::vector<int32_t> mine(static_cast<size_t>(d_.E));
  if (xp.device().is_cuda()) {
    // The known cost of EP on CUDA: a small copy that waits for the plan (Note [expert
    // parallelism]).
    const std::vector<double> off = plan.offsets.to_vector();
    for (int e = 0; e < d_.E; ++e) {
      mine[static_cast<size_t>(e)] = static_cast<int32_t>(off[e + 1] - off[e]);
    }
  } else {
    // The plan's closure has run (a CPU stream not capturing): its offsets are on the host.
    const int32_t* off = plan.offsets.data<int32_t>();
    for (int e = 0; e < d_.E; ++e) mine[static_cast<size_t>(e)] = off[e + 1] - off[e];
  }
  std::vector<int64_t> send_rows(static_cast<size_t>(P), 0);
  for (int e = 0; e < d_.E; ++e)
    send_rows[static_cast<size_t>(e / El)] += mine[static_cast<size_t>(e)];
  // Step 2: El counts to each peer, El from each (host tensors: a CUDA group stages them).
  Tensor counts_out = Tensor::from_ints(mine, {d_.E});
  Tensor counts_in = Tensor::zeros({d_.E}, DType::kI32);
  const std::vector<int64_t> each(static_cast<size_t>(P), El);
  ep_->all_to_all(counts_out, each, counts_in, each);
  const int32_t* in = counts_in.data<int32_t>();
  const std::vector<int32_t> arriving(in, in + d_.E);  // [q·El + j]
  std::vector<int64_t> recv_rows(static_cast<size_t>(P), 0);
  for (int b = 0; b < d_.E; ++b)
    recv_rows[static_cast<size_t>(b / El)] += arriving[static_cast<size_t>(b)];
  // Steps 3 to 5.
  MoePlan regroup = regroup_plan(arriving, P, El);
  if (xp.device().is_cuda()) {  // the permutation's indices where its kernels run
    Stream& s = current_stream(xp.device());
    for (Tensor* t : {&regroup.src, &regroup.pos, &regroup.offsets}) *t = t->to(xp.device(), &s);
  }
  MoePlan back = regroup;
  std::swap(back.src, back.pos);
  const Var rows = moe_dispatch(ep_all_to_all(xp, send_rows, recv_rows, *ep_), regroup);
  const Var out = moe_dispatch(experts(rows, regroup.offsets, w), back);
  return ep_all_to_all(out, recv_rows, send_rows, *ep_);
}

Var MoeLayer::forward(const Var& g, WeightAccess& w) {
  const bool cuda = g.device().is_cuda();
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
  const MoePlan plan = cuda ? moe_plan(top.ids, d_.E, nullptr, counting ? load_dev_ : Tensor())
                            : moe_plan(top.ids, d_.E, counting ? load_.data() : nullptr);

  // The experts over the permuted rows, [N·k, C] in expert order, here or across the EP group
  // (Note [regathered expert rows]: at EP = 1 the first product may gather them itself).
  Var yp;
  if (d_.ep_size > 1) {
    yp = exchange_experts(moe_dispatch(g, plan), plan, w);
  } else if (grouped_gather_rows()) {
    yp = experts(g, plan.offsets, w, &plan);
  } else {
    yp = experts(moe_dispatch(g, plan), plan.offsets, w);
  }
  const Var y = moe_combine(yp, top.gates, plan, g.shape());
  if (d_.num_shared == 0) return y;
  return add(y, shared_down_.forward(swiglu(shared_gate_up_.forward(g, w)), w));
}

Var MoeLayer::take_aux_loss() {
  Var a = aux_;
  aux_ = Var();
  return a;
}

std::vector<int64_t>& MoeLayer::load() {
  pull_load();
  return load_;
}

void MoeLayer::pull_load() const {
  if (!load_dev_.defined()) return;
  const std::vector<double> counts = load_dev_.to_vector();  // waits for the plan kernels
  for (size_t e = 0; e < load_.size(); ++e) load_[e] += static_cast<int64_t>(counts[e]);
  load_dev_.zero_(&current_stream(load_dev_.device()));
}

MoeLayerStats MoeLayer::stats(int layer) const {
  pull_load();
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
  pull_load();
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

void MoeLayer::reset_load() {
  if (load_dev_.defined()) load_dev_.zero_(&current_stream(load_dev_.device()));
  std::fill(load_.begin(), load_.end(), 0);
}

}  // namespace gtron

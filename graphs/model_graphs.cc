#include "graphs/model_graphs.h"

#include <string>

namespace gtron::graphs {

ModelGraphs::ModelGraphs(GPT& model, Scope scope, Device device, GraphOptions opt)
    : model_(model), scope_(scope), pool_(device) {
  WeightAccess* w = &model.weight_access();
  GPT* m = &model;
  if (scope == Scope::kLayers) {
    for (int l = 0; l < model.num_blocks(); ++l) {
      runners_.push_back(std::make_unique<GraphRunner>(
          "blocks." + std::to_string(l),
          [m, l](const std::vector<Var>& in) {
            return std::vector<Var>{m->block_forward(l, in[0])};
          },
          device, w, &pool_, opt));
    }
    model.set_block_runner(
        [this](int l, const Var& x) { return (*runners_[static_cast<size_t>(l)])({x})[0]; });
  } else if (scope == Scope::kFull) {
    runners_.push_back(std::make_unique<GraphRunner>(
        "micro-batch",
        [m](const std::vector<Var>& in) {
          GPTOutput o = m->forward(in[0].value());
          std::vector<Var> outs{o.loss, o.main_loss};
          outs.insert(outs.end(), o.mtp_losses.begin(), o.mtp_losses.end());
          return outs;
        },
        device, w, &pool_, opt));
  }
}

ModelGraphs::~ModelGraphs() {
  if (scope_ == Scope::kLayers) model_.set_block_runner(nullptr);
  runners_.clear();  // before the pool
}

GPTOutput ModelGraphs::forward(const Tensor& window) {
  if (scope_ != Scope::kFull) return model_.forward(window);
  std::vector<Var> outs = (*runners_[0])({Var::constant(window)});
  GPTOutput o;
  o.loss = outs[0];
  o.main_loss = outs[1];
  o.mtp_losses.assign(outs.begin() + 2, outs.end());
  return o;
}

void ModelGraphs::reset() {
  for (auto& r : runners_) r->reset();
}

RunnerStats ModelGraphs::stats() const {
  RunnerStats t;
  for (const auto& r : runners_) {
    t.eager_calls += r->stats().eager_calls;
    t.captures += r->stats().captures;
    t.replays += r->stats().replays;
    t.nodes += r->stats().nodes;
  }
  return t;
}

}  // namespace gtron::graphs

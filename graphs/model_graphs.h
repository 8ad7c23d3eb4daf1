// Graph capture for a GPT (config `graphs.scope`):
// - none:   everything eager (this class is a pass-through);
// - layers: one GraphRunner per main-model transformer block, installed as the model's block
//           runner; the embedding, MTP depths, final norm, head and loss stay eager;
// - full:   one GraphRunner over the whole micro-batch (forward() below): embedding to loss and
//           back. The optimizer, the DP reductions (grad-ready hooks fire after each replay) and
//           the DP parameter gathers (made ready before each replay) stay outside.
// The runners share one private pool. Graphs are deleted with this object (or by reset()).
//
// Thread safety: one thread (the training thread) drives it.
#pragma once

#include <memory>
#include <vector>

#include "graphs/graph_runner.h"
#include "model/gpt.h"

namespace gtron::graphs {

enum class Scope { kNone, kLayers, kFull };

class ModelGraphs {
 public:
  // `model` (and its weight access, fixed from now on) outlives this object.
  ModelGraphs(GPT& model, Scope scope, Device device, GraphOptions opt = {});
  ~ModelGraphs();
  ModelGraphs(const ModelGraphs&) = delete;
  ModelGraphs& operator=(const ModelGraphs&) = delete;

  // The model's forward for one micro-batch window (see GPT::forward), graphed per the scope.
  GPTOutput forward(const Tensor& window);
  void reset();

  Scope scope() const { return scope_; }
  // Totals over the runners.
  RunnerStats stats() const;

 private:
  GPT& model_;
  Scope scope_;
  GraphPool pool_;
  std::vector<std::unique_ptr<GraphRunner>> runners_;  // layers: one per block; full: one
};

}  // namespace gtron::graphs

// The decoder's step capture (model/step_graphs.h, Note [decode graphs] in model/decoder.h) on
// graphs::Graph: a CUDA graph per step (CPU: the recorded closures), every capture allocating
// from one private GraphPool. The steps replay one at a time on one stream, so they share it.
//
// Thread safety: one thread (the decoding thread) drives it.
#pragma once

#include "graphs/graph_runner.h"
#include "model/step_graphs.h"

namespace gtron::graphs {

class DecodeGraphs final : public StepGraphs {
 public:
  // Captures on streams of `device`. Outlives every decoder (and step) it serves: the pool is
  // released on destruction.
  explicit DecodeGraphs(Device device) : pool_(device) {}

  std::unique_ptr<StepGraph> capture(Stream& stream, const std::function<void()>& body) override;

  Device device() const { return pool_.device(); }

 private:
  GraphPool pool_;
};

}  // namespace gtron::graphs

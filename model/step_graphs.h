// The seam through which the decoder (model/decoder.h, Note [decode graphs]) captures a decoding
// step once and replays it later, without model/ depending on graphs/ (ARCHITECTURE.md:
// dependencies point one way). graphs/decode_graphs.h implements it on graphs::Graph and a
// private graphs::GraphPool; a decoder given none runs every step eagerly.
//
// Thread safety: one thread drives an implementation and the steps it captured.
#pragma once

#include <functional>
#include <memory>

#include "model/stream.h"

namespace gtron {

// One captured step: the work its body put on the capture's stream.
class StepGraph {
 public:
  virtual ~StepGraph() = default;
  // Runs the captured work on `stream`, the stream it was captured on.
  virtual void replay(Stream& stream) const = 0;
};

class StepGraphs {
 public:
  virtual ~StepGraphs() = default;
  // Runs `body` once while capturing `stream` and returns what it captured. Capture rules as
  // graphs/graph.h states them (static shapes, no host sync inside, host logic runs only now).
  // Memory the body allocates comes from the implementation's private pool, so its addresses
  // stay valid for every replay: the implementation outlives the tensors made in its captures.
  // An exception from `body` abandons the capture and propagates.
  virtual std::unique_ptr<StepGraph> capture(Stream& stream, const std::function<void()>& body) = 0;
};

}  // namespace gtron

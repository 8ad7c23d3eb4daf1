#include "graphs/graph.h"

#include <utility>

#include "graphs/cuda_graph.h"
#include "model/check.h"

namespace gtron::graphs {

Graph::~Graph() {
  if (exec_ != nullptr) cuda::destroy(exec_);
}

Graph::Graph(Graph&& o) noexcept
    : closures_(std::move(o.closures_)),
      exec_(std::exchange(o.exec_, nullptr)),
      nodes_(std::exchange(o.nodes_, 0)),
      memsets_folded_(std::exchange(o.memsets_folded_, 0)),
      memsets_hoisted_(std::exchange(o.memsets_hoisted_, 0)),
      captured_(std::exchange(o.captured_, false)) {}

Graph& Graph::operator=(Graph&& o) noexcept {
  if (this != &o) {
    if (exec_ != nullptr) cuda::destroy(exec_);
    closures_ = std::move(o.closures_);
    exec_ = std::exchange(o.exec_, nullptr);
    nodes_ = std::exchange(o.nodes_, 0);
    memsets_folded_ = std::exchange(o.memsets_folded_, 0);
    memsets_hoisted_ = std::exchange(o.memsets_hoisted_, 0);
    captured_ = std::exchange(o.captured_, false);
  }
  return *this;
}

void Graph::begin_capture(Stream& stream) {
  if (stream.device().is_cuda()) cuda::begin_capture(stream.native());
  stream.begin_capture();
}

Graph Graph::end_capture(Stream& stream) {
  Graph g;
  g.closures_ = stream.end_capture();
  g.nodes_ = g.closures_.size();
  g.captured_ = true;
  if (stream.device().is_cuda()) {
    g.exec_ =
        cuda::end_capture(stream.native(), &g.nodes_, &g.memsets_folded_, &g.memsets_hoisted_);
  }
  return g;
}

void Graph::abort_capture(Stream& stream) noexcept {
  try {
    if (stream.capturing()) stream.end_capture();
    if (stream.device().is_cuda()) cuda::abort_capture(stream.native());
  } catch (...) {
  }
}

void Graph::replay(Stream& stream) const {
  GTRON_CHECK(!stream.capturing(), "replaying a graph into a capture");
  if (exec_ != nullptr) {
    cuda::launch(exec_, stream.native());
    return;
  }
  for (const auto& fn : closures_) fn();
}

}  // namespace gtron::graphs

#include "graphs/decode_graphs.h"

#include <utility>

#include "model/check.h"
#include "model/tensor.h"

namespace gtron::graphs {
namespace {

class CapturedStep final : public StepGraph {
 public:
  explicit CapturedStep(Graph graph) : graph_(std::move(graph)) {}
  void replay(Stream& stream) const override { graph_.replay(stream); }

 private:
  Graph graph_;
};

}  // namespace

std::unique_ptr<StepGraph> DecodeGraphs::capture(Stream& stream,
                                                 const std::function<void()>& body) {
  GTRON_CHECK(stream.device() == pool_.device(), "a decode step captured on ",
              stream.device().str(), " with a graph pool on ", pool_.device().str());
  PrivatePoolGuard pool(pool_.device(), pool_.id());
  Graph::begin_capture(stream);
  try {
    body();
  } catch (...) {
    Graph::abort_capture(stream);
    throw;
  }
  return std::make_unique<CapturedStep>(Graph::end_capture(stream));
}

}  // namespace gtron::graphs

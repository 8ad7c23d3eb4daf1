// One captured graph, on either backend (ARCHITECTURE.md):
// - CPU: the closures a CPU stream recorded between begin_capture() and end_capture() (every
//   kernel, copy, event record/wait and collective submission of the region goes through
//   Stream::run); replay runs them in order on the calling thread.
// - CUDA: a cudaGraphExec_t instantiated from a stream capture; replay is one cudaGraphLaunch.
// Capture rules (both backends): static shapes; no host sync and no event query inside; memory
// allocated inside comes from the runner's private pool (PrivatePoolGuard); host-side logic runs
// once, at capture, and only what reached the stream replays.
//
// Owns its graph (RAII, movable). Used by one thread.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "model/stream.h"

namespace gtron::graphs {

class Graph {
 public:
  Graph() = default;
  ~Graph();
  Graph(Graph&& o) noexcept;
  Graph& operator=(Graph&& o) noexcept;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  // Starts capturing `stream`. REQUIRES: not capturing already.
  static void begin_capture(Stream& stream);
  // Ends the capture started on `stream` and returns its graph.
  static Graph end_capture(Stream& stream);
  // Ends a capture abandoned by an exception, discarding what was recorded. Never throws.
  static void abort_capture(Stream& stream) noexcept;

  // Runs the captured work on `stream` (the capture's stream).
  void replay(Stream& stream) const;
  bool valid() const { return captured_; }
  size_t nodes() const { return nodes_; }  // recorded closures or CUDA graph nodes
  // CUDA: small memset nodes turned into kernel nodes, and those moved to the graph's start
  // (Note [small memsets as kernels]).
  size_t memsets_folded() const { return memsets_folded_; }
  size_t memsets_hoisted() const { return memsets_hoisted_; }

 private:
  std::vector<std::function<void()>> closures_;  // CPU
  void* exec_ = nullptr;                         // CUDA: cuda::end_capture's handle
  size_t nodes_ = 0;
  size_t memsets_folded_ = 0;
  size_t memsets_hoisted_ = 0;
  bool captured_ = false;
};

}  // namespace gtron::graphs

// Note [readiness across replay]
// A captured graph bakes in addresses, not values: a replay reads whatever its parameters hold at
// that moment. Parameters can be behind: with the distributed optimizer and overlap_param_gather
// a DP bucket's all-gather is dispatched lazily, from the first read in the next forward (the
// parameter's ready callback, Note [readiness] in parallel/ddp.h). Eagerly, every reader calls
// make_ready() first. A replay runs no host code, so nothing would dispatch the gather: the graph
// would read last step's shard — a finite, plausible, wrong loss. And the DP gather runs once
// per iteration while a graph replays once per micro-batch, so it must never be captured.
// Hence, per runner:
// - during forward capture, a ParamReadLog records every parameter whose make_ready() runs: the
//   ones a captured GTP all-gather reads and the direct reads alike, including the next block's
//   first weight, which this block's prefetch gathers ahead of its owner. The list is kept
//   deduplicated, in order of first read;
// - before every forward replay, each listed parameter's ready callback runs (a pointer check
//   once its bucket is ready, so cheap after the first micro-batch), then the weight access's
//   prepare() (bf16: re-cast a stale shadow outside the graph);
// - before capture the same is done for the list the last warmup read, so that the capture
//   itself never dispatches (or records) a DP gather; DataParallel refuses to dispatch inside a
//   capture;
// - reset() (and the destructor) delete the graphs and clear the lists.
// GraphOptions::readiness = false (tests only) skips the pre-replay calls and shows the bug.
//
// GraphRunner: one region (a transformer block under scope "layers", the whole micro-batch under
// "full") as one autograd node, with one forward and one backward graph per input signature
// (shapes, dtypes, requires-grad), replayed for every micro-batch:
// - calls 1..warmup run eagerly (the first builds the GTP chains and tickets, the second
//   exercises the prefetches and fills the send pool); the next call captures the forward, then
//   replays it; its backward captures the backward graph, then replays it; later calls replay;
// - the capture runs over the caller's input tensors, which the runner then holds: a later call
//   passing the same tensor (a block's input is the previous block's static output) copies
//   nothing; another tensor is copied into the held one. Outputs are the capture's static
//   buffers, valid until the next call of the same signature (a consumer never holds one across
//   micro-batches). A single output's grad slot is a static buffer too, zeroed at each forward
//   replay and shared with the returned Var, so consumers accumulate straight into what the
//   backward graph reads; several outputs' grads are copied in before the backward replay. An
//   input whose grad slot was bound at capture (the previous block's output) lends it to the
//   capture, so the region's backward accumulates straight into it; any other input's grad is
//   added into the caller's after the replay (such an input must have no other consumer whose
//   backward ran before the region's, or the sum would reassociate);
// - memory allocated during capture comes from the GraphPool (a private allocator pool shared by
//   the runners of one model: captures and replays happen in the same order, so blocks freed in
//   one capture can serve a later one);
// - the region runs in capture domain 1 of the weight access (GTP chains and pending
//   reduce-scatters never cross into the eager code), with the weight access told when a capture
//   is running (the send pool's capture guard);
// - the grad-ready hooks the backward capture fires are deferred (GradReadyDeferral) and fired
//   after every backward replay, in the order eager execution fired them: DP communication is
//   never captured.
// Without grad (evaluation, sampling) the region runs eagerly.
//
// Thread safety: one thread (the training thread) drives a runner.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "graphs/graph.h"
#include "model/autograd.h"
#include "model/layers.h"

namespace gtron::graphs {

struct GraphOptions {
  int warmup = 2;         // eager calls per signature before capture (at least 2)
  bool readiness = true;  // tests only: false skips the ready callbacks before replays
};

// A private allocator pool for captured graphs (model/tensor.h PrivatePoolGuard). Released (its
// idle memory returned, the rest handed back to the device's current stream) on destruction.
class GraphPool {
 public:
  // Keeps the pool's segments from the allocator's cache releases while it lives (Note [private
  // pools keep their segments] in memory/caching_allocator.cc).
  explicit GraphPool(Device device);
  ~GraphPool();
  GraphPool(const GraphPool&) = delete;
  GraphPool& operator=(const GraphPool&) = delete;
  Device device() const { return device_; }
  uintptr_t id() const { return reinterpret_cast<uintptr_t>(this); }

 private:
  Device device_;
};

struct RunnerStats {
  int64_t eager_calls = 0;  // warmups and no-grad calls
  int64_t captures = 0;     // forward + backward graphs captured
  int64_t replays = 0;      // forward + backward replays (the first after each capture included)
  int64_t nodes = 0;        // work items in the captured graphs (CPU closures, CUDA graph nodes)
};

class GraphRunner {
 public:
  using Fn = std::function<std::vector<Var>(const std::vector<Var>& inputs)>;

  // `fn` computes the region; it must give the same result eagerly and under capture. `weights`
  // (the model's weight access) and `pool` outlive the runner.
  GraphRunner(std::string name, Fn fn, Device device, WeightAccess* weights, GraphPool* pool,
              GraphOptions opt = {});
  ~GraphRunner();
  GraphRunner(const GraphRunner&) = delete;
  GraphRunner& operator=(const GraphRunner&) = delete;

  // Runs the region (eagerly, capturing or replaying); records one node on the tape.
  std::vector<Var> operator()(const std::vector<Var>& inputs);
  // Deletes every graph, static buffer and readiness list; the next call warms up again.
  void reset();

  // The parameters made ready before each replay, over all signatures (deduplicated, in order).
  std::vector<Parameter*> readiness_list() const;
  const RunnerStats& stats() const { return stats_; }
  const std::string& name() const { return name_; }

 private:
  struct Entry;
  std::vector<Var> warmup(const std::vector<Var>& inputs, Entry& e);
  void capture_forward(Entry& e);
  void backward(const std::shared_ptr<Entry>& e, const std::vector<Var>& outs,
                const std::vector<Var>& inputs);
  // make_ready() then prepare() for each parameter.
  void make_ready(const std::vector<Parameter*>& params);

  std::string name_;
  Fn fn_;
  Device device_;
  WeightAccess* weights_;
  GraphPool* pool_;
  GraphOptions opt_;
  std::map<std::string, std::shared_ptr<Entry>> entries_;  // by input signature
  RunnerStats stats_;
};

}  // namespace gtron::graphs

// Batched finishes of the deterministic column sums (model/cuda/column_sum.cuh): while a thread
// has an active FinishBatch, column_tree_finish queues its (partials, output) pair there instead
// of launching, and flush() finishes every queued pair in one launch per stream, bit for bit what
// the separate launches would have written (Note [deferred column finishes] in
// model/ops/column_scratch.h says who activates a batch and keeps its partials alive).
#pragma once

#include <cstdint>
#include <vector>

namespace gtron::cuda {

class FinishBatch {
 public:
  // Queues out[c] += Σ_j partial[j·C + c] (j < chunks, c < C) on `stream` (a cudaStream_t).
  void add(const float* partial, int64_t chunks, int64_t C, float* out, void* stream);
  // Launches the queued finishes (in as few launches as its argument block allows) and empties
  // the batch. Pairs with the same output are added into it in the order they were queued, as
  // the separate launches would have; the other pairs are independent.
  void flush();
  // Drops the queued finishes without running them.
  void clear() { entries_.clear(); }

 private:
  struct Entry {
    const float* partial;
    int64_t chunks;
    int64_t C;
    float* out;
    void* stream;
  };
  std::vector<Entry> entries_;
};

// (partials, output) pairs finished through batches in this process so far (tests).
int64_t batched_finish_count();

// The batch this thread's column_tree_finish calls go to, or null (they launch at once).
FinishBatch* active_finish_batch();
void set_active_finish_batch(FinishBatch* batch);

}  // namespace gtron::cuda

// Deterministic training windows and the fixed evaluation walk.
//
// Note [layout-independent batches]
// A training window is T+1 consecutive tokens of one shard: inputs x[0..T-1], targets x[1..T]
// (MTP's deeper targets reach x[T] at most; later positions are masked). A window never crosses a
// shard end. Every valid window start of every shard is one point of a single list (shards in
// ShardSet order, starts 0..n_s-T-1 within shard s), so windows are drawn uniformly over all valid
// starts, i.e. shards are weighted by their number of windows.
//
// The window of sequence i of the global batch at step `step` depends only on (seed, step, i):
//   h = splitmix64-chain(seed, step, i);  r = floor(h * W / 2^64)  (W = number of valid windows)
// No state is carried between calls. Any split of the global batch over DP/GTP ranks and micro
// batches, and a resume at any step, therefore sees exactly the same tokens for each global index.
// `i` is the index within the step's global batch (0..global_batch-1), so the caller never has to
// pass global_batch.
//
// Evaluation walks each shard with stride T: windows start at 0, T, 2T, ... while the window fits,
// so every token after a shard's first is a target exactly once (the tail that does not fill a
// window is skipped). Windows are numbered in shard order; callers take index ranges.
#pragma once

#include <cstdint>
#include <vector>

#include "trainer/data/shards.h"

namespace gtron {

// The counter-based hash behind Note [layout-independent batches] (splitmix64 finalizer chain).
uint64_t window_hash(uint64_t seed, int64_t step, int64_t index);

// Training window sampler over a ShardSet. Keeps a reference: the ShardSet must outlive it.
// Immutable after construction; const methods are safe from any thread.
class SequenceSampler {
 public:
  // Throws UserError if T < 1, if any shard has fewer than T+1 tokens (naming the shard), or if a
  // token does not fit int32.
  SequenceSampler(const ShardSet& shards, int64_t T);

  int64_t seq_len() const { return T_; }
  int64_t num_windows() const { return cumulative_.back(); }  // valid starts over all shards

  // The (shard, offset) of sequence `index` of the global batch at `step`.
  void locate(uint64_t seed, int64_t step, int64_t index, int64_t* shard, int64_t* offset) const;

  // Fills out[j * (T+1) + t] = token t of the window of global-batch sequence first_seq + j, for
  // j in [0, count). REQUIRES: step >= 0, first_seq >= 0, count >= 0; out holds count*(T+1) values.
  void sample(uint64_t seed, int64_t step, int64_t first_seq, int64_t count, int32_t* out) const;

 private:
  const ShardSet& shards_;
  int64_t T_;
  std::vector<int64_t> cumulative_;  // [num_shards + 1]: windows in shards before s
};

// One-shot form of SequenceSampler(shards, T).sample(...) (validates the shards on every call).
void sample_sequences(const ShardSet& shards, uint64_t seed, int64_t step, int64_t first_seq,
                      int64_t count, int64_t T, int32_t* out /* count x (T+1) tokens */);

// The fixed, strided evaluation windows of a ShardSet (see the note above). Keeps a reference: the
// ShardSet must outlive it. Thread-safe const methods.
class EvalWindows {
 public:
  // Throws UserError if T < 1, if a token does not fit int32, or if no shard has T+1 tokens.
  EvalWindows(const ShardSet& shards, int64_t T);

  int64_t seq_len() const { return T_; }
  int64_t num_windows() const { return cumulative_.back(); }

  // Fills out[j * (T+1) + t] for windows first .. first+count-1.
  // REQUIRES: 0 <= first, first + count <= num_windows().
  void fill(int64_t first, int64_t count, int32_t* out) const;

 private:
  const ShardSet& shards_;
  int64_t T_;
  std::vector<int64_t> cumulative_;  // [num_shards + 1]: eval windows in shards before s
};

}  // namespace gtron

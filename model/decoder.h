// Runs a GPT's modules over decode windows (Note [decode windows] in model/kv_cache.h) for a batch
// of rows: the main model and each MTP depth keep one KVCache per block, allocated once for the
// context length. The generation loops (model/generate.h) drive it.
//
// Note [MTP hidden stores]
// Depth k at position s combines the hidden state of depth k-1 at s (k = 1: the main model's last
// hidden state, before the final norm) with the embedding of token s+k, as in training
// (model/gpt.h). A depth's window can start before the positions the previous module just ran
// (its cached positions that used drafted tokens are recomputed once the real tokens are known),
// so the decoder keeps, per module feeding a depth, its hidden states at every position:
// stores[k] [B, capacity, C] for k = 0..D-1, written by each window at its real slots.
#pragma once

#include <cstdint>
#include <vector>

#include "model/gpt.h"
#include "model/kv_cache.h"

namespace gtron {

// One window's input: row b feeds tokens[b] (its real slots; empty: the row sits this pass out)
// at positions start[b], start[b]+1, ...; `want[b]` lists the slots whose logits are needed.
struct WindowInput {
  std::vector<std::vector<int32_t>> tokens;  // [B][count_b]
  std::vector<int64_t> start;                // [B]
  std::vector<std::vector<int64_t>> want;    // [B][...] slots in [0, count_b)
};

class Decoder {
 public:
  // Caches for `batch` rows of `capacity` positions (0: model.config().context_length, the most
  // allowed), in the model's dtype and on its device, allocated here once. keep_hidden: keep the
  // MTP hidden stores (speculative decoding needs them). The model must outlive the decoder; its
  // parameters are read directly (no weight access).
  Decoder(const GPT& model, int64_t batch, bool keep_hidden, int64_t capacity = 0);
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  int64_t batch() const { return batch_; }

  // The main model over the window: writes its keys/values (and store 0) at the real slots and
  // returns the logits of the wanted slots, fp32 rows of V (the real vocabulary) in row order,
  // then slot order within a row. REQUIRES: tokens in [0, V), start[b] + count_b <= capacity.
  std::vector<float> main(const WindowInput& in);
  // MTP depth k (1..D): slot i of row b combines store k-1 at position start[b]+i (which must
  // hold that position's hidden state) with the embedding of tokens[b][i] (the token k ahead).
  // Writes depth k's caches (and store k when k < D); returns the wanted logits as main() does.
  std::vector<float> depth(int k, const WindowInput& in);

 private:
  DecodeWindow window_of(const WindowInput& in) const;
  Tensor slot_ids(const WindowInput& in, const DecodeWindow& win, bool positions) const;
  // Hidden states x [B, W, C] -> store rows at the real slots, and back.
  void save(int store, const Var& x, const DecodeWindow& win);
  Var load(int store, const DecodeWindow& win) const;
  std::vector<float> logits_at(const Var& x, const WindowInput& in, const DecodeWindow& win);

  const GPT& model_;
  int64_t batch_;
  int64_t capacity_;                  // positions per row in every cache and store
  std::vector<KVCache> main_caches_;  // [L]
  std::vector<KVCache> mtp_caches_;   // [D]
  std::vector<Tensor> stores_;        // [D] of [B, capacity, C] (empty without keep_hidden)
  DirectWeights direct_;
};

}  // namespace gtron

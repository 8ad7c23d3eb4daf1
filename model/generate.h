// Generation from a GPT for a batch of prompts: incremental decoding with key/value caches
// (prefill, then one position at a time), MTP self-speculative decoding, and the full
// recomputation it is checked against.
//
// Note [MTP self-speculative decoding]
// A row holds tokens x_0..x_{n-1}; the main caches hold positions 0..n-2 and x_{n-1} is the next
// token to feed. One round:
//   1. Draft. Depth k (1..D) runs from its first stale position to n-2 and, at n-2, drafts
//      x̂_{n-1+k}. Its input at position s is store k-1 at s and token s+k: a real token while
//      s+k <= n-1, else the draft of depth s+k-n+1 (earlier depths draft first). The positions
//      s <= n-1-k saw only real tokens and stay valid; the later ones are recomputed next round.
//   2. Verify. The main model feeds [x_{n-1}, x̂_n, .., x̂_{n-1+m}] (m = min(D, tokens still
//      wanted - 1)) at positions n-1..n-1+m: slot i's logits p_i judge the draft x̂_{n+i}.
//   3. Accept the longest agreeing prefix of j drafts, then one more token from p_j: the argmax,
//      or the residual draw of the rejection. Greedy: a draft agrees when it is the argmax of its
//      p. Sampling: verify_draft's min(1, p/q) rule (model/sampling.h), so every token follows
//      the main model's distribution exactly. The row gains j+1 tokens; the main caches keep
//      positions up to n-1+j, and the rest is rolled back (Note [decode windows]).
// Plain cached decoding is the same loop with m = 0. Rows advance independently.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/gpt.h"
#include "model/sampling.h"
#include "model/step_graphs.h"

namespace gtron {

struct GenerateOptions {
  int64_t max_new_tokens = 256;  // per row
  SamplingOptions sampling;
  uint64_t seed = 1;         // row b draws from row_rng(seed, b)
  bool speculative = false;  // draft with the MTP depths (REQUIRES mtp_depth >= 1)
  // CUDA, greedy: capture each decoding step once through this and replay it (Note [decode
  // graphs] in model/decoder.h; graphs::DecodeGraphs in graphs/decode_graphs.h is the one to
  // pass); null runs every step eagerly with the training ops (the reference the graphs are
  // tested against). Not owned; it outlives the call. Ignored on CPU; when sampling no step is
  // captured, but GPT-2's fp32 blocks still run the decoder's fused composition.
  StepGraphs* graphs = nullptr;
  // Activations, caches and logits: the model's dtype, or kBF16 for an fp32 model on CUDA (Note
  // [bf16 decoding] in model/decoder.h). generate_recompute runs the model's dtype only.
  DType dtype = DType::kF32;
  // The rule that verifies a sampled draft (tests pass a biased one to show what it prevents).
  DraftVerifier verify = verify_draft;
};

struct GenerateStats {
  int64_t tokens = 0;     // new tokens over all rows
  double seconds = 0;     // wall time of the whole generation, prefill included
  double prefill_ms = 0;  // the prompt pass (with the first new token's logits)
  int64_t proposed = 0;   // drafts verified
  int64_t accepted = 0;   // drafts accepted
  // {"tokens": N, "tokens_per_s": X, "prefill_ms": P, "proposed": a, "accepted": b,
  //  "acceptance": b/a} (acceptance null when nothing was proposed).
  std::string json() const;
};

struct Generation {
  std::vector<std::vector<int32_t>> tokens;  // [B][max_new_tokens] new tokens of each row
  GenerateStats stats;
};

// Decodes every prompt with key/value caches (Note [MTP self-speculative decoding]).
// REQUIRES (the caller validates user input): prompts non-empty, ids in [0, V),
// prompt length + max_new_tokens <= context_length, speculative only with MTP depths,
// sampling.top_p in (0, 1].
Generation generate(const GPT& model, const std::vector<std::vector<int32_t>>& prompts,
                    const GenerateOptions& opts);

// The reference: every token recomputes the whole context with GPT::logits. Draws the same random
// numbers as generate() without speculation, so both give the same tokens up to float rounding.
// REQUIRES: as generate(), all prompts of one length, no speculation.
Generation generate_recompute(GPT& model, const std::vector<std::vector<int32_t>>& prompts,
                              const GenerateOptions& opts);

}  // namespace gtron

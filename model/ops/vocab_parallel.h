// The vocabulary-parallel ends of the model (Megatron-style): the token embedding and the
// cross-entropy over a vocabulary whose rows are split over the tensor-parallel group. Rank r
// holds rows [v0, v0 + Vl) of the padded table (Vl = Vp / TP, v0 = r·Vl); the full logits are
// never gathered. CPU tensors (f32, f64), or CUDA ones (f32, bf16) through the single-GPU kernels
// (model/ops/embedding_cuda.cu, loss_cuda.cu): at TP = 1 their values are those of embedding()
// and cross_entropy(), bit for bit.
#pragma once

#include <cstdint>

#include "model/autograd.h"
#include "model/ops/tp_comm.h"

namespace gtron {

// tokens: i32 (CPU, or on a CUDA table's device), each in [0, Vp); table: [Vl, C], rows [v0, v0 +
// Vl) of the full table. Returns tokens' shape + [C]: Σ_TP of (table[token − v0] for this rank's
// tokens, 0 otherwise), i.e. the full lookup on every rank. Backward accumulates dtable[token − v0]
// += dy for this rank's tokens, rows in order (bit-deterministic). `scatter_tokens` (sequence
// parallelism, i32 tokens [B, T]): the sum is reduce-scattered instead, so this rank gets its chunk
// of the sequence (tp_scatter_tokens in model/ops/tp_comm.h).
Var vocab_parallel_embedding(const Tensor& tokens, const Var& table, int64_t v0,
                             TensorParallelGroup& g, bool scatter_tokens = false);

// logits: [..., Vl], columns [v0, v0 + Vl) of the full [..., Vp] logits; targets: i32 with the
// logits' leading shape, each in [0, V) or kMaskedTarget (model/ops/loss.h). The row max and the
// sum of exponentials over the first V full columns are reduced over the group (max, then sum,
// with each row's target logit), so every rank gets the same scalar: the mean CE over unmasked
// rows, as cross_entropy() computes it on the full logits. Backward accumulates
// dlogits[:, j] += (softmax − onehot) / n_unmasked · dloss over this rank's columns below V.
// `overwrite_logits`: as cross_entropy()'s (CUDA: the gradient written over the logits, zero on
// the columns at or past V).
Var vocab_parallel_cross_entropy(const Var& logits, const Tensor& targets, int64_t V, int64_t v0,
                                 TensorParallelGroup& g, bool overwrite_logits = false);

}  // namespace gtron

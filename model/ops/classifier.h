// The blocked classifier: the head GEMM and its cross-entropy with both gradients formed in the
// forward, a block of rows at a time, so the [N, Vp] logits never exist whole.
//
// Note [blocked classifier]
// GPT-2's head writes N·Vp logits (1.6 GB in bf16 for B·T = 16k, one buffer per MTP depth, all
// alive until the backward). When the loss's upstream gradient is promised (KnownLossGrad: the
// training loop seeds every backward with the same device scalar), nothing downstream of the
// logits waits for the backward: for each block of R rows the forward
//   1. forms logits = x[rows]·wᵀ into one [R, Vp] buffer (reused by every block),
//   2. runs the one-pass cross-entropy's rows step over it (Note [one-pass cross-entropy]), which
//      leaves dlogits = (softmax − onehot)·seed·weight/count in the buffer,
//   3. writes dx[rows] = dlogits·w and adds dw += dlogitsᵀ·x[rows] into w's gradient slot.
// The loss is finalized over all N rows after the last block (the same values as the unblocked
// one-pass path: every step is row-local except the count and the loss, formed over all N). The
// backward checks the promise (a trap when it was broken: dw is already summed) and hands dx to
// x's gradient. Peak: one block's logits plus dx, instead of N·Vp per depth; dw's sum over the
// blocks is in block order (fixed). Where it does not apply (CPU, f32, no promise, no grad mode,
// a weight whose gradient slot is bound only in the backward, as GTP's) callers keep linear +
// cross_entropy.
#pragma once

#include <cstdint>

#include "model/autograd.h"
#include "model/ops/loss.h"

namespace gtron {

// Rows per block of the blocked classifier for N rows of Vp logits: the fewest equal blocks of at
// most 512 MiB of bf16 logits each, rounded up to a multiple of 128 rows
// (GTRON_CLASSIFIER_ROWS=R overrides; 0 turns the blocked path off).
int64_t classifier_block_rows(int64_t N, int64_t Vp);

// True when classifier_cross_entropy applies: CUDA bf16 x and w, grad mode on, x or w wanting a
// gradient, w's gradient slot an f32 tensor bound now (a parameter's main_grad), a promised
// upstream gradient, and a block size above 0.
bool classifier_supported(const Var& x, const Var& w, const KnownLossGrad* known);

// loss = cross_entropy(linear(x, w), targets, V) for x [.., C], w [Vp, C], targets [..] (i32,
// each in [0, V) or kMaskedTarget): Note [blocked classifier]. REQUIRES: classifier_supported.
Var classifier_cross_entropy(const Var& x, const Var& w, const Tensor& targets, int64_t V,
                             const KnownLossGrad& known);

}  // namespace gtron

// Losses: softmax cross-entropy with masked positions, and scalar scaling/summing for the MTP loss.
#pragma once

#include <cstdint>

#include "model/autograd.h"

namespace gtron {

// Target value for positions that have no target (the MTP tail): excluded from loss and gradient.
constexpr int32_t kMaskedTarget = -1;

// logits: [..., Vp] (Vp = padded vocab), targets: i32 with logits' leading shape, each in [0, V) or
// kMaskedTarget. Softmax runs over the first V columns only (the padded tail gets zero gradient).
// Returns a scalar (rank 0): the mean CE over unmasked positions (0 if all are masked).
// Backward accumulates dlogits += (softmax − onehot) / n_unmasked · dloss.
Var cross_entropy(const Var& logits, const Tensor& targets, int64_t V);

// y = s · x (loss scaling, MTP weighting λ/D). Backward accumulates dx += s·dy.
Var scale(const Var& x, double s);

}  // namespace gtron

// LayerNorm followed by a linear layer, with the normalized activation recomputed in the backward
// instead of kept (CUDA): y = linear(layernorm(x, gamma, beta), w, b).
//
// The composed ops keep layernorm's output [N, C] alive from the forward to the linear's weight
// gradient; here only x (kept anyway: the residual stream) and the row statistics are, and the
// backward re-runs the same LayerNorm kernel (bit-identical output) right before the weight
// gradient: one [N, C] pass per use for one [N, C] activation less per block (0.3 GB on GPT-2 124M
// at B·T = 16k). Values and gradients equal the composed ops' bit for bit.
#pragma once

#include "model/autograd.h"
#include "model/ops/norm.h"

namespace gtron {

class TensorParallelGroup;

// x: [.., C]; gamma, beta: [C] (f32, or x's dtype); w: [Cout, C], b: [Cout] or undefined.
// Backward accumulates into x, gamma, beta, w, b like layernorm + linear. REQUIRES: CUDA.
// `tp` (a column-parallel w, this rank's rows): the backward sums the normalized rows' gradient
// over the group before the LayerNorm backward — tp_copy between the two ops (model/ops/tp_comm.h)
// — so x, gamma and beta get the full gradient on every rank.
Var layernorm_linear(const Var& x, const Var& gamma, const Var& beta, const Var& w, const Var& b,
                     double eps = kLayerNormEps, TensorParallelGroup* tp = nullptr);

}  // namespace gtron

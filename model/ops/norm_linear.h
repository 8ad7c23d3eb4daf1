// LayerNorm followed by a linear layer (CUDA): y = linear(layernorm(x, gamma, beta), w, b), with
// the normalized activation kept for the backward or recomputed there.
//
// The composed ops keep layernorm's output [N, C] alive from the forward to the linear's weight
// gradient, and so does this op by default. With `recompute` (train.recompute = "selective") only
// x (kept anyway: the residual stream) and the row statistics are, and the backward re-runs the
// same LayerNorm kernel
// (bit-identical output) right before the weight gradient: one [N, C] pass per use (about 0.25 ms
// a step on GPT-2 124M at B·T = 16k on an H200) for one [N, C] activation less per block (0.3 GB
// there), the trade to take when memory is short. Values and gradients equal the composed ops'
// bit for bit either way.
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
// `recompute`: drop the normalized rows and re-form them in the backward (above).
Var layernorm_linear(const Var& x, const Var& gamma, const Var& beta, const Var& w, const Var& b,
                     double eps = kLayerNormEps, TensorParallelGroup* tp = nullptr,
                     bool recompute = false);

// The same for RMSNorm (the llama family's attn_norm → qkv and mlp_norm → gate_up):
// y = linear(rmsnorm(x, gamma), w, b), the normalized rows kept or (`recompute`) re-formed by the
// same kernel right before the weight gradient. The kernels and their order are the composed
// rmsnorm → linear's, so values and gradients equal theirs bit for bit. REQUIRES: CUDA; w not split
// over TP.
Var rmsnorm_linear(const Var& x, const Var& gamma, const Var& w, const Var& b, double eps,
                   bool recompute);

}  // namespace gtron

// The decoder's own composition of a transformer block and an MTP depth for CUDA decoding steps
// (the training forward, model/layers.h, stays as it is).
//
// Note [decode fast block]
// A decoding step feeds a handful of rows (B·W) through GEMMs whose cost is reading their
// weights; cuBLASLt tiles sized for training leave them slower than that read and add a separate
// kernel for each residual add and GELU. So for f32 activations on CUDA with at most 8 rows
// (cuda::small_linear_supported), each linear runs the small-row kernel of model/decode_cuda.h
// with what surrounds it fused: the LayerNorm before qkv and fc (and the final norm before the
// head), bias, GELU after fc, and the residual add after attn_proj and mlp_proj: 7 kernels per
// block instead of 12. Every other case composes the training ops
// (linear, gelu, add), so the math is the block's: x + attn(ln1(x)), then + mlp(ln2(·)); only the
// rounding of the dot products differs from cuBLASLt's. The decoder uses it where it replays
// graphs (Note [decode graphs] in model/decoder.h), for eager and replayed calls alike.
#pragma once

#include "model/layers.h"

namespace gtron {

// l(ln(x)) (+ GELU when `gelu`) (+ res when defined), ln the identity when null. x: [..., K] ->
// [..., N]. No grad.
Var decode_linear(const Var& x, const LinearLayer& l, const Var& res, bool gelu,
                  const LayerNormLayer* ln = nullptr);
// TransformerBlock::forward(x, ·, attend) through decode_linear.
Var decode_block(const TransformerBlock& b, const Var& x,
                 const TransformerBlock::Attention& attend);
// MTPModule::forward(h, emb, ·, attend) through decode_linear.
Var decode_depth(const MTPModule& m, const Var& h, const Var& emb,
                 const TransformerBlock::Attention& attend);

}  // namespace gtron

// The Llama-family decoder block (Llama-3, Qwen2, Qwen3), as Hugging Face's LlamaForCausalLM and
// Qwen3ForCausalLM compute it:
//   h = x + o_proj(attention(RoPE(qk_norm(q)), RoPE(qk_norm(k)), v))   on attn_norm(x)'s q, k, v
//   y = h + down(silu(gate(g)) ⊙ up(g))                                 with g = mlp_norm(h)
// RMSNorm in fp32 statistics, no biases (Qwen2's q/k/v bias and Qwen3's per-head q/k RMSNorm are
// options), grouped-query attention (each K/V head serves NH / NKV consecutive query heads), a
// head size HS that need not be C / NH. No positions enter anywhere but RoPE.
//
// Note [llama block residuals]
// The two residual adds are placed as GPT-2's block places them (model/layers.cc): on CUDA, with
// o_proj and down not split over TP, each rides in the epilogue of the GEMM before it (linear's
// `residual`: h = x + o_proj(·) and y = h + down(·) rounded once, no [N, C] pass of their own, and
// in the backward the sum's gradient is the GEMM's dy itself). Where it cannot (a row-parallel
// o_proj reduces its partial sums after the GEMM; in tests, set_residual_in_gemm_for_testing(false)
// in model/layers.h), h = x + o_proj(·) and g = mlp_norm(h) are one op, add_rmsnorm
// (model/ops/add_norm.h: one row pass instead of add's and rmsnorm's, bit for bit the composed
// ops), and y = h + down(·) is add's. On the CPU both are the composed ops (add_rmsnorm's CPU path
// is add then rmsnorm), node for node the tape the CPU goldens were made with. The block's last
// add is not fused with the next block's attn_norm: GPT-2 does not chain blocks that way either
// (the graph runner's block seam passes one tensor).
//
// Note [packed llama projections]
// q, k and v come out of one GEMM: attn.qkv.weight is [(NH + 2·NKV)·HS, C], the rows of q_proj,
// then k_proj, then v_proj (Hugging Face's three matrices stacked); gate and up likewise from
// mlp.gate_up.weight [2F, C] (gate_proj's rows, then up_proj's). One GEMM reads the activations
// once and launches once; the checkpoint names are gtron's, and the Hugging Face conversion
// splits and stacks the rows (docs/checkpoints-and-interop.md, "Parameter names").
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/layers.h"
#include "model/moe.h"
#include "model/ops/qk_norm.h"
#include "model/ops/rope.h"

namespace gtron {

struct LlamaDims {
  int64_t C = 0;      // n_embd
  int NH = 0;         // query heads
  int NKV = 0;        // key/value heads; divides NH
  int64_t HS = 0;     // head size (even)
  int64_t F = 0;      // SwiGLU width (intermediate_size)
  int L = 0;          // main-model layers (residual init scale 1/sqrt(2L))
  double std = 0;     // init std of weights
  double eps = 1e-5;  // RMSNorm epsilon
  bool qk_norm = false;
  bool qkv_bias = false;
  double rope_theta = 500000;
  bool llama3_scaling = false;  // rewrite the RoPE frequencies (model/ops/rope.h)
  RopeLlama3Scaling llama3;
  // Re-form the SwiGLU output and the two RMSNorm outputs in the backward instead of keeping them
  // (CUDA bf16; Note [recomputing the SwiGLU output] in model/ops/fused_mlp.h, rmsnorm_linear in
  // model/ops/norm_linear.h).
  bool recompute_act = false;
};

struct LlamaBlock {
  RMSNormLayer attn_norm, mlp_norm;  // [C]
  LinearLayer qkv;                   // [(NH + 2·NKV)·HS, C] (Note [packed llama projections])
  RMSNormLayer q_norm, k_norm;       // [HS], qk_norm only
  LinearLayer o_proj;                // [C, NH·HS], residual-scaled init
  LinearLayer gate_up;               // [2F, C] (dense MLP only)
  LinearLayer down;                  // [C, F], residual-scaled init (dense MLP only)
  // The mixture-of-experts MLP in place of gate_up and down (model/moe.h); null: dense. Shared,
  // not copied, by copies of the block (it holds the router bias and load counts).
  std::shared_ptr<MoeLayer> moe;
  int NH = 0, NKV = 0;  // this rank's query and key/value heads
  int64_t HS = 0;
  bool qk_norm_on = false;
  bool recompute_act = false;
  Tensor inv_freq;  // [HS/2] RoPE frequencies (rope_table: f32 on CUDA, the model's dtype on CPU)

  LlamaBlock() = default;
  // `moe` (optional): the block's MLP is that mixture of experts (model/moe.h).
  LlamaBlock(ParamRegistry& reg, const std::string& name, const LlamaDims& d, Device device,
             const MoeDims* moe = nullptr);
  // x: [B, T, C] -> [B, T, C]: causal self-attention over positions pos0 .. pos0 + T − 1; with
  // `segments` (i32 [B, T]) only within a document (Note [document masking] in
  // model/ops/segments.h).
  Var forward(const Var& x, WeightAccess& w, int64_t pos0 = 0,
              const Tensor& segments = Tensor()) const;
  // The same block with another attention over the packed q|k|v after the q/k norms and before
  // RoPE, [B, T, (NH + 2·NKV)·HS] -> [B, T, NH·HS]: the one above passes
  // causal_attention_gqa_rope from pos0; generation rotates each row at its own positions and
  // attends against a key/value cache (Note [decode RoPE] in model/kv_cache.h).
  // With `rope` (qk_norm on; CUDA), the q/k norm also rotates q and k (Note [RoPE in the q/k
  // norm] in model/ops/qk_norm.h), for an `attend` that takes them rotated.
  using Attention = TransformerBlock::Attention;
  Var forward(const Var& x, WeightAccess& w, const Attention& attend,
              const QkNormRope* rope = nullptr) const;
  // residual + down(silu(gate(g)) ⊙ up(g)) for g = mlp_norm(residual) (Note [llama block
  // residuals]); residual + moe(g) for a mixture-of-experts block.
  Var mlp(const Var& g, const Var& residual, WeightAccess& w) const;
  // The MLP from gate_up's output gu = [gate | up] on.
  Var mlp_after_gate_up(const Var& gu, const Var& residual, WeightAccess& w) const;
  // lin(norm(x)): one op that re-forms norm(x) in the backward under recompute_act (CUDA bf16, lin
  // not split over TP: rmsnorm_linear), else the composed ops.
  Var norm_linear(const RMSNormLayer& norm, const LinearLayer& lin, const Var& x,
                  WeightAccess& w) const;
};

}  // namespace gtron

#include "model/llama.h"

#include <cmath>

#include "model/ops/add.h"
#include "model/ops/add_norm.h"
#include "model/ops/attention.h"
#include "model/ops/fp8.h"
#include "model/ops/fused_mlp.h"
#include "model/ops/linear.h"
#include "model/ops/norm.h"
#include "model/ops/norm_linear.h"
#include "model/ops/qk_norm.h"
#include "model/ops/rope.h"
#include "model/ops/swiglu.h"

namespace gtron {

LlamaBlock::LlamaBlock(ParamRegistry& reg, const std::string& name, const LlamaDims& d,
                       Device device, const MoeDims* moe_dims)
    : HS(d.HS), qk_norm_on(d.qk_norm), recompute_act(d.recompute_act) {
  const int tp = reg.tensor_parallel().size;
  GTRON_CHECK(d.NH > 0 && d.NKV > 0 && d.NH % d.NKV == 0 && d.HS > 0 && d.HS % 2 == 0 && d.F > 0,
              "llama block ", name, ": NH ", d.NH, ", NKV ", d.NKV, ", HS ", d.HS, ", F ", d.F);
  GTRON_CHECK(d.NH % tp == 0 && (d.NKV % tp == 0 || tp % d.NKV == 0) && d.F % tp == 0,
              "llama block ", name, ": tensor parallelism ", tp, " must divide NH ", d.NH,
              " and F ", d.F, ", and divide or be a multiple of NKV ", d.NKV);
  // Each rank's key/value heads: NKV/TP of them, or one held by TP/NKV ranks (Note [replicated
  // key/value heads] in model/tensor_parallel.h).
  const int kv_replicas = tp > d.NKV ? tp / d.NKV : 1;
  NH = d.NH / tp;  // this rank's heads (Note [tensor-parallel layout])
  NKV = d.NKV * kv_replicas / tp;
  const double resid_std = d.std / std::sqrt(2.0 * d.L);
  using M = TpMode;
  attn_norm = RMSNormLayer(reg, name + ".attn_norm", d.C, d.eps);
  // Column-parallel over the three parts: each rank holds NH/TP query heads and the key/value
  // heads they read.
  qkv = LinearLayer(reg, name + ".attn.qkv", d.C, d.qkv_bias, d.std,
                    {d.NH * d.HS, d.NKV * d.HS, d.NKV * d.HS}, {1, kv_replicas, kv_replicas});
  if (d.qk_norm) {
    q_norm = RMSNormLayer(reg, name + ".attn.q_norm", d.HS, d.eps);
    k_norm = RMSNormLayer(reg, name + ".attn.k_norm", d.HS, d.eps);
    // Each rank's gradient covers its own query heads only (and their share of a replicated
    // key/value head's): summed over TP it is the whole one.
    if (reg.tensor_parallel().active()) {
      reg.mark_tp_partial_grad(*q_norm.weight);
      reg.mark_tp_partial_grad(*k_norm.weight);
    }
  }
  o_proj = LinearLayer(reg, name + ".attn.proj", d.NH * d.HS, d.C, false, resid_std, M::kRow);
  mlp_norm = RMSNormLayer(reg, name + ".mlp_norm", d.C, d.eps);
  if (moe_dims != nullptr) {
    moe = std::make_shared<MoeLayer>(reg, name + ".mlp", d.C, *moe_dims, d.std, resid_std);
  } else {
    gate_up = LinearLayer(reg, name + ".mlp.gate_up", d.C, 2 * d.F, false, d.std, M::kColumn, 2);
    down = LinearLayer(reg, name + ".mlp.down", d.F, d.C, false, resid_std, M::kRow);
  }
  inv_freq = rope_table(rope_inv_freq(d.HS, d.rope_theta, d.llama3_scaling ? &d.llama3 : nullptr),
                        device, reg.dtype());
}

// Under train.recompute = "selective" on CUDA bf16 without TP, a norm and the projection it feeds
// are one op that re-forms the normalized rows in the backward (rmsnorm_linear); elsewhere the
// composed ops, bit for bit the same values.
Var LlamaBlock::norm_linear(const RMSNormLayer& norm, const LinearLayer& lin, const Var& x,
                            WeightAccess& w) const {
  // FP8 on CUDA: the norm writes the linear's FP8 input too (Note [fp8 fused producers]).
  if (lin.wants_fp8_codes(x)) {
    fp8::QuantizedRows codes;
    const Var y = norm.forward(x, &codes);
    return lin.forward(y, w, Var(), &codes);
  }
  if (!recompute_act || lin.tp != nullptr || !fused_mlp_supported(x) || lin.fp8) {
    return lin.forward(norm.forward(x), w);
  }
  const Var gamma = Var::param(*norm.weight);
  Var wv = w.use(*lin.weight);
  Var y = rmsnorm_linear(x, gamma, wv, lin.bias ? w.use_bias(*lin.bias) : Var(), norm.eps,
                         /*recompute=*/true);
  w.used(*lin.weight, wv);
  return y;
}

Var LlamaBlock::forward(const Var& x, WeightAccess& w, int64_t pos0, const Tensor& segments) const {
  // Note [RoPE in the q/k norm]: on the flash path the q/k norm rotates on its way out.
  const bool fused = qk_norm_on && rope_rotated_input_supported(x, static_cast<int>(HS));
  const QkNormRope rope{inv_freq, pos0};
  return forward(
      x, w,
      [this, pos0, fused, segments](const Var& qkv_out) {
        return causal_attention_gqa_rope(qkv_out, inv_freq, NH, NKV, static_cast<int>(HS), pos0,
                                         fused, segments);
      },
      fused ? &rope : nullptr);
}

Var LlamaBlock::forward(const Var& x, WeightAccess& w, const Attention& attend,
                        const QkNormRope* rope) const {
  Var qkv_out = norm_linear(attn_norm, qkv, x, w);  // [B, T, (NH + 2·NKV)·HS]
  if (qk_norm_on) {
    qkv_out = qk_rmsnorm(qkv_out, NH, NKV, HS, Var::param(*q_norm.weight),
                         Var::param(*k_norm.weight), q_norm.eps, rope);
  }
  const Var attn = attend(qkv_out);
  // A mixture-of-experts MLP takes the add + norm path below (it has no gate_up to fuse).
  if (x.device().is_cuda() && o_proj.tp == nullptr && residual_in_gemm() && !moe) {
    Var h = o_proj.forward(attn, w, x);  // x + o_proj(attn), the residual in the GEMM's epilogue
    return mlp_after_gate_up(norm_linear(mlp_norm, gate_up, h, w), h, w);
  }
  const AddNorm hn =
      add_rmsnorm(x, o_proj.forward(attn, w), Var::param(*mlp_norm.weight), mlp_norm.eps);
  return mlp(hn.y, hn.h, w);
}

Var LlamaBlock::mlp(const Var& g, const Var& residual, WeightAccess& w) const {
  if (moe) return add(residual, moe->forward(g, w));
  return mlp_after_gate_up(gate_up.forward(g, w), residual, w);
}

Var LlamaBlock::mlp_after_gate_up(const Var& gu, const Var& residual, WeightAccess& w) const {
  if (down.tp == nullptr && residual_in_gemm() && fused_mlp_supported(gu) && !down.fp8) {
    // SwiGLU, down and the residual in one op that may drop the SwiGLU output (Note
    // [recomputing the SwiGLU output]); the composed ops below, bit for bit.
    Var wd = w.use(*down.weight);
    Var y = swiglu_linear(gu, wd, residual, !recompute_act);
    w.used(*down.weight, wd);
    return y;
  }
  if (down.fp8 && down.tp == nullptr && down.bias == nullptr && fp8_swiglu_down() &&
      swiglu_linear_fp8_ok(gu, down.in_features, down.out_features)) {
    // Note [SwiGLU into an FP8 down projection]: both codes of the SwiGLU output, no bf16 copy.
    const fp8::QuantizedWeight* wq = nullptr;
    Var wd = w.use_fp8(*down.weight, &wq);
    const bool in_gemm = residual_in_gemm();
    Var y = swiglu_linear_fp8(gu, wd, wq, in_gemm ? residual : Var());
    w.used(*down.weight, wd);
    return in_gemm ? y : add(residual, y);
  }
  fp8::QuantizedRows codes;  // SwiGLU writes down's FP8 input where down wants it
  const fp8::QuantizedRows* xq = down.wants_fp8_codes(gu) ? &codes : nullptr;
  Var act = swiglu(gu, xq != nullptr ? &codes : nullptr);
  if (gu.device().is_cuda() && down.tp == nullptr && residual_in_gemm()) {
    return down.forward(act, w, residual, xq);
  }
  return add(residual, down.forward(act, w, Var(), xq));
}

}  // namespace gtron

#include "model/layers.h"

#include <atomic>
#include <cmath>

#include "memory/caching_allocator.h"
#include "model/init.h"
#include "model/llama.h"
#include "model/ops/add.h"
#include "model/ops/add_norm.h"
#include "model/ops/attention.h"
#include "model/ops/concat.h"
#include "model/ops/fp8.h"
#include "model/ops/fused_mlp.h"
#include "model/ops/gelu.h"
#include "model/ops/linear.h"
#include "model/ops/norm.h"
#include "model/ops/norm_linear.h"

namespace gtron {

Parameter& ParamRegistry::add(const std::string& name, const Shape& shape, Init init, double std,
                              bool weight_decay) {
  GTRON_CHECK(find(name) == nullptr, "duplicate parameter name ", name);
  memory::AllocKindScope kind(memory::AllocKind::kWeights);  // Note [allocation kinds]
  Tensor t = Tensor::empty(shape, dtype_, Device::cpu());
  switch (init) {
    case Init::kNormal:
      init_normal(t, std, seed_, name);
      break;
    case Init::kZeros:
      init_constant(t, 0.0);
      break;
    case Init::kOnes:
      init_constant(t, 1.0);
      break;
  }
  if (device_.is_cuda()) t = t.to(device_);
  owned_.push_back(std::make_unique<Parameter>(name, t, weight_decay));
  order_.push_back(owned_.back().get());
  return *order_.back();
}

bool ParamRegistry::tp_partial_grad(const Parameter* p) const {
  for (const Parameter* q : tp_partial_)
    if (q == p) return true;
  return false;
}

Parameter* ParamRegistry::find(const std::string& name) const {
  for (Parameter* p : order_)
    if (p->name == name) return p;
  return nullptr;
}

LinearLayer::LinearLayer(ParamRegistry& reg, const std::string& name, int64_t in, int64_t out,
                         bool has_bias, double std, TpMode mode, int groups)
    : fp8(reg.fp8_linears()), in_features(in), out_features(out) {
  const bool row = mode == TpMode::kRow;
  const TpSlice w_slice{mode == TpMode::kNone ? TpSplit::kNone
                        : row                 ? TpSplit::kColumns
                                              : TpSplit::kRows,
                        groups};
  const TpSlice b_slice{row ? TpSplit::kNone : w_slice.split, groups};  // row: bias replicated
  weight = &reg.add_split(name + ".weight", {out, in}, Init::kNormal, std, true, w_slice);
  if (fp8) reg.mark_fp8_weight(*weight);
  if (has_bias) {
    bias = &reg.add_split(name + ".bias", {out}, Init::kZeros, 0, /*weight_decay=*/false, b_slice);
  }
  if (mode != TpMode::kNone && reg.tensor_parallel().active()) {
    tp_mode = mode;
    tp = &reg.tensor_parallel();
  }
}

LinearLayer::LinearLayer(ParamRegistry& reg, const std::string& name, int64_t in, bool has_bias,
                         double std, const std::vector<int64_t>& group_rows,
                         const std::vector<int>& group_replicas)
    : fp8(reg.fp8_linears()), in_features(in) {
  int64_t out = 0;
  for (int64_t g : group_rows) out += g;
  out_features = out;
  TpSlice slice{TpSplit::kRows, static_cast<int>(group_rows.size()), group_rows, group_replicas};
  weight = &reg.add_split(name + ".weight", {out, in}, Init::kNormal, std, true, slice);
  if (fp8) reg.mark_fp8_weight(*weight);
  if (has_bias) {
    bias = &reg.add_split(name + ".bias", {out}, Init::kZeros, 0, /*weight_decay=*/false, slice);
  }
  if (reg.tensor_parallel().active()) {
    tp_mode = TpMode::kColumn;
    tp = &reg.tensor_parallel();
  }
}

bool LinearLayer::wants_fp8_codes(const Var& x) const {
  if (!fp8 || tp != nullptr || !x.device().is_cuda() || x.dtype() != DType::kBF16) return false;
  const int64_t width = x.shape().rank() > 0 ? x.shape()[x.shape().rank() - 1] : 0;
  const int64_t rows = width > 0 ? x.value().numel() / width : 0;
  return fp8::fused_producers() && cuda::fp8_gemm_ok(rows, in_features, out_features);
}

Var LinearLayer::forward(const Var& x, WeightAccess& w, const Var& residual,
                         const fp8::QuantizedRows* xq) const {
  if (tp != nullptr) return residual.defined() ? add(residual, tp_forward(x, w)) : tp_forward(x, w);
  // Note [fp8 weights once a step]: the access's codes of the weight, where the product runs FP8;
  // then the use needs no bf16 copy of it (Note [fp8 weights without shadows]).
  const fp8::QuantizedWeight* wq = nullptr;
  Var wv;
  if (fp8 && x.device().is_cuda() && x.dtype() == DType::kBF16 &&
      cuda::fp8_gemm_ok(x.value().numel() / in_features, in_features, out_features)) {
    wv = w.use_fp8(*weight, &wq);
  } else {
    wv = w.use(*weight);
  }
  Var y = linear(x, wv, bias ? w.use_bias(*bias) : Var(), residual, fp8, wq, xq);
  w.used(*weight, wv);
  return y;
}

LayerNormLayer::LayerNormLayer(ParamRegistry& reg, const std::string& name, int64_t C) {
  weight = &reg.add(name + ".weight", {C}, Init::kOnes, 0, false);
  bias = &reg.add(name + ".bias", {C}, Init::kZeros, 0, false);
}

Var LayerNormLayer::forward(const Var& x, fp8::QuantizedRows* codes) const {
  return layernorm(x, Var::param(*weight), Var::param(*bias), kLayerNormEps, codes);
}

RMSNormLayer::RMSNormLayer(ParamRegistry& reg, const std::string& name, int64_t C, double e)
    : eps(e) {
  weight = &reg.add(name + ".weight", {C}, Init::kOnes, 0, false);
}

Var RMSNormLayer::forward(const Var& x, fp8::QuantizedRows* codes) const {
  return rmsnorm(x, Var::param(*weight), eps, codes);
}

TransformerBlock::TransformerBlock(ParamRegistry& reg, const std::string& name, const BlockDims& d)
    : NH(d.NH / reg.tensor_parallel().size), recompute(d.recompute) {
  const double resid_std = d.std / std::sqrt(2.0 * d.L);
  using M = TpMode;  // Note [tensor-parallel layout]
  ln1 = LayerNormLayer(reg, name + ".ln1", d.C);
  qkv = LinearLayer(reg, name + ".attn.qkv", d.C, 3 * d.C, true, d.std, M::kColumn, 3);
  attn_proj = LinearLayer(reg, name + ".attn.proj", d.C, d.C, true, resid_std, M::kRow);
  ln2 = LayerNormLayer(reg, name + ".ln2", d.C);
  fc = LinearLayer(reg, name + ".mlp.fc", d.C, 4 * d.C, true, d.std, M::kColumn);
  mlp_proj = LinearLayer(reg, name + ".mlp.proj", 4 * d.C, d.C, true, resid_std, M::kRow);
}

namespace {
std::atomic<bool> g_residual_in_gemm{true};  // false: set_residual_in_gemm_for_testing
}  // namespace

bool residual_in_gemm() { return g_residual_in_gemm.load(std::memory_order_relaxed); }

void set_residual_in_gemm_for_testing(bool on) {
  g_residual_in_gemm.store(on, std::memory_order_relaxed);
}

Var TransformerBlock::mlp(const Var& x, const Var& residual, WeightAccess& w,
                          const fp8::QuantizedRows* xq) const {
  // FP8 linears: the composed ops (the fused MLP's GEMMs are bf16 with GELU epilogues), GELU
  // writing the codes of mlp_proj's input where it wants them (Note [fp8 fused producers]).
  if (!fused_mlp_supported(x) || fc.fp8) {
    const Var up = fc.forward(x, w, Var(), xq);
    fp8::QuantizedRows codes;
    const bool fused = mlp_proj.wants_fp8_codes(up);
    const Var g = gelu(up, fused ? &codes : nullptr);
    return add(residual, mlp_proj.forward(g, w, Var(), fused ? &codes : nullptr));
  }
  // CUDA bf16: GELU rides in the two GEMMs' epilogues (model/ops/fused_mlp.h). The weight
  // accesses come in the same order as the composed path's (use/used fc, then proj). Split over
  // TP: fc's input and proj's output pass the TP seams, as in LinearLayer::tp_forward.
  const Var xin = fc.tp_input(x);
  Var wf = w.use(*fc.weight);
  Var bf = w.use_bias(*fc.bias);
  if (bf.dtype() != DType::kBF16) {  // an access that keeps f32 biases: the composed ops
    Var up = linear(xin, wf, bf);
    w.used(*fc.weight, wf);
    return add(residual, mlp_proj.forward(gelu(up), w));
  }
  GeluUp up = linear_gelu_up(xin, wf, bf);
  w.used(*fc.weight, wf);
  Var wp = w.use(*mlp_proj.weight);
  Var bp = w.use_bias(*mlp_proj.bias);
  if (mlp_proj.tp == nullptr && residual_in_gemm()) {  // y = residual + g·wᵀ + b, one GEMM
    Var y = linear_after_gelu(up, wp, bp, residual, recompute);
    w.used(*mlp_proj.weight, wp);
    return y;
  }
  Var y = linear_after_gelu(up, wp, mlp_proj.bias_in_gemm() ? bp : Var(), Var(), recompute);
  w.used(*mlp_proj.weight, wp);
  return add(residual, mlp_proj.tp_output(y, bp));
}

Var TransformerBlock::qkv_of(const Var& x, WeightAccess& w) const {
  // Sequence parallelism gathers ln1's output between the two: the composed ops.
  const bool sp = qkv.tp != nullptr && qkv.tp->sequence_parallel;
  if (qkv.wants_fp8_codes(x)) {  // ln1 writes qkv's FP8 input (Note [fp8 fused producers])
    fp8::QuantizedRows codes;
    const Var y = ln1.forward(x, &codes);
    return qkv.forward(y, w, Var(), &codes);
  }
  if (!x.device().is_cuda() || sp || qkv.fp8) return qkv.forward(ln1.forward(x), w);
  // CUDA: ln1's output is recomputed in the backward instead of kept (model/ops/norm_linear.h);
  // split over TP, its backward sums the gradient of ln1's output over the group (tp_copy's).
  GTRON_CHECK(qkv.tp == nullptr || qkv.tp->group != nullptr, "tensor-parallel layer ",
              qkv.weight->name, " used before GPT::set_tensor_parallel()");
  Var gamma = Var::param(*ln1.weight);
  Var beta = Var::param(*ln1.bias);
  Var wv = w.use(*qkv.weight);
  Var y = layernorm_linear(x, gamma, beta, wv, w.use_bias(*qkv.bias), kLayerNormEps,
                           qkv.tp != nullptr ? qkv.tp->group : nullptr, recompute);
  w.used(*qkv.weight, wv);
  return y;
}

namespace {

// The training attention: causal self-attention over the window's own positions (within each
// document with `segments`).
TransformerBlock::Attention causal_over(int NH, const Tensor& segments) {
  return [NH, segments](const Var& qkv) { return causal_attention(qkv, NH, segments); };
}

}  // namespace

Var TransformerBlock::forward(const Var& x, WeightAccess& w, const Tensor& segments) const {
  return forward(x, w, causal_over(NH, segments));
}

Var TransformerBlock::forward(const Var& x, WeightAccess& w, const Attention& attend) const {
  if (x.device().is_cuda() && attn_proj.tp == nullptr && residual_in_gemm()) {
    // CUDA, not split: h = x + proj(attention) from one GEMM (the residual in its epilogue).
    Var h = attn_proj.forward(attend(qkv_of(x, w)), w, x);
    fp8::QuantizedRows codes;  // ln2 writes fc's FP8 input where fc wants it
    const bool fused = fc.wants_fp8_codes(h);
    const Var y = ln2.forward(h, fused ? &codes : nullptr);
    return mlp(y, h, w, fused ? &codes : nullptr);
  }
  Var a = attn_proj.forward(attend(qkv_of(x, w)), w);
  if (!x.device().is_cuda()) {  // the composed ops (the CPU goldens' exact tape)
    Var h = add(x, a);
    return mlp(ln2.forward(h), h, w);
  }
  // CUDA: one pass writes h and ln2(h) (model/ops/add_norm.h), bit-identical to the composed ops.
  // Row-local, so it fits every TP layout as is: under sequence parallelism h holds this rank's
  // rows, as the composed ops' h does, and fc's input seam gathers ln2's output after it.
  const AddNorm hn = add_layernorm(x, a, Var::param(*ln2.weight), Var::param(*ln2.bias));
  return mlp(hn.y, hn.h, w);
}

MTPModule::MTPModule(ParamRegistry& reg, const std::string& name, const BlockDims& d) {
  hnorm = RMSNormLayer(reg, name + ".hnorm", d.C);
  enorm = RMSNormLayer(reg, name + ".enorm", d.C);
  proj = LinearLayer(reg, name + ".proj", 2 * d.C, d.C, false, d.std, TpMode::kColumnGathered);
  block = TransformerBlock(reg, name + ".block", d);
}

MTPModule::MTPModule(ParamRegistry& reg, const std::string& name, const LlamaDims& d, Device device,
                     const MoeDims* moe) {
  hnorm = RMSNormLayer(reg, name + ".hnorm", d.C, d.eps);
  enorm = RMSNormLayer(reg, name + ".enorm", d.C, d.eps);
  proj = LinearLayer(reg, name + ".proj", 2 * d.C, d.C, false, d.std, TpMode::kColumnGathered);
  llama = std::make_shared<const LlamaBlock>(reg, name + ".block", d, device, moe);
}

Var MTPModule::forward(const Var& h, const Var& emb, WeightAccess& w,
                       const Tensor& segments) const {
  if (llama) {  // positions 0 .. T − 1, as the main model's (DeepSeek-V3's MTP shares them)
    return llama->forward(project(h, emb, w), w, /*pos0=*/0, segments);
  }
  return forward(h, emb, w, causal_over(block.NH, segments));
}

Var MTPModule::forward(const Var& h, const Var& emb, WeightAccess& w,
                       const TransformerBlock::Attention& attend) const {
  Var z = project(h, emb, w);
  return llama ? llama->forward(z, w, attend) : block.forward(z, w, attend);
}

Var MTPModule::project(const Var& h, const Var& emb, WeightAccess& w) const {
  // FP8 on CUDA: the concatenation writes the projection's FP8 input too (Note [fp8 fused
  // producers]).
  fp8::QuantizedRows codes;
  const bool fused = proj.wants_fp8_codes(h);
  const Var x = concat_features(hnorm.forward(h), enorm.forward(emb), fused ? &codes : nullptr);
  return proj.forward(x, w, Var(), fused ? &codes : nullptr);
}

}  // namespace gtron

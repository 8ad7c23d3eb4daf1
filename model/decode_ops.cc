#include "model/decode_ops.h"

#include "model/decode_cuda.h"
#include "model/ops/add.h"
#include "model/ops/concat.h"
#include "model/ops/gelu.h"
#include "model/ops/linear.h"
#include "model/ops/norm.h"
#include "model/stream.h"

namespace gtron {

namespace {

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

Var decode_linear(const Var& x, const LinearLayer& l, const Var& res, bool gelu_after,
                  const LayerNormLayer* ln) {
  GTRON_CHECK(!grad_enabled(), "decode_linear is for generation: run it under NoGradGuard");
  const Tensor& w = l.weight->data;
  const int64_t K = w.dim(1), N = w.dim(0);
  const int64_t M = x.value().numel() / K;
  auto f32 = [](const Parameter* p) { return p == nullptr || p->data.dtype() == DType::kF32; };
  const bool small =
      x.device().is_cuda() && x.dtype() == DType::kF32 && cuda::small_linear_supported(M, K) &&
      aligned16(x.value().raw()) && aligned16(w.raw()) && f32(l.weight) && f32(l.bias) &&
      (ln == nullptr || (f32(ln->weight) && f32(ln->bias) && aligned16(ln->weight->data.raw()) &&
                         aligned16(ln->bias->data.raw()))) &&
      (!res.defined() || res.dtype() == DType::kF32);
  if (!small) {
    const Var in = ln != nullptr ? ln->forward(x) : x;
    Var y = linear(in, Var::param(*l.weight), l.bias ? Var::param(*l.bias) : Var());
    if (gelu_after) y = gelu(y);
    return res.defined() ? add(res, y) : y;
  }
  std::vector<int64_t> dims = x.shape().vec();
  dims.back() = N;
  Stream& s = current_stream(x.device());
  Tensor y = Tensor::empty(Shape(dims), DType::kF32, x.device(), &s);
  if (res.defined()) {
    GTRON_CHECK(res.value().numel() == M * N, "decode_linear: residual ", res.shape().str(),
                " for ", M, " rows of ", N);
  }
  cuda::SmallLinearArgs a;
  a.x = x.value().data<float>();
  a.w = w.data<float>();
  a.bias = l.bias ? l.bias->data.data<float>() : nullptr;
  a.res = res.defined() ? res.value().data<float>() : nullptr;
  a.y = y.data<float>();
  if (ln != nullptr) {
    a.ln_gamma = ln->weight->data.data<float>();
    a.ln_beta = ln->bias->data.data<float>();
    a.ln_eps = static_cast<float>(kLayerNormEps);
  }
  a.M = M;
  a.K = K;
  a.N = N;
  a.gelu = gelu_after;
  cuda::small_linear(a, s.native());
  return Var::output(y, false);
}

Var decode_block(const TransformerBlock& b, const Var& x,
                 const TransformerBlock::Attention& attend) {
  const Var qkv = decode_linear(x, b.qkv, Var(), false, &b.ln1);
  const Var h = decode_linear(attend(qkv), b.attn_proj, x, false);
  const Var up = decode_linear(h, b.fc, Var(), true, &b.ln2);
  return decode_linear(up, b.mlp_proj, h, false);
}

Var decode_depth(const MTPModule& m, const Var& h, const Var& emb,
                 const TransformerBlock::Attention& attend) {
  const Var z = decode_linear(concat_features(m.hnorm.forward(h), m.enorm.forward(emb)), m.proj,
                              Var(), false);
  return decode_block(m.block, z, attend);
}

}  // namespace gtron

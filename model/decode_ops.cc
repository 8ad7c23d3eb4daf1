#include "model/decode_ops.h"

#include "model/decode_cuda.h"
#include "model/ops/add.h"
#include "model/ops/concat.h"
#include "model/ops/gelu.h"
#include "model/ops/linear.h"
#include "model/stream.h"

namespace gtron {

namespace {

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

Var decode_linear(const Var& x, const LinearLayer& l, const Var& res, bool gelu_after) {
  GTRON_CHECK(!grad_enabled(), "decode_linear is for generation: run it under NoGradGuard");
  const Tensor& w = l.weight->data;
  const int64_t K = w.dim(1), N = w.dim(0);
  const int64_t M = x.value().numel() / K;
  const bool small = x.device().is_cuda() && x.dtype() == DType::kF32 && w.dtype() == DType::kF32 &&
                     cuda::small_linear_supported(M, K) && aligned16(x.value().raw()) &&
                     aligned16(w.raw()) &&
                     (l.bias == nullptr || l.bias->data.dtype() == DType::kF32) &&
                     (!res.defined() || res.dtype() == DType::kF32);
  if (!small) {
    Var y = linear(x, Var::param(*l.weight), l.bias ? Var::param(*l.bias) : Var());
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
  cuda::small_linear(x.value().data<float>(), w.data<float>(),
                     l.bias ? l.bias->data.data<float>() : nullptr,
                     res.defined() ? res.value().data<float>() : nullptr, y.data<float>(), M, K, N,
                     gelu_after, s.native());
  return Var::output(y, false);
}

Var decode_block(const TransformerBlock& b, const Var& x,
                 const TransformerBlock::Attention& attend) {
  const Var qkv = decode_linear(b.ln1.forward(x), b.qkv, Var(), false);
  const Var h = decode_linear(attend(qkv), b.attn_proj, x, false);
  const Var up = decode_linear(b.ln2.forward(h), b.fc, Var(), true);
  return decode_linear(up, b.mlp_proj, h, false);
}

Var decode_depth(const MTPModule& m, const Var& h, const Var& emb,
                 const TransformerBlock::Attention& attend) {
  const Var z = decode_linear(concat_features(m.hnorm.forward(h), m.enorm.forward(emb)), m.proj,
                              Var(), false);
  return decode_block(m.block, z, attend);
}

}  // namespace gtron

#include "model/ops/attention.h"

#include "model/ops/device_util.h"
#include "model/stream.h"

namespace gtron {

Var causal_attention(const Var& qkv, int NH) {
  GTRON_CHECK(qkv.shape().rank() == 3, "causal_attention: qkv ", qkv.shape().str(),
              ", expected [B, T, 3C]");
  const int64_t B = qkv.shape()[0];
  const int64_t Tlen = qkv.shape()[1];
  const int64_t C3 = qkv.shape()[2];
  GTRON_CHECK(NH > 0 && C3 % (3 * static_cast<int64_t>(NH)) == 0, "causal_attention: qkv width ",
              C3, " is not 3·NH·HS for NH = ", NH);
  const int64_t C = C3 / 3;
  const int64_t HS = C / NH;

  Device dev = qkv.device();
  Stream& s = current_stream(dev);
  Tensor y = Tensor::empty(Shape{B, Tlen, C}, qkv.dtype(), dev, &s);
  // [B, NH, T] log-sum-exps, kept for the backward; fp32 on CUDA.
  Tensor lse =
      Tensor::empty(Shape{B, NH, Tlen}, dev.is_cuda() ? DType::kF32 : qkv.dtype(), dev, &s);
  if (dev.is_cuda()) {
    Tensor scratch =
        scratch_bytes(cuda::attention_forward_scratch_bytes(B, Tlen, NH, HS, qkv.dtype()), s);
    cuda::attention_forward(qkv.value().raw(), y.raw(), lse.data<float>(), scratch.raw(), B, Tlen,
                            NH, HS, qkv.dtype(), s.native());
  } else {
    dispatch_float(qkv.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* qp = qkv.value().data<T>();
      T* yp = y.data<T>();
      T* lp = lse.data<T>();
      s.run([=] { cpu::attention_forward<T>(qp, yp, lp, B, Tlen, NH, HS); });
    });
  }

  Var out = Var::output(y, qkv.requires_grad());
  if (out.requires_grad()) {
    record_backward([qkv, lse, out, B, Tlen, NH, HS] {
      if (!out.has_grad()) return;
      Stream& s = current_stream(out.device());
      if (out.device().is_cuda()) {
        Tensor scratch =
            scratch_bytes(cuda::attention_backward_scratch_bytes(B, Tlen, NH, HS, out.dtype()), s);
        cuda::attention_backward(qkv.value().raw(), lse.data<float>(), out.grad().raw(),
                                 qkv.grad().raw(), scratch.raw(), B, Tlen, NH, HS, out.dtype(),
                                 s.native());
        return;
      }
      dispatch_float(out.dtype(), [&](auto tag) {
        using T = decltype(tag);
        const T* qp = qkv.value().data<T>();
        const T* lp = lse.data<T>();
        const T* dyp = out.grad().data<T>();
        T* dq = qkv.grad().data<T>();
        s.run([=] { cpu::attention_backward<T>(qp, lp, dyp, dq, B, Tlen, NH, HS); });
      });
    });
  }
  return out;
}

}  // namespace gtron

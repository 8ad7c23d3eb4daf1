#include "model/ops/attention.h"

#include "model/ops/shape_check.h"
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
  require_cpu("causal_attention", dev);
  Stream& s = current_stream(dev);
  Tensor y = Tensor::empty(Shape{B, Tlen, C}, qkv.dtype(), dev, &s);
  Tensor lse = Tensor::empty(Shape{B, NH, Tlen}, qkv.dtype(), dev, &s);
  dispatch_float(qkv.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* qp = qkv.value().data<T>();
    T* yp = y.data<T>();
    T* lp = lse.data<T>();
    s.run([=] { cpu::attention_forward<T>(qp, yp, lp, B, Tlen, NH, HS); });
  });

  Var out = Var::output(y, qkv.requires_grad());
  if (out.requires_grad()) {
    record_backward([qkv, lse, out, B, Tlen, NH, HS] {
      if (!out.has_grad()) return;
      Stream& s = current_stream(out.device());
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

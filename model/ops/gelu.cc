#include "model/ops/gelu.h"

#include "model/ops/fp8.h"
#include "model/stream.h"

namespace gtron {

Var gelu(const Var& x, fp8::QuantizedRows* codes) {
  const int64_t n = x.value().numel();
  Device dev = x.device();
  Stream& s = current_stream(dev);
  Tensor y = Tensor::empty(x.shape(), x.dtype(), dev, &s);
  int64_t K = 0;           // the rows' width, with codes
  if (codes != nullptr) {  // Note [fp8 fused producers]
    GTRON_CHECK(dev.is_cuda() && x.dtype() == DType::kBF16 && x.shape().rank() >= 1,
                "gelu: fp8 codes of the output on CUDA in bf16 only; got ", dtype_name(x.dtype()),
                " on ", dev.str());
    K = x.shape()[x.shape().rank() - 1];
    *codes = fp8::scratch_rows(K > 0 ? n / K : 0, K, s);
  }
  if (dev.is_cuda()) {
    cuda::gelu_forward(x.value().raw(), y.raw(), n, x.dtype(), s.native(),
                       codes ? static_cast<uint8_t*>(codes->q.raw()) : nullptr,
                       codes ? codes->s.data<float>() : nullptr, K);
  } else {
    dispatch_float(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* xp = x.value().data<T>();
      T* yp = y.data<T>();
      s.run([=] { cpu::gelu_forward<T>(xp, yp, n); });
    });
  }

  Var out = Var::output(y, x.requires_grad());
  if (out.requires_grad()) {
    record_backward([x, out, n] {
      if (!out.has_grad()) return;
      Stream& s = current_stream(out.device());
      if (out.device().is_cuda()) {
        bool overwrite = false;
        Tensor& dx = x.grad_for_write(&overwrite);
        cuda::gelu_backward(x.value().raw(), out.grad().raw(), dx.raw(), n, out.dtype(), s.native(),
                            overwrite);
        return;
      }
      dispatch_float(out.dtype(), [&](auto tag) {
        using T = decltype(tag);
        const T* xp = x.value().data<T>();
        const T* dyp = out.grad().data<T>();
        T* dx = x.grad().data<T>();
        s.run([=] { cpu::gelu_backward<T>(xp, dyp, dx, n); });
      });
    });
  }
  return out;
}

}  // namespace gtron

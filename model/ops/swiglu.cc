#include "model/ops/swiglu.h"

#include <vector>

#include "model/ops/fp8.h"
#include "model/stream.h"

namespace gtron {

void swiglu_backward_cuda(const Var& x, const Tensor& dy, int64_t N, int64_t F) {
  Stream& s = current_stream(x.device());
  bool overwrite = false;
  Tensor& dx = x.grad_for_write(&overwrite);
  // Note [gradient fp8 codes]: dx's FP8 codes in the same pass, for the gate|up projection.
  if (overwrite && x.grad_codes_requested() && dy.dtype() == DType::kBF16 &&
      cuda::swiglu_backward_codes_ok(N, F, x.value().raw(), dy.raw(), dx.raw())) {
    GradCodes codes = fp8::scratch_grad_codes(N, 2 * F, s);
    const bool codes_only = x.grad_values_unread();  // dx's values: nobody reads them
    cuda::swiglu_backward_fp8(x.value().raw(), dy.raw(), codes_only ? nullptr : dx.raw(), N, F,
                              static_cast<uint8_t*>(codes.q.raw()), codes.s.data<float>(),
                              static_cast<uint8_t*>(codes.qt.raw()), codes.st.data<float>(),
                              s.native());
    x.set_grad_codes(std::move(codes), codes_only);
    return;
  }
  cuda::swiglu_backward(x.value().raw(), dy.raw(), dx.raw(), N, F, dy.dtype(), s.native(),
                        overwrite);
}

Var swiglu(const Var& x, fp8::QuantizedRows* codes) {
  const Shape& in = x.shape();
  GTRON_CHECK(in.rank() >= 1 && in[in.rank() - 1] > 0 && in[in.rank() - 1] % 2 == 0, "swiglu: x ",
              in.str(), ", expected [..., 2F] with F > 0");
  const int64_t F = in[in.rank() - 1] / 2;
  const int64_t N = x.value().numel() / (2 * F);
  std::vector<int64_t> dims = in.vec();
  dims.back() = F;
  const Shape out_shape(dims);

  Device dev = x.device();
  Stream& s = current_stream(dev);
  Tensor y = Tensor::empty(out_shape, x.dtype(), dev, &s);
  if (codes != nullptr) {  // Note [fp8 fused producers]
    GTRON_CHECK(dev.is_cuda() && x.dtype() == DType::kBF16,
                "swiglu: fp8 codes of the output on CUDA in bf16 only; got ", dtype_name(x.dtype()),
                " on ", dev.str());
    *codes = fp8::scratch_rows(N, F, s);
  }
  if (dev.is_cuda()) {
    cuda::swiglu_forward(x.value().raw(), y.raw(), N, F, x.dtype(), s.native(),
                         codes ? static_cast<uint8_t*>(codes->q.raw()) : nullptr,
                         codes ? codes->s.data<float>() : nullptr);
  } else {
    dispatch_float(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* xp = x.value().data<T>();
      T* yp = y.data<T>();
      s.run([=] { cpu::swiglu_forward<T>(xp, yp, N, F); });
    });
  }

  Var out = Var::output(y, x.requires_grad());
  if (out.requires_grad()) {
    record_backward([x, out, N, F] {
      if (!out.has_grad()) return;
      Stream& s = current_stream(out.device());
      if (out.device().is_cuda()) {
        swiglu_backward_cuda(x, out.grad(), N, F);
        return;
      }
      dispatch_float(out.dtype(), [&](auto tag) {
        using T = decltype(tag);
        const T* xp = x.value().data<T>();
        const T* dyp = out.grad().data<T>();
        T* dx = x.grad().data<T>();
        s.run([=] { cpu::swiglu_backward<T>(xp, dyp, dx, N, F); });
      });
    });
  }
  return out;
}

}  // namespace gtron

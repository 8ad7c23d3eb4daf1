#include "model/ops/swiglu.h"

#include <vector>

#include "model/stream.h"

namespace gtron {

Var swiglu(const Var& x) {
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
  if (dev.is_cuda()) {
    cuda::swiglu_forward(x.value().raw(), y.raw(), N, F, x.dtype(), s.native());
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
        bool overwrite = false;
        Tensor& dx = x.grad_for_write(&overwrite);
        cuda::swiglu_backward(x.value().raw(), out.grad().raw(), dx.raw(), N, F, out.dtype(),
                              s.native(), overwrite);
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

#include "model/ops/add.h"

#include "model/ops/shape_check.h"
#include "model/stream.h"

namespace gtron {

void accumulate_into(Tensor& dst, const Tensor& src) {
  check_shape("accumulate_into", src.shape(), dst.shape());
  Stream& s = current_stream(dst.device());
  const int64_t n = dst.numel();
  if (dst.device().is_cuda()) {
    cuda::accumulate(dst.raw(), src.raw(), n, dst.dtype(), s.native());
    return;
  }
  dispatch_float(dst.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* d = dst.data<T>();
    const T* p = src.data<T>();
    s.run([=] { cpu::accumulate<T>(d, p, n); });
  });
}

Var add(const Var& a, const Var& b) {
  check_shape("add", b.shape(), a.shape());
  check_same_device_dtype("add", a.value(), b.value());
  Device dev = a.device();
  Stream& s = current_stream(dev);
  Tensor y = Tensor::empty(a.shape(), a.dtype(), dev, &s);
  const int64_t n = y.numel();
  if (dev.is_cuda()) {
    cuda::add_forward(a.value().raw(), b.value().raw(), y.raw(), n, y.dtype(), s.native());
  } else {
    dispatch_float(a.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* ap = a.value().data<T>();
      const T* bp = b.value().data<T>();
      T* yp = y.data<T>();
      s.run([=] { cpu::add_forward<T>(ap, bp, yp, n); });
    });
  }
  Var out = Var::output(y, a.requires_grad() || b.requires_grad());
  if (out.requires_grad()) {
    record_backward([a, b, out] {
      if (!out.has_grad()) return;
      if (a.requires_grad()) accumulate_into(a.grad(), out.grad());
      if (b.requires_grad()) accumulate_into(b.grad(), out.grad());
    });
  }
  return out;
}

}  // namespace gtron

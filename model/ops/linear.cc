#include "model/ops/linear.h"

#include "model/ops/shape_check.h"
#include "model/stream.h"

namespace gtron {

Var linear(const Var& x, const Var& w, const Var& b) {
  const int64_t Cin = x.shape()[x.shape().rank() - 1];
  const int64_t N = x.value().numel() / Cin;
  const int64_t Cout = w.shape()[0];
  check_shape("linear weight", w.shape(), Shape{Cout, Cin});
  if (b.defined()) check_shape("linear bias", b.shape(), Shape{Cout});
  check_same_device_dtype("linear", x.value(), w.value());

  std::vector<int64_t> ydims = x.shape().vec();
  ydims.back() = Cout;
  Device dev = x.device();
  Stream& s = current_stream(dev);
  Tensor y = Tensor::empty(Shape(ydims), x.dtype(), dev, &s);
  require_cpu("linear", dev);
  dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* xp = x.value().data<T>();
    const T* wp = w.value().data<T>();
    const T* bp = b.defined() ? b.value().data<T>() : nullptr;
    T* yp = y.data<T>();
    s.run([=] { cpu::linear_forward<T>(xp, wp, bp, yp, N, Cin, Cout); });
  });

  bool need = x.requires_grad() || w.requires_grad() || (b.defined() && b.requires_grad());
  Var out = Var::output(y, need);
  if (out.requires_grad()) {
    record_backward([x, w, b, out, N, Cin, Cout] {
      if (!out.has_grad()) return;
      Stream& s = current_stream(out.device());
      dispatch_float(out.dtype(), [&](auto tag) {
        using T = decltype(tag);
        const T* xp = x.value().data<T>();
        const T* wp = w.value().data<T>();
        const T* dyp = out.grad().data<T>();
        T* dx = x.requires_grad() ? x.grad().data<T>() : nullptr;
        T* dw = w.requires_grad() ? w.grad().data<T>() : nullptr;
        T* db = b.defined() && b.requires_grad() ? b.grad().data<T>() : nullptr;
        s.run([=] { cpu::linear_backward<T>(xp, wp, dyp, dx, dw, db, N, Cin, Cout); });
      });
    });
  }
  return out;
}

}  // namespace gtron

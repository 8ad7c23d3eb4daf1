#include "model/ops/loss.h"

#include <vector>

#include "model/ops/shape_check.h"
#include "model/stream.h"

namespace gtron {

Var cross_entropy(const Var& logits, const Tensor& targets, int64_t V) {
  GTRON_CHECK(logits.shape().rank() >= 1, "cross_entropy: logits ", logits.shape().str(),
              " have no vocab dim");
  std::vector<int64_t> lead = logits.shape().vec();
  const int64_t Vp = lead.back();
  lead.pop_back();
  GTRON_CHECK(V > 0 && V <= Vp, "cross_entropy: V = ", V, " outside (0, Vp = ", Vp, "]");
  GTRON_CHECK(targets.dtype() == DType::kI32 && targets.device().is_cpu(),
              "cross_entropy: targets must be a CPU i32 tensor; got ", targets.device().str(), "/",
              dtype_name(targets.dtype()));
  check_shape("cross_entropy targets", targets.shape(), Shape(lead));
  const int64_t N = targets.numel();

  Device dev = logits.device();
  require_cpu("cross_entropy", dev);
  Stream& s = current_stream(dev);
  Tensor loss = Tensor::empty(Shape{}, logits.dtype(), dev, &s);
  Tensor rmax = Tensor::empty(Shape{N}, logits.dtype(), dev, &s);  // [N], kept for backward
  Tensor rlse = Tensor::empty(Shape{N}, logits.dtype(), dev, &s);  // [N], kept for backward
  dispatch_float(logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* lp = logits.value().data<T>();
    const int32_t* tp = targets.data<int32_t>();
    T* mp = rmax.data<T>();
    T* sp = rlse.data<T>();
    T* yp = loss.data<T>();
    s.run([=] { cpu::cross_entropy_forward<T>(lp, tp, mp, sp, yp, N, V, Vp); });
  });

  Var out = Var::output(loss, logits.requires_grad());
  if (out.requires_grad()) {
    record_backward([logits, targets, rmax, rlse, out, N, V, Vp] {
      if (!out.has_grad()) return;
      Stream& s = current_stream(out.device());
      dispatch_float(out.dtype(), [&](auto tag) {
        using T = decltype(tag);
        const T* lp = logits.value().data<T>();
        const int32_t* tp = targets.data<int32_t>();
        const T* mp = rmax.data<T>();
        const T* sp = rlse.data<T>();
        const T* dyp = out.grad().data<T>();
        T* dl = logits.grad().data<T>();
        s.run([=] { cpu::cross_entropy_backward<T>(lp, tp, mp, sp, dyp, dl, N, V, Vp); });
      });
    });
  }
  return out;
}

Var scale(const Var& x, double factor) {
  const int64_t n = x.value().numel();
  Device dev = x.device();
  require_cpu("scale", dev);
  Stream& s = current_stream(dev);
  Tensor y = Tensor::empty(x.shape(), x.dtype(), dev, &s);
  dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* xp = x.value().data<T>();
    T* yp = y.data<T>();
    s.run([=] { cpu::scale_forward<T>(xp, yp, n, factor); });
  });

  Var out = Var::output(y, x.requires_grad());
  if (out.requires_grad()) {
    record_backward([x, out, n, factor] {
      if (!out.has_grad()) return;
      Stream& s = current_stream(out.device());
      dispatch_float(out.dtype(), [&](auto tag) {
        using T = decltype(tag);
        const T* dyp = out.grad().data<T>();
        T* dx = x.grad().data<T>();
        s.run([=] { cpu::scale_backward<T>(dyp, dx, n, factor); });
      });
    });
  }
  return out;
}

}  // namespace gtron

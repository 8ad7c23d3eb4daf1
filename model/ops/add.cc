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

void hand_on_gradient(const Var& in, const Tensor& grad) {
  if (!in.requires_grad()) return;
  if (in.has_grad()) {
    accumulate_into(in.grad(), grad);
  } else {
    in.set_grad(grad);
  }
}

namespace {

// Note [add backward aliasing]
// out.grad is final when add's backward runs (every consumer of out ran its backward first) and
// nothing reads it afterwards, so one input whose gradient slot is still empty may take out.grad's
// buffer itself (no copy, no kernel); a second empty slot gets a copy (two inputs sharing one
// buffer would see each other's later accumulations). A slot already holding gradient
// accumulates. Along the residual stream this keeps one gradient buffer per block.
void add_backward_cuda(const Var& a, const Var& b, const Var& out) {
  bool aliased = false;
  for (const Var* in : {&a, &b}) {
    if (!in->requires_grad()) continue;
    if (in->has_grad()) {
      accumulate_into(in->grad(), out.grad());
    } else if (!aliased) {
      in->set_grad(out.grad());
      aliased = true;
    } else {
      in->set_grad(out.grad().clone(&current_stream(out.device())));
    }
  }
}

}  // namespace

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
      if (out.device().is_cuda()) {
        add_backward_cuda(a, b, out);
        return;
      }
      if (a.requires_grad()) accumulate_into(a.grad(), out.grad());
      if (b.requires_grad()) accumulate_into(b.grad(), out.grad());
    });
  }
  return out;
}

}  // namespace gtron

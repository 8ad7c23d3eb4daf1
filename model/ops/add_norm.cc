#include "model/ops/add_norm.h"

#include <vector>

#include "model/ops/add.h"
#include "model/ops/column_scratch.h"
#include "model/ops/device_util.h"
#include "model/ops/shape_check.h"
#include "model/stream.h"

namespace gtron {

namespace {

// Where the summed gradient of h still has to go after the aliasing: a slot to add into, or an
// empty one to write (Note [fused residual add and LayerNorm]).
struct Delivery {
  const Var* in;
  bool add;
};

// add's delivery rule over x then a (Note [add backward aliasing]): the first empty slot takes
// dh's buffer now; the others are returned in order.
std::vector<Delivery> plan_delivery(const Var& x, const Var& a, const Tensor& dh) {
  std::vector<Delivery> rest;
  bool aliased = false;
  for (const Var* in : {&x, &a}) {
    if (!in->requires_grad()) continue;
    if (in->has_grad()) {
      rest.push_back({in, true});
    } else if (!aliased) {
      in->set_grad(dh);
      aliased = true;
    } else {
      rest.push_back({in, false});
    }
  }
  return rest;
}

void deliver(const Delivery& d, const Tensor& dh, Stream& s) {
  if (d.add) {
    accumulate_into(d.in->grad(), dh);
  } else {
    d.in->set_grad(dh.clone(&s));
  }
}

struct Saved {
  Var x, a, gamma, beta, h, y;
  Tensor mean, rstd;  // [N] f32
  int64_t N, C;
};

void add_layernorm_backward_cuda(const Saved& v) {
  const bool dy = v.y.has_grad();
  const bool dres = v.h.requires_grad() && v.h.has_grad();
  if (!dy && !dres) return;
  Stream& s = current_stream(v.y.device());
  const bool want_params = dy && (v.gamma.requires_grad() || v.beta.requires_grad());
  Tensor scratch;
  if (want_params) scratch = column_scratch(cuda::layernorm_backward_scratch_floats(v.N, v.C), s);
  float* dgamma =
      dy && v.gamma.requires_grad() ? f32_grad("add_layernorm gamma", v.gamma.grad()) : nullptr;
  float* dbeta =
      dy && v.beta.requires_grad() ? f32_grad("add_layernorm beta", v.beta.grad()) : nullptr;
  float* scratch_p = want_params ? scratch.data<float>() : nullptr;
  const DType act = v.h.dtype();
  if (!v.h.requires_grad()) {  // only gamma and beta want gradients
    cuda::layernorm_backward(v.h.value().raw(), v.gamma.value().raw(), v.gamma.dtype(),
                             v.mean.data<float>(), v.rstd.data<float>(), v.y.grad().raw(), nullptr,
                             dgamma, dbeta, scratch_p, v.N, v.C, act, s.native());
    return;
  }
  Tensor dh = v.h.grad();  // the residual gradient (zeros when h has no other consumer)
  std::vector<Delivery> rest = plan_delivery(v.x, v.a, dh);
  if (dy) {
    // The first delivery whose slot is not dh itself (add_layernorm(x, x)) rides in the kernel.
    void* also = nullptr;
    bool also_add = false;
    for (auto it = rest.begin(); it != rest.end(); ++it) {
      bool empty = false;
      Tensor& slot = it->add ? it->in->grad() : it->in->grad_for_write(&empty);
      GTRON_CHECK(it->add || empty, "add_layernorm: a write target's gradient slot is not empty");
      if (slot.raw() == dh.raw()) continue;
      GTRON_CHECK(slot.dtype() == act, "add_layernorm: gradient slot of dtype ",
                  dtype_name(slot.dtype()), " for ", dtype_name(act), " activations");
      also = slot.raw();
      also_add = it->add;
      rest.erase(it);
      break;
    }
    cuda::add_layernorm_backward(v.h.value().raw(), v.gamma.value().raw(), v.gamma.dtype(),
                                 v.mean.data<float>(), v.rstd.data<float>(), v.y.grad().raw(),
                                 dh.raw(), also, also_add, dgamma, dbeta, scratch_p, v.N, v.C, act,
                                 s.native());
  }
  for (const Delivery& d : rest) deliver(d, dh, s);
}

}  // namespace

AddNorm add_layernorm(const Var& x, const Var& a, const Var& gamma, const Var& beta, double eps) {
  if (!x.device().is_cuda()) {
    Var h = add(x, a);
    return {h, layernorm(h, gamma, beta, eps)};
  }
  GTRON_CHECK(x.shape().rank() >= 1, "add_layernorm: x must have a feature dim; got ",
              x.shape().str());
  check_shape("add_layernorm a", a.shape(), x.shape());
  check_same_device_dtype("add_layernorm", x.value(), a.value());
  const int64_t C = x.shape()[x.shape().rank() - 1];
  const int64_t N = C > 0 ? x.value().numel() / C : 0;
  check_shape("add_layernorm gamma", gamma.shape(), Shape{C});
  check_shape("add_layernorm beta", beta.shape(), Shape{C});
  check_param_operand("add_layernorm", x.value(), gamma.value());
  check_same_device_dtype("add_layernorm", gamma.value(), beta.value());

  Stream& s = current_stream(x.device());
  Tensor h = Tensor::empty(x.shape(), x.dtype(), x.device(), &s);
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device(), &s);
  Tensor mean = Tensor::empty(Shape{N}, DType::kF32, x.device(), &s);
  Tensor rstd = Tensor::empty(Shape{N}, DType::kF32, x.device(), &s);
  cuda::add_layernorm_forward(
      x.value().raw(), a.value().raw(), gamma.value().raw(), beta.value().raw(), gamma.dtype(),
      h.raw(), y.raw(), mean.data<float>(), rstd.data<float>(), N, C, eps, x.dtype(), s.native());
  const bool need_h = x.requires_grad() || a.requires_grad();
  AddNorm out{Var::output(h, need_h),
              Var::output(y, need_h || gamma.requires_grad() || beta.requires_grad())};
  if (out.y.requires_grad()) {
    Saved v{x, a, gamma, beta, out.h, out.y, mean, rstd, N, C};
    record_backward([v] { add_layernorm_backward_cuda(v); });
  }
  return out;
}

}  // namespace gtron

#include "model/ops/add_norm.h"

#include <string>
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

// The first delivery whose slot is not dh itself (add_layernorm(x, x)) rides in the norm's
// kernel: taken out of `rest`; returns its slot (null: none) and whether it adds into it.
void* take_kernel_delivery(const char* op, std::vector<Delivery>* rest, const Tensor& dh,
                           bool* also_add) {
  for (auto it = rest->begin(); it != rest->end(); ++it) {
    bool empty = false;
    Tensor& slot = it->add ? it->in->grad() : it->in->grad_for_write(&empty);
    GTRON_CHECK(it->add || empty, op, ": a write target's gradient slot is not empty");
    if (slot.raw() == dh.raw()) continue;
    GTRON_CHECK(slot.dtype() == dh.dtype(), op, ": gradient slot of dtype ",
                dtype_name(slot.dtype()), " for ", dtype_name(dh.dtype()), " activations");
    *also_add = it->add;
    rest->erase(it);
    return slot.raw();
  }
  return nullptr;
}

// What the backward keeps. beta is undefined for RMSNorm, and so is mean (rstd: rmsnorm's rrms).
struct Saved {
  Var x, a, gamma, beta, h, y;
  Tensor mean, rstd;  // [N] f32
  int64_t N, C;
  const char* op;  // "add_layernorm" or "add_rmsnorm"
  bool ln() const { return beta.defined(); }
};

// The norm's backward alone, into gamma (and beta) only: x and a want no gradient.
void norm_params_backward(const Saved& v, float* dgamma, float* dbeta, float* scratch, Stream& s) {
  const void* h = v.h.value().raw();
  if (v.ln()) {
    cuda::layernorm_backward(h, v.gamma.value().raw(), v.gamma.dtype(), v.mean.data<float>(),
                             v.rstd.data<float>(), v.y.grad().raw(), nullptr, dgamma, dbeta,
                             scratch, v.N, v.C, v.h.dtype(), s.native());
  } else {
    cuda::rmsnorm_backward(h, v.gamma.value().raw(), v.gamma.dtype(), v.rstd.data<float>(),
                           v.y.grad().raw(), nullptr, dgamma, scratch, v.N, v.C, v.h.dtype(),
                           s.native());
  }
}

void add_norm_backward_cuda(const Saved& v) {
  const bool dy = v.y.has_grad();
  const bool dres = v.h.requires_grad() && v.h.has_grad();
  if (!dy && !dres) return;
  Stream& s = current_stream(v.y.device());
  const bool beta_learns = v.ln() && v.beta.requires_grad();
  const bool want_params = dy && (v.gamma.requires_grad() || beta_learns);
  Tensor scratch;
  if (want_params) {
    scratch = column_scratch(v.ln() ? cuda::layernorm_backward_scratch_floats(v.N, v.C)
                                    : cuda::rmsnorm_backward_scratch_floats(v.N, v.C),
                             s);
  }
  float* dgamma = dy && v.gamma.requires_grad() ? f32_grad(v.op, v.gamma.grad()) : nullptr;
  float* dbeta = dy && beta_learns ? f32_grad(v.op, v.beta.grad()) : nullptr;
  float* scratch_p = want_params ? scratch.data<float>() : nullptr;
  const DType act = v.h.dtype();
  if (!v.h.requires_grad()) {  // only gamma and beta want gradients
    norm_params_backward(v, dgamma, dbeta, scratch_p, s);
    return;
  }
  Tensor dh = v.h.grad();  // the residual gradient (zeros when h has no other consumer)
  std::vector<Delivery> rest = plan_delivery(v.x, v.a, dh);
  if (dy) {
    bool also_add = false;
    void* also = take_kernel_delivery(v.op, &rest, dh, &also_add);
    if (v.ln()) {
      cuda::add_layernorm_backward(v.h.value().raw(), v.gamma.value().raw(), v.gamma.dtype(),
                                   v.mean.data<float>(), v.rstd.data<float>(), v.y.grad().raw(),
                                   dh.raw(), also, also_add, dgamma, dbeta, scratch_p, v.N, v.C,
                                   act, s.native());
    } else {
      cuda::add_rmsnorm_backward(v.h.value().raw(), v.gamma.value().raw(), v.gamma.dtype(),
                                 v.rstd.data<float>(), v.y.grad().raw(), dh.raw(), also, also_add,
                                 dgamma, scratch_p, v.N, v.C, act, s.native());
    }
  }
  for (const Delivery& d : rest) deliver(d, dh, s);
}

// The CUDA op of both norms (beta undefined: RMSNorm).
AddNorm add_norm_cuda(const char* op, const Var& x, const Var& a, const Var& gamma, const Var& beta,
                      double eps) {
  const bool ln = beta.defined();
  GTRON_CHECK(x.shape().rank() >= 1, op, ": x must have a feature dim; got ", x.shape().str());
  const std::string name = op;
  check_shape((name + " a").c_str(), a.shape(), x.shape());
  check_same_device_dtype(op, x.value(), a.value());
  const int64_t C = x.shape()[x.shape().rank() - 1];
  const int64_t N = C > 0 ? x.value().numel() / C : 0;
  check_shape((name + " gamma").c_str(), gamma.shape(), Shape{C});
  check_param_operand(op, x.value(), gamma.value());
  if (ln) {
    check_shape((name + " beta").c_str(), beta.shape(), Shape{C});
    check_same_device_dtype(op, gamma.value(), beta.value());
  }

  Stream& s = current_stream(x.device());
  Tensor h = Tensor::empty(x.shape(), x.dtype(), x.device(), &s);
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device(), &s);
  Tensor mean = ln ? Tensor::empty(Shape{N}, DType::kF32, x.device(), &s) : Tensor();
  Tensor rstd = Tensor::empty(Shape{N}, DType::kF32, x.device(), &s);
  if (ln) {
    cuda::add_layernorm_forward(
        x.value().raw(), a.value().raw(), gamma.value().raw(), beta.value().raw(), gamma.dtype(),
        h.raw(), y.raw(), mean.data<float>(), rstd.data<float>(), N, C, eps, x.dtype(), s.native());
  } else {
    cuda::add_rmsnorm_forward(x.value().raw(), a.value().raw(), gamma.value().raw(), gamma.dtype(),
                              h.raw(), y.raw(), rstd.data<float>(), N, C, eps, x.dtype(),
                              s.native());
  }
  const bool need_h = x.requires_grad() || a.requires_grad();
  const bool params_learn = gamma.requires_grad() || (ln && beta.requires_grad());
  AddNorm out{Var::output(h, need_h), Var::output(y, need_h || params_learn)};
  if (out.y.requires_grad()) {
    Saved v{x, a, gamma, beta, out.h, out.y, mean, rstd, N, C, op};
    record_backward([v] { add_norm_backward_cuda(v); });
  }
  return out;
}

}  // namespace

AddNorm add_layernorm(const Var& x, const Var& a, const Var& gamma, const Var& beta, double eps) {
  if (!x.device().is_cuda()) {
    Var h = add(x, a);
    return {h, layernorm(h, gamma, beta, eps)};
  }
  GTRON_CHECK(beta.defined(), "add_layernorm: beta is undefined");
  return add_norm_cuda("add_layernorm", x, a, gamma, beta, eps);
}

AddNorm add_rmsnorm(const Var& x, const Var& a, const Var& gamma, double eps) {
  if (!x.device().is_cuda()) {  // the reference: the composed ops' tape, node for node
    Var h = add(x, a);
    return {h, rmsnorm(h, gamma, eps)};
  }
  return add_norm_cuda("add_rmsnorm", x, a, gamma, Var(), eps);
}

}  // namespace gtron

#include "model/ops/moe_dispatch.h"

#include "model/ops/device_util.h"
#include "model/ops/shape_check.h"
#include "model/stream.h"

namespace gtron {

MoePlan moe_plan(const Tensor& ids, int64_t E, int64_t* load, const Tensor& device_load) {
  GTRON_CHECK(ids.dtype() == DType::kI32 && ids.rank() == 2 && E > 0, "moe_plan: ids ",
              ids.shape().str(), " ", dtype_name(ids.dtype()), ", expected i32 [N, k]; E ", E);
  MoePlan p;
  p.N = ids.dim(0);
  p.k = static_cast<int>(ids.dim(1));
  p.E = E;
  Stream& s = current_stream(ids.device());
  p.pos = Tensor::empty({p.N * p.k}, DType::kI32, ids.device(), &s);
  p.src = Tensor::empty({p.N * p.k}, DType::kI32, ids.device(), &s);
  p.offsets = Tensor::empty({E + 1}, DType::kI32, ids.device(), &s);
  const int32_t* ip = ids.data<int32_t>();
  int32_t* pos = p.pos.data<int32_t>();
  int32_t* src = p.src.data<int32_t>();
  int32_t* off = p.offsets.data<int32_t>();
  const int64_t N = p.N;
  const int k = p.k;
  if (ids.device().is_cuda()) {
    GTRON_CHECK(load == nullptr, "moe_plan: CUDA counts the load on the device (device_load)");
    if (device_load.defined()) {
      GTRON_CHECK(device_load.device() == ids.device() && device_load.dtype() == DType::kI32 &&
                      device_load.numel() == E,
                  "moe_plan: device_load ", device_load.shape().str(), " ",
                  dtype_name(device_load.dtype()), " on ", device_load.device().str(),
                  ", expected i32 [", E, "] on ", ids.device().str());
    }
    Tensor scratch = scratch_bytes(cuda::moe_plan_scratch_bytes(N * k, E), s);
    cuda::moe_plan(ip, N, k, E, pos, src, off,
                   device_load.defined() ? device_load.data<int32_t>() : nullptr, scratch.raw(),
                   s.native());
    return p;
  }
  GTRON_CHECK(!device_load.defined(), "moe_plan: device_load is for CUDA ids");
  s.run([=] { cpu::moe_plan(ip, N, k, E, pos, src, off, load); });
  return p;
}

Var moe_dispatch(const Var& x, const MoePlan& plan) {
  const int64_t C = x.shape()[x.shape().rank() - 1];
  GTRON_CHECK(x.value().numel() == plan.N * C, "moe_dispatch: x ", x.shape().str(), " for ", plan.N,
              " tokens");
  const int64_t N = plan.N;
  const int k = plan.k;
  Stream& s = current_stream(x.device());
  Tensor xp = Tensor::empty({N * k, C}, x.dtype(), x.device(), &s);
  if (x.device().is_cuda()) {
    GTRON_CHECK(plan.src.device() == x.device(), "moe_dispatch: the plan on ",
                plan.src.device().str(), ", x on ", x.device().str());
    cuda::moe_dispatch_forward(x.value().raw(), plan.src.data<int32_t>(), xp.raw(), N, k, C,
                               x.dtype(), s.native());
  } else {
    dispatch_float(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* in = x.value().data<T>();
      const int32_t* src = plan.src.data<int32_t>();
      T* out = xp.data<T>();
      s.run([=] { cpu::moe_dispatch_forward<T>(in, src, out, N, k, C); });
    });
  }
  Var out = Var::output(xp, x.requires_grad());
  if (out.requires_grad()) {
    record_backward([x, out, pos = plan.pos, N, k, C] {
      if (!out.has_grad()) return;
      if (out.device().is_cuda()) {
        bool overwrite = false;
        Tensor& dx = x.grad_for_write(&overwrite);
        cuda::moe_dispatch_backward(out.grad().raw(), pos.data<int32_t>(), dx.raw(), N, k, C,
                                    out.dtype(), current_stream(out.device()).native(), overwrite);
        return;
      }
      dispatch_float(out.dtype(), [&](auto tag) {
        using T = decltype(tag);
        const T* dxp = out.grad().data<T>();
        const int32_t* pp = pos.data<int32_t>();
        T* dx = x.grad().data<T>();
        current_stream(out.device()).run([=] {
          cpu::moe_dispatch_backward<T>(dxp, pp, dx, N, k, C);
        });
      });
    });
  }
  return out;
}

Var moe_combine(const Var& yp, const Var& gates, const MoePlan& plan, const Shape& out_shape) {
  const int64_t N = plan.N;
  const int k = plan.k;
  GTRON_CHECK(yp.shape().rank() == 2 && yp.shape()[0] == N * k, "moe_combine: yp ",
              yp.shape().str(), ", expected [", N * k, ", C]");
  const int64_t C = yp.shape()[1];
  check_shape("moe_combine gates", gates.shape(), Shape{N, k});
  // Note [fp32 routing on CUDA]: f32 gates next to bf16 rows on CUDA.
  check_param_operand("moe_combine", yp.value(), gates.value());
  GTRON_CHECK(out_shape.numel() == N * C && out_shape[out_shape.rank() - 1] == C,
              "moe_combine: output ", out_shape.str(), " for ", N, " rows of ", C);
  Stream& s = current_stream(yp.device());
  Tensor y = Tensor::empty(out_shape, yp.dtype(), yp.device(), &s);
  if (yp.device().is_cuda()) {
    cuda::moe_combine_forward(yp.value().raw(), gates.value().raw(), plan.pos.data<int32_t>(),
                              y.raw(), N, k, C, yp.dtype(), gates.dtype(), s.native());
  } else {
    dispatch_float(yp.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* ypp = yp.value().data<T>();
      const T* gp = gates.value().data<T>();
      const int32_t* pp = plan.pos.data<int32_t>();
      T* out = y.data<T>();
      s.run([=] { cpu::moe_combine_forward<T>(ypp, gp, pp, out, N, k, C); });
    });
  }
  Var out = Var::output(y, yp.requires_grad() || gates.requires_grad());
  if (out.requires_grad()) {
    record_backward([yp, gates, out, pos = plan.pos, N, k, C] {
      if (!out.has_grad()) return;
      if (out.device().is_cuda()) {
        bool overwrite = false;
        void* dyp = yp.requires_grad() ? yp.grad_for_write(&overwrite).raw() : nullptr;
        void* dg = gates.requires_grad() ? gates.grad().raw() : nullptr;
        cuda::moe_combine_backward(yp.value().raw(), gates.value().raw(), pos.data<int32_t>(),
                                   out.grad().raw(), dyp, overwrite, dg, N, k, C, out.dtype(),
                                   gates.dtype(), current_stream(out.device()).native());
        return;
      }
      dispatch_float(out.dtype(), [&](auto tag) {
        using T = decltype(tag);
        const T* ypp = yp.value().data<T>();
        const T* gp = gates.value().data<T>();
        const int32_t* pp = pos.data<int32_t>();
        const T* dy = out.grad().data<T>();
        T* dyp = yp.requires_grad() ? yp.grad().data<T>() : nullptr;
        T* dg = gates.requires_grad() ? gates.grad().data<T>() : nullptr;
        current_stream(out.device()).run([=] {
          cpu::moe_combine_backward<T>(ypp, gp, pp, dy, dyp, dg, N, k, C);
        });
      });
    });
  }
  return out;
}

}  // namespace gtron

#include "model/ops/qk_norm.h"

#include "model/ops/device_util.h"
#include "model/ops/shape_check.h"
#include "model/stream.h"

namespace gtron {

Var qk_rmsnorm(const Var& qkv, int NH, int NKV, int64_t HS, const Var& gamma_q, const Var& gamma_k,
               double eps, const QkNormRope* rope) {
  GTRON_CHECK(NH > 0 && NKV > 0 && HS > 0, "qk_rmsnorm: NH ", NH, ", NKV ", NKV, ", HS ", HS);
  const int64_t W = (NH + 2 * NKV) * HS;
  GTRON_CHECK(qkv.shape().rank() >= 1 && qkv.shape()[qkv.shape().rank() - 1] == W,
              "qk_rmsnorm: rows of (NH + 2·NKV)·HS = ", W, " expected; got ", qkv.shape().str());
  check_shape("qk_rmsnorm gamma_q", gamma_q.shape(), Shape{HS});
  check_shape("qk_rmsnorm gamma_k", gamma_k.shape(), Shape{HS});
  check_param_operand("qk_rmsnorm", qkv.value(), gamma_q.value());
  check_same_device_dtype("qk_rmsnorm", gamma_q.value(), gamma_k.value());
  const int64_t N = qkv.value().numel() / W;

  Device dev = qkv.device();
  Stream& s = current_stream(dev);
  Tensor y = Tensor::empty(qkv.shape(), qkv.dtype(), dev, &s);
  const DType stat = dev.is_cuda() ? DType::kF32 : qkv.dtype();
  Tensor rrms = Tensor::empty(Shape{std::max<int64_t>(N * (NH + NKV), 1)}, stat, dev, &s);
  GTRON_CHECK(rope == nullptr || (dev.is_cuda() && qkv.shape().rank() == 3),
              "qk_rmsnorm: the fused RoPE runs on CUDA over [B, T, W] rows; got ", dev.str(), " ",
              qkv.shape().str());
  if (dev.is_cuda()) {
    cuda::QkRope r;
    if (rope != nullptr) {
      check_shape("qk_rmsnorm rope inv_freq", rope->inv_freq.shape(), Shape{HS / 2});
      GTRON_CHECK(rope->inv_freq.device() == dev && rope->inv_freq.dtype() == DType::kF32,
                  "qk_rmsnorm: the RoPE table must be rope_table's f32 table on ", dev.str());
      r = cuda::QkRope{rope->inv_freq.data<float>(), qkv.shape()[1], rope->pos0};
    }
    cuda::qk_rmsnorm_forward(qkv.value().raw(), gamma_q.value().raw(), gamma_k.value().raw(),
                             gamma_q.dtype(), y.raw(), rrms.data<float>(), N, NH, NKV, HS, eps,
                             qkv.dtype(), s.native(), rope != nullptr ? &r : nullptr);
  } else {
    dispatch_float(qkv.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* xp = qkv.value().data<T>();
      const T* gq = gamma_q.value().data<T>();
      const T* gk = gamma_k.value().data<T>();
      T* yp = y.data<T>();
      T* rp = rrms.data<T>();
      s.run([=] { cpu::qk_rmsnorm_forward<T>(xp, gq, gk, yp, rp, N, NH, NKV, HS, eps); });
    });
  }

  Var out =
      Var::output(y, qkv.requires_grad() || gamma_q.requires_grad() || gamma_k.requires_grad());
  if (out.requires_grad()) {
    record_backward([qkv, gamma_q, gamma_k, rrms, out, N, NH, NKV, HS] {
      if (!out.has_grad()) return;
      Stream& s = current_stream(out.device());
      if (out.device().is_cuda()) {
        const bool dg = gamma_q.requires_grad() || gamma_k.requires_grad();
        Tensor scratch;
        if (dg)
          scratch = scratch_floats(cuda::qk_rmsnorm_backward_scratch_floats(N, NH, NKV, HS), s);
        // The q|k|v projection's output has no other consumer: its gradient slot is usually
        // empty here, and then written rather than zeroed and added to.
        bool overwrite = false;
        void* dx = qkv.requires_grad() ? qkv.grad_for_write(&overwrite).raw() : nullptr;
        cuda::qk_rmsnorm_backward(
            qkv.value().raw(), gamma_q.value().raw(), gamma_k.value().raw(), gamma_q.dtype(),
            rrms.data<float>(), out.grad().raw(), dx,
            gamma_q.requires_grad() ? f32_grad("qk_rmsnorm gamma_q", gamma_q.grad()) : nullptr,
            gamma_k.requires_grad() ? f32_grad("qk_rmsnorm gamma_k", gamma_k.grad()) : nullptr,
            dg ? scratch.data<float>() : nullptr, N, NH, NKV, HS, out.dtype(), s.native(),
            overwrite);
        return;
      }
      dispatch_float(out.dtype(), [&](auto tag) {
        using T = decltype(tag);
        const T* xp = qkv.value().data<T>();
        const T* gq = gamma_q.value().data<T>();
        const T* gk = gamma_k.value().data<T>();
        const T* rp = rrms.data<T>();
        const T* dyp = out.grad().data<T>();
        T* dx = qkv.requires_grad() ? qkv.grad().data<T>() : nullptr;
        T* dgq = gamma_q.requires_grad() ? gamma_q.grad().data<T>() : nullptr;
        T* dgk = gamma_k.requires_grad() ? gamma_k.grad().data<T>() : nullptr;
        s.run([=] {
          cpu::qk_rmsnorm_backward<T>(xp, gq, gk, rp, dyp, dx, dgq, dgk, N, NH, NKV, HS);
        });
      });
    });
  }
  return out;
}

}  // namespace gtron

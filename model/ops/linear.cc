#include "model/ops/linear.h"

#include "model/ops/add.h"
#include "model/ops/column_scratch.h"
#include "model/ops/device_util.h"
#include "model/ops/fp8.h"
#include "model/ops/shape_check.h"
#include "model/stream.h"

namespace gtron {

Var linear(const Var& x, const Var& w, const Var& b, const Var& residual, bool fp8,
           const fp8::QuantizedWeight* wq, const fp8::QuantizedRows* xq) {
  if (residual.defined() && !x.device().is_cuda()) {
    return add(residual, linear(x, w, b, Var(), fp8));
  }
  const int64_t Cin = x.shape()[x.shape().rank() - 1];
  const int64_t N = x.value().numel() / Cin;
  const int64_t Cout = w.shape()[0];
  check_shape("linear weight", w.shape(), Shape{Cout, Cin});
  if (b.defined()) check_shape("linear bias", b.shape(), Shape{Cout});
  if (b.defined()) check_param_operand("linear bias", x.value(), b.value());

  std::vector<int64_t> ydims = x.shape().vec();
  ydims.back() = Cout;
  Device dev = x.device();
  Stream& s = current_stream(dev);
  Tensor y = Tensor::empty(Shape(ydims), x.dtype(), dev, &s);
  if (residual.defined()) {
    check_shape("linear residual", residual.shape(), Shape(ydims));
    check_same_device_dtype("linear residual", x.value(), residual.value());
  }
  // FP8 on CUDA where the sizes allow (else the bf16 products); the CPU emulates it at any size.
  const bool fp8_cuda =
      fp8 && dev.is_cuda() && x.dtype() == DType::kBF16 && cuda::fp8_gemm_ok(N, Cin, Cout);
  fp8 = fp8 && (fp8_cuda || !dev.is_cuda());
  // The weight's codes, kept for the backward (their storage belongs to the access that made them).
  const bool have_wq = fp8_cuda && wq != nullptr;
  // The weight's value is read only where no codes were handed in; with them it may be the fp32
  // master (Note [fp8 weights without shadows] in fp8.h).
  if (have_wq) {
    GTRON_CHECK(w.device() == dev, "linear: the weight is on ", w.device().str(), ", x on ",
                dev.str());
  } else {
    check_same_device_dtype("linear", x.value(), w.value());
  }
  const fp8::QuantizedWeight wcodes = have_wq ? *wq : fp8::QuantizedWeight{};
  if (have_wq) {
    GTRON_CHECK(wcodes.q.nbytes() >= static_cast<size_t>(Cout * Cin) &&
                    wcodes.qt.nbytes() >= static_cast<size_t>(Cout * Cin),
                "linear: the fp8 codes handed in are smaller than the [", Cout, ", ", Cin,
                "] weight");
  }
  if (fp8_cuda) {
    fp8::cuda_forward(x.value(), w.value(), b.defined() ? b.value().raw() : nullptr,
                      b.defined() ? b.dtype() : x.dtype(), y,
                      residual.defined() ? residual.value().raw() : nullptr, N, Cin, Cout, s,
                      have_wq ? &wcodes : nullptr, xq);
  } else if (dev.is_cuda()) {
    cuda::linear_forward(x.value().raw(), w.value().raw(), b.defined() ? b.value().raw() : nullptr,
                         b.defined() ? b.dtype() : x.dtype(), y.raw(), N, Cin, Cout, x.dtype(),
                         s.native(), residual.defined() ? residual.value().raw() : nullptr);
  } else {
    dispatch_float(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* xp = x.value().data<T>();
      const T* wp = w.value().data<T>();
      const T* bp = b.defined() ? b.value().data<T>() : nullptr;
      T* yp = y.data<T>();
      if (fp8) {
        s.run([=] { fp8::emulate_forward<T>(xp, wp, bp, yp, N, Cin, Cout); });
      } else {
        s.run([=] { cpu::linear_forward<T>(xp, wp, bp, yp, N, Cin, Cout); });
      }
    });
  }

  bool need = x.requires_grad() || w.requires_grad() || (b.defined() && b.requires_grad()) ||
              (residual.defined() && residual.requires_grad());
  Var out = Var::output(y, need);
  // Note [gradient column partials]: dy's last writer may sum its columns for the bias gradient.
  if (out.requires_grad() && x.device().is_cuda() && b.defined() && b.requires_grad())
    out.request_col_partials();
  // Note [gradient fp8 codes]: dy's last writer may make its FP8 codes on the way.
  // Without a bias gradient or a residual to hand dy on to, the backward reads the codes only.
  if (out.requires_grad() && fp8_cuda && fp8::fused_producers()) {
    out.request_grad_codes(/*values_unread=*/!residual.defined() &&
                           !(b.defined() && b.requires_grad()));
  }
  if (out.requires_grad()) {
    record_backward([x, w, b, residual, out, N, Cin, Cout, fp8, have_wq, wcodes] {
      if (!out.has_grad()) return;
      Stream& s = current_stream(out.device());
      // Note [gradient fp8 codes]: taken before anything reads dy (which would drop them).
      const GradCodes dy_codes = out.take_grad_codes();
      // Note [gradient column partials]: taken before anything reads dy.
      const bool db_done = out.device().is_cuda() && bias_grad_from_partials(out, b, s);
      // The residual's share is dy itself (bound or queued before the GEMMs read dy).
      if (residual.defined()) hand_on_gradient(residual, out.grad());
      if (out.device().is_cuda()) {
        const bool want_db = b.defined() && b.requires_grad() && !db_done;
        Tensor scratch;
        if (want_db) scratch = column_scratch(cuda::linear_backward_scratch_floats(N, Cout), s);
        bool dw_overwrite = false;  // Note [first gradient write] in parallel/ddp.h
        Tensor* dw = w.requires_grad() ? &w.weight_grad(&dw_overwrite) : nullptr;
        bool dx_overwrite = false;
        void* dx = x.requires_grad() ? x.grad_for_write(&dx_overwrite).raw() : nullptr;
        if (fp8) {  // the products in FP8; the bias gradient below from dy unquantized
          fp8::cuda_backward(x.value(), w.value(), out.grad(), dx, dx_overwrite, dw, dw_overwrite,
                             N, Cin, Cout, s, have_wq ? &wcodes : nullptr,
                             dy_codes.defined() ? &dy_codes : nullptr);
          dx = nullptr;
          dw = nullptr;
        }
        cuda::linear_backward(x.value().raw(), w.value().raw(), out.grad().raw(), dx,
                              dw ? dw->raw() : nullptr, dw ? dw->dtype() : DType::kF32,
                              want_db ? f32_grad("linear bias", b.grad()) : nullptr,
                              want_db ? scratch.data<float>() : nullptr, N, Cin, Cout, out.dtype(),
                              s.native(), dx_overwrite, dw_overwrite);
        return;
      }
      dispatch_float(out.dtype(), [&](auto tag) {
        using T = decltype(tag);
        const T* xp = x.value().data<T>();
        const T* wp = w.value().data<T>();
        const T* dyp = out.grad().data<T>();
        T* dx = x.requires_grad() ? x.grad().data<T>() : nullptr;
        T* dw = w.requires_grad() ? w.grad().data<T>() : nullptr;
        T* db = b.defined() && b.requires_grad() ? b.grad().data<T>() : nullptr;
        if (fp8) {
          s.run([=] { fp8::emulate_backward<T>(xp, wp, dyp, dx, dw, db, N, Cin, Cout); });
        } else {
          s.run([=] { cpu::linear_backward<T>(xp, wp, dyp, dx, dw, db, N, Cin, Cout); });
        }
      });
    });
  }
  return out;
}

}  // namespace gtron

#include "model/ops/norm.h"

#include "model/ops/column_scratch.h"
#include "model/ops/device_util.h"
#include "model/ops/fp8.h"
#include "model/ops/shape_check.h"
#include "model/stream.h"

namespace gtron {

namespace {

// The row statistics a norm keeps for its backward: one value per row of x ([N]); fp32 on CUDA.
Tensor row_stats(const Var& x, int64_t N, Stream& s) {
  const DType t = x.device().is_cuda() ? DType::kF32 : x.dtype();
  return Tensor::empty(Shape{N}, t, x.device(), &s);
}

// Scratch for the FP8 codes of a norm's output, when asked for (Note [fp8 fused producers]).
void make_codes(const char* op, const Var& x, int64_t N, int64_t C, fp8::QuantizedRows* codes,
                Stream& s) {
  if (codes == nullptr) return;
  GTRON_CHECK(x.device().is_cuda() && x.dtype() == DType::kBF16, op,
              ": fp8 codes of the output on CUDA in bf16 only; got ", dtype_name(x.dtype()), " on ",
              x.device().str());
  *codes = fp8::scratch_rows(N, C, s);
}

uint8_t* codes_q(fp8::QuantizedRows* codes) {
  return codes ? static_cast<uint8_t*>(codes->q.raw()) : nullptr;
}

float* codes_s(fp8::QuantizedRows* codes) { return codes ? codes->s.data<float>() : nullptr; }

}  // namespace

void layernorm_backward_cuda(const Var& x, const Var& gamma, const Var& beta, const Tensor& mean,
                             const Tensor& rstd, const Tensor& dy, int64_t N, int64_t C,
                             Stream& s) {
  const bool want_params = gamma.requires_grad() || beta.requires_grad();
  // Note [gradient column partials]: x's producer asked for the partials of its gradient.
  const bool partials = want_params && x.requires_grad() && x.col_partials_requested();
  Tensor scratch;
  if (want_params) scratch = column_scratch(cuda::layernorm_backward_scratch_floats(N, C), s);
  const bool summed = cuda::layernorm_backward(
      x.value().raw(), gamma.value().raw(), gamma.dtype(), mean.data<float>(), rstd.data<float>(),
      dy.raw(), x.requires_grad() ? x.grad().raw() : nullptr,
      gamma.requires_grad() ? f32_grad("layernorm gamma", gamma.grad()) : nullptr,
      beta.requires_grad() ? f32_grad("layernorm beta", beta.grad()) : nullptr,
      want_params ? scratch.data<float>() : nullptr, N, C, x.dtype(), s.native(), partials);
  if (summed) {
    const int64_t chunks = cuda::layernorm_dx_partial_chunks(N);
    x.set_col_partials(scratch.rows(2 * chunks * C, 3 * chunks * C), chunks);
  }
}

Var layernorm(const Var& x, const Var& gamma, const Var& beta, double eps,
              fp8::QuantizedRows* codes) {
  GTRON_CHECK(x.shape().rank() >= 1, "layernorm: x must have a feature dim; got ", x.shape().str());
  const int64_t C = x.shape()[x.shape().rank() - 1];
  const int64_t N = C > 0 ? x.value().numel() / C : 0;
  check_shape("layernorm gamma", gamma.shape(), Shape{C});
  check_shape("layernorm beta", beta.shape(), Shape{C});
  check_param_operand("layernorm", x.value(), gamma.value());
  check_same_device_dtype("layernorm", gamma.value(), beta.value());

  Device dev = x.device();
  Stream& s = current_stream(dev);
  Tensor y = Tensor::empty(x.shape(), x.dtype(), dev, &s);
  Tensor mean = row_stats(x, N, s);  // [N]
  Tensor rstd = row_stats(x, N, s);  // [N]
  make_codes("layernorm", x, N, C, codes, s);
  if (dev.is_cuda()) {
    cuda::layernorm_forward(x.value().raw(), gamma.value().raw(), beta.value().raw(), gamma.dtype(),
                            y.raw(), mean.data<float>(), rstd.data<float>(), N, C, eps, x.dtype(),
                            s.native(), codes_q(codes), codes_s(codes));
  } else {
    dispatch_float(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* xp = x.value().data<T>();
      const T* gp = gamma.value().data<T>();
      const T* bp = beta.value().data<T>();
      T* yp = y.data<T>();
      T* mp = mean.data<T>();
      T* rp = rstd.data<T>();
      s.run([=] { cpu::layernorm_forward<T>(xp, gp, bp, yp, mp, rp, N, C, eps); });
    });
  }

  bool need = x.requires_grad() || gamma.requires_grad() || beta.requires_grad();
  Var out = Var::output(y, need);
  if (out.requires_grad()) {
    record_backward([x, gamma, beta, mean, rstd, out, N, C] {
      if (!out.has_grad()) return;
      Stream& s = current_stream(out.device());
      if (out.device().is_cuda()) {
        layernorm_backward_cuda(x, gamma, beta, mean, rstd, out.grad(), N, C, s);
        return;
      }
      dispatch_float(out.dtype(), [&](auto tag) {
        using T = decltype(tag);
        const T* xp = x.value().data<T>();
        const T* gp = gamma.value().data<T>();
        const T* mp = mean.data<T>();
        const T* rp = rstd.data<T>();
        const T* dyp = out.grad().data<T>();
        T* dx = x.requires_grad() ? x.grad().data<T>() : nullptr;
        T* dg = gamma.requires_grad() ? gamma.grad().data<T>() : nullptr;
        T* db = beta.requires_grad() ? beta.grad().data<T>() : nullptr;
        s.run([=] { cpu::layernorm_backward<T>(xp, gp, mp, rp, dyp, dx, dg, db, N, C); });
      });
    });
  }
  return out;
}

Var rmsnorm(const Var& x, const Var& gamma, double eps, fp8::QuantizedRows* codes) {
  GTRON_CHECK(x.shape().rank() >= 1, "rmsnorm: x must have a feature dim; got ", x.shape().str());
  const int64_t C = x.shape()[x.shape().rank() - 1];
  const int64_t N = C > 0 ? x.value().numel() / C : 0;
  check_shape("rmsnorm gamma", gamma.shape(), Shape{C});
  check_param_operand("rmsnorm", x.value(), gamma.value());

  Device dev = x.device();
  Stream& s = current_stream(dev);
  Tensor y = Tensor::empty(x.shape(), x.dtype(), dev, &s);
  Tensor rrms = row_stats(x, N, s);  // [N]
  make_codes("rmsnorm", x, N, C, codes, s);
  if (dev.is_cuda()) {
    cuda::rmsnorm_forward(x.value().raw(), gamma.value().raw(), gamma.dtype(), y.raw(),
                          rrms.data<float>(), N, C, eps, x.dtype(), s.native(), codes_q(codes),
                          codes_s(codes));
  } else {
    dispatch_float(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* xp = x.value().data<T>();
      const T* gp = gamma.value().data<T>();
      T* yp = y.data<T>();
      T* rp = rrms.data<T>();
      s.run([=] { cpu::rmsnorm_forward<T>(xp, gp, yp, rp, N, C, eps); });
    });
  }

  Var out = Var::output(y, x.requires_grad() || gamma.requires_grad());
  if (out.requires_grad()) {
    record_backward([x, gamma, rrms, out, N, C] {
      if (!out.has_grad()) return;
      Stream& s = current_stream(out.device());
      if (out.device().is_cuda()) {
        Tensor scratch;
        if (gamma.requires_grad()) {
          scratch = column_scratch(cuda::rmsnorm_backward_scratch_floats(N, C), s);
        }
        cuda::rmsnorm_backward(
            x.value().raw(), gamma.value().raw(), gamma.dtype(), rrms.data<float>(),
            out.grad().raw(), x.requires_grad() ? x.grad().raw() : nullptr,
            gamma.requires_grad() ? f32_grad("rmsnorm gamma", gamma.grad()) : nullptr,
            gamma.requires_grad() ? scratch.data<float>() : nullptr, N, C, out.dtype(), s.native());
        return;
      }
      dispatch_float(out.dtype(), [&](auto tag) {
        using T = decltype(tag);
        const T* xp = x.value().data<T>();
        const T* gp = gamma.value().data<T>();
        const T* rp = rrms.data<T>();
        const T* dyp = out.grad().data<T>();
        T* dx = x.requires_grad() ? x.grad().data<T>() : nullptr;
        T* dg = gamma.requires_grad() ? gamma.grad().data<T>() : nullptr;
        s.run([=] { cpu::rmsnorm_backward<T>(xp, gp, rp, dyp, dx, dg, N, C); });
      });
    });
  }
  return out;
}

}  // namespace gtron

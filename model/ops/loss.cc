#include "model/ops/loss.h"

#include <vector>

#include "model/ops/add.h"
#include "model/ops/device_util.h"
#include "model/ops/shape_check.h"
#include "model/stream.h"

namespace gtron {

void check_targets_on_host(const Tensor& targets, int64_t V) {
  const int32_t* tp = targets.data<int32_t>();
  for (int64_t i = 0; i < targets.numel(); ++i) {
    const int32_t t = tp[i];
    GTRON_CHECK(t == kMaskedTarget || (t >= 0 && t < V), "cross_entropy: target ", t, " at row ", i,
                " outside [0, ", V, ") and not kMaskedTarget (", kMaskedTarget, ")");
  }
}

namespace {

// The one-pass CUDA path (Note [one-pass cross-entropy] in loss.h): the forward leaves the
// gradient for seed·weight in the logits' buffer; the backward checks the promise on the device
// and hands the buffer on (as the in-place backward does).
Var cross_entropy_onepass(const Var& logits, const Tensor& tg, const KnownLossGrad& known,
                          int64_t N, int64_t V, int64_t Vp, Stream& s) {
  Device dev = logits.device();
  const Tensor seed = known.seed;
  GTRON_CHECK(seed.dtype() == DType::kF32 && seed.numel() == 1 && seed.device() == dev,
              "cross_entropy: the known gradient's seed must be one f32 value on ", dev.str(),
              "; got ", seed.shape().str(), " ", dtype_name(seed.dtype()), " on ",
              seed.device().str());
  const float w = static_cast<float>(known.weight);
  Tensor loss = Tensor::empty(Shape{}, DType::kF32, dev, &s);     // scalar
  Tensor rmax = Tensor::empty(Shape{N}, DType::kF32, dev, &s);    // [N], scratch
  Tensor rlse = Tensor::empty(Shape{N}, DType::kF32, dev, &s);    // [N], scratch
  Tensor tlogit = Tensor::empty(Shape{N}, DType::kF32, dev, &s);  // [N], scratch
  Tensor count = Tensor::empty(Shape{1}, DType::kI32, dev, &s);   // unmasked rows
  cuda::cross_entropy_onepass(logits.value().raw(), tg.data<int32_t>(), rmax.data<float>(),
                              rlse.data<float>(), tlogit.data<float>(), count.data<int32_t>(),
                              loss.data<float>(), seed.data<float>(), w, N, V, Vp, logits.dtype(),
                              s.native());
  Var out = Var::output(loss, true);
  record_backward([logits, out, seed, w] {
    if (!out.has_grad()) return;
    Stream& s = current_stream(out.device());
    Tensor buffer = logits.value();  // holds the gradient since the forward
    cuda::cross_entropy_onepass_check(buffer.raw(), buffer.numel(), seed.data<float>(), w,
                                      out.grad().data<float>(), logits.dtype(), s.native());
    if (logits.has_grad()) {
      accumulate_into(logits.grad(), buffer);
    } else {
      logits.set_grad(buffer);
    }
  });
  return out;
}

// The CUDA path: loss, statistics and the unmasked-row count are fp32/i32 device values whatever
// the logits' dtype; the count never leaves the device.
Var cross_entropy_cuda(const Var& logits, const Tensor& targets, int64_t N, int64_t V, int64_t Vp,
                       bool overwrite, const KnownLossGrad* known, Stream& s) {
  Device dev = logits.device();
  if (targets.device().is_cpu()) check_targets_on_host(targets, V);
  Tensor tg = ids_on_device(targets, s);  // [N] i32
  // bf16 logits only: on the H200 the f32 one-pass gradient differed from the two-pass kernels'
  // in the last bits (about 10 ulps) on some rows, so f32 keeps the proven two-pass path.
  if (overwrite && known != nullptr && known->seed.defined() && logits.requires_grad() &&
      grad_enabled() && logits.dtype() == DType::kBF16) {
    return cross_entropy_onepass(logits, tg, *known, N, V, Vp, s);
  }
  Tensor loss = Tensor::empty(Shape{}, DType::kF32, dev, &s);    // scalar
  Tensor rmax = Tensor::empty(Shape{N}, DType::kF32, dev, &s);   // [N], kept for backward
  Tensor rlse = Tensor::empty(Shape{N}, DType::kF32, dev, &s);   // [N], kept for backward
  Tensor count = Tensor::empty(Shape{1}, DType::kI32, dev, &s);  // unmasked rows
  cuda::cross_entropy_forward(logits.value().raw(), tg.data<int32_t>(), rmax.data<float>(),
                              rlse.data<float>(), count.data<int32_t>(), loss.data<float>(),
                              nullptr, nullptr, N, V, Vp, logits.dtype(), s.native());
  Var out = Var::output(loss, logits.requires_grad());
  if (out.requires_grad()) {
    record_backward([logits, tg, rmax, rlse, count, out, N, V, Vp, overwrite] {
      if (!out.has_grad()) return;
      Stream& s = current_stream(out.device());
      if (overwrite && !logits.has_grad()) {
        Tensor buffer = logits.value();
        cuda::cross_entropy_backward_inplace(
            buffer.raw(), tg.data<int32_t>(), rmax.data<float>(), rlse.data<float>(),
            count.data<int32_t>(), out.grad().data<float>(), N, V, Vp, logits.dtype(), s.native());
        logits.set_grad(buffer);
        return;
      }
      cuda::cross_entropy_backward(logits.value().raw(), tg.data<int32_t>(), rmax.data<float>(),
                                   rlse.data<float>(), count.data<int32_t>(),
                                   out.grad().data<float>(), logits.grad().raw(), N, V, Vp,
                                   logits.dtype(), s.native());
    });
  }
  return out;
}

}  // namespace

Var cross_entropy(const Var& logits, const Tensor& targets, int64_t V, bool overwrite_logits,
                  const KnownLossGrad* known) {
  GTRON_CHECK(logits.shape().rank() >= 1, "cross_entropy: logits ", logits.shape().str(),
              " have no vocab dim");
  std::vector<int64_t> lead = logits.shape().vec();
  const int64_t Vp = lead.back();
  lead.pop_back();
  GTRON_CHECK(V > 0 && V <= Vp, "cross_entropy: V = ", V, " outside (0, Vp = ", Vp, "]");
  Device dev = logits.device();
  GTRON_CHECK(
      targets.dtype() == DType::kI32 && (targets.device().is_cpu() || targets.device() == dev),
      "cross_entropy: targets must be an i32 tensor on the CPU or the logits' device; got ",
      targets.device().str(), "/", dtype_name(targets.dtype()));
  check_shape("cross_entropy targets", targets.shape(), Shape(lead));
  const int64_t N = targets.numel();

  Stream& s = current_stream(dev);
  if (dev.is_cuda()) {
    return cross_entropy_cuda(logits, targets, N, V, Vp, overwrite_logits, known, s);
  }
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
  Stream& s = current_stream(dev);
  Tensor y = Tensor::empty(x.shape(), x.dtype(), dev, &s);
  if (dev.is_cuda()) {
    cuda::scale_forward(x.value().raw(), y.raw(), n, factor, x.dtype(), s.native());
  } else {
    dispatch_float(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* xp = x.value().data<T>();
      T* yp = y.data<T>();
      s.run([=] { cpu::scale_forward<T>(xp, yp, n, factor); });
    });
  }

  Var out = Var::output(y, x.requires_grad());
  if (out.requires_grad()) {
    record_backward([x, out, n, factor] {
      if (!out.has_grad()) return;
      Stream& s = current_stream(out.device());
      if (out.device().is_cuda()) {
        cuda::scale_backward(out.grad().raw(), x.grad().raw(), n, factor, out.dtype(), s.native());
        return;
      }
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

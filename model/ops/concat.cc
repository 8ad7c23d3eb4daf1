#include "model/ops/concat.h"

#include <algorithm>
#include <vector>

#include "model/ops/fp8.h"
#include "model/ops/shape_check.h"
#include "model/stream.h"

namespace gtron {

Var concat_features(const Var& a, const Var& b, fp8::QuantizedRows* codes) {
  const int r = a.shape().rank();
  GTRON_CHECK(r >= 1 && b.shape().rank() == r, "concat_features: shapes ", a.shape().str(), " and ",
              b.shape().str(), " must have equal rank >= 1");
  std::vector<int64_t> ad = a.shape().vec();
  std::vector<int64_t> bd = b.shape().vec();
  const int64_t Ca = ad.back();
  const int64_t Cb = bd.back();
  GTRON_CHECK(std::equal(ad.begin(), ad.end() - 1, bd.begin()), "concat_features: shapes ",
              a.shape().str(), " and ", b.shape().str(), " differ before the last dim");
  check_same_device_dtype("concat_features", a.value(), b.value());
  int64_t N = 1;  // rows: the product of the leading dims
  for (size_t i = 0; i + 1 < ad.size(); ++i) N *= ad[i];

  ad.back() = Ca + Cb;
  Device dev = a.device();
  Stream& s = current_stream(dev);
  Tensor y = Tensor::empty(Shape(ad), a.dtype(), dev, &s);
  if (codes != nullptr) {  // Note [fp8 fused producers]
    GTRON_CHECK(dev.is_cuda() && a.dtype() == DType::kBF16,
                "concat_features: fp8 codes of the output on CUDA in bf16 only; got ",
                dtype_name(a.dtype()), " on ", dev.str());
    *codes = fp8::scratch_rows(N, Ca + Cb, s);
  }
  if (dev.is_cuda()) {
    cuda::concat_forward(a.value().raw(), b.value().raw(), y.raw(), N, Ca, Cb, a.dtype(),
                         s.native(), codes ? static_cast<uint8_t*>(codes->q.raw()) : nullptr,
                         codes ? codes->s.data<float>() : nullptr);
  } else {
    dispatch_float(a.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* ap = a.value().data<T>();
      const T* bp = b.value().data<T>();
      T* yp = y.data<T>();
      s.run([=] { cpu::concat_forward<T>(ap, bp, yp, N, Ca, Cb); });
    });
  }

  Var out = Var::output(y, a.requires_grad() || b.requires_grad());
  if (out.requires_grad()) {
    record_backward([a, b, out, N, Ca, Cb] {
      if (!out.has_grad()) return;
      Stream& s = current_stream(out.device());
      if (out.device().is_cuda()) {
        cuda::concat_backward(out.grad().raw(), a.requires_grad() ? a.grad().raw() : nullptr,
                              b.requires_grad() ? b.grad().raw() : nullptr, N, Ca, Cb, out.dtype(),
                              s.native());
        return;
      }
      dispatch_float(out.dtype(), [&](auto tag) {
        using T = decltype(tag);
        const T* dyp = out.grad().data<T>();
        T* da = a.requires_grad() ? a.grad().data<T>() : nullptr;
        T* db = b.requires_grad() ? b.grad().data<T>() : nullptr;
        s.run([=] { cpu::concat_backward<T>(dyp, da, db, N, Ca, Cb); });
      });
    });
  }
  return out;
}

}  // namespace gtron

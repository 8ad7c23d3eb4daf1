#include "model/ops/rope.h"

#include <cmath>

#include "model/ops/shape_check.h"
#include "model/stream.h"

namespace gtron {

std::vector<double> rope_inv_freq(int64_t HS, double theta, const RopeLlama3Scaling* llama3) {
  GTRON_CHECK(HS > 0 && HS % 2 == 0, "rope_inv_freq: head size ", HS, " must be even and > 0");
  GTRON_CHECK(theta > 1, "rope_inv_freq: theta ", theta, " must be > 1");
  const double two_pi = 2 * std::acos(-1.0);
  std::vector<double> f(static_cast<size_t>(HS / 2));
  for (int64_t i = 0; i < HS / 2; ++i) {
    f[i] = std::pow(theta, -static_cast<double>(2 * i) / static_cast<double>(HS));
  }
  if (llama3 == nullptr) return f;
  const RopeLlama3Scaling& s = *llama3;
  GTRON_CHECK(s.factor > 0 && s.high_freq_factor > s.low_freq_factor && s.low_freq_factor > 0 &&
                  s.original_max_position_embeddings > 0,
              "rope_inv_freq: llama3 scaling needs factor > 0 and high_freq_factor > "
              "low_freq_factor > 0; got factor ",
              s.factor, ", low ", s.low_freq_factor, ", high ", s.high_freq_factor);
  const double original = static_cast<double>(s.original_max_position_embeddings);
  const double low_freq_wavelen = original / s.low_freq_factor;    // longer: slowed by factor
  const double high_freq_wavelen = original / s.high_freq_factor;  // shorter: kept
  for (double& x : f) {
    const double wavelen = two_pi / x;
    if (wavelen > low_freq_wavelen) {
      x /= s.factor;
    } else if (wavelen >= high_freq_wavelen) {
      const double smooth =
          (original / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      x = (1 - smooth) * x / s.factor + smooth * x;
    }
  }
  return f;
}

Tensor rope_table(const std::vector<double>& inv_freq, Device device, DType act) {
  const Shape shape{static_cast<int64_t>(inv_freq.size())};
  if (device.is_cuda()) return Tensor::from_vector(inv_freq, shape, DType::kF32).to(device);
  return Tensor::from_vector(inv_freq, shape, act);
}

Var rope(const Var& qkv, const Tensor& inv_freq, int NH, int NKV, int HS, int64_t pos0) {
  GTRON_CHECK(NH > 0 && NKV > 0 && HS > 0 && HS % 2 == 0, "rope: NH = ", NH, ", NKV = ", NKV,
              ", HS = ", HS, "; need NH, NKV > 0 and HS even");
  GTRON_CHECK(pos0 >= 0, "rope: pos0 ", pos0, " < 0");
  GTRON_CHECK(qkv.shape().rank() == 3, "rope: qkv ", qkv.shape().str(),
              ", expected [B, T, (NH + 2·NKV)·HS]");
  const int64_t B = qkv.shape()[0];
  const int64_t Tlen = qkv.shape()[1];
  check_shape("rope: qkv", qkv.shape(), Shape{B, Tlen, (NH + 2 * int64_t{NKV}) * HS});
  GTRON_CHECK(pos0 + Tlen <= (int64_t{1} << 24), "rope: positions up to ", pos0 + Tlen,
              " are not exact in fp32");
  check_shape("rope: inv_freq", inv_freq.shape(), Shape{HS / 2});
  Device dev = qkv.device();
  const DType table = dev.is_cuda() ? DType::kF32 : qkv.dtype();
  GTRON_CHECK(inv_freq.device() == dev && inv_freq.dtype() == table, "rope: inv_freq on ",
              inv_freq.device().str(), "/", dtype_name(inv_freq.dtype()), ", expected ", dev.str(),
              "/", dtype_name(table), " (rope_table)");

  Stream& s = current_stream(dev);
  Tensor y = Tensor::empty(qkv.shape(), qkv.dtype(), dev, &s);
  if (dev.is_cuda()) {
    cuda::rope_forward(qkv.value().raw(), inv_freq.data<float>(), y.raw(), B, Tlen, NH, NKV, HS,
                       pos0, qkv.dtype(), s.native());
  } else {
    dispatch_float(qkv.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* xp = qkv.value().data<T>();
      const T* fp = inv_freq.data<T>();
      T* yp = y.data<T>();
      s.run([=] { cpu::rope_forward<T>(xp, fp, yp, B, Tlen, NH, NKV, HS, pos0); });
    });
  }

  Var out = Var::output(y, qkv.requires_grad());
  if (out.requires_grad()) {
    record_backward([qkv, inv_freq, out, B, Tlen, NH, NKV, HS, pos0] {
      if (!out.has_grad()) return;
      Stream& s = current_stream(out.device());
      if (out.device().is_cuda()) {
        bool overwrite = false;
        Tensor& dx = qkv.grad_for_write(&overwrite);
        cuda::rope_backward(out.grad().raw(), inv_freq.data<float>(), dx.raw(), B, Tlen, NH, NKV,
                            HS, pos0, out.dtype(), s.native(), overwrite);
        return;
      }
      dispatch_float(out.dtype(), [&](auto tag) {
        using T = decltype(tag);
        const T* dyp = out.grad().data<T>();
        const T* fp = inv_freq.data<T>();
        T* dx = qkv.grad().data<T>();
        s.run([=] { cpu::rope_backward<T>(dyp, fp, dx, B, Tlen, NH, NKV, HS, pos0); });
      });
    });
  }
  return out;
}

}  // namespace gtron

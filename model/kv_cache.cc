#include "model/kv_cache.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstring>

#include "model/kv_cache_cuda.h"
#include "model/ops/device_util.h"
#include "model/ops/eigen.h"
#include "model/ops/rope.h"
#include "model/stream.h"

namespace gtron {

int64_t DecodeWindow::position(int64_t b, int64_t i, int64_t Tmax) const {
  const int64_t n = count[static_cast<size_t>(b)];
  const int64_t p = start[static_cast<size_t>(b)] + std::min(i, std::max<int64_t>(n - 1, 0));
  return std::min(p, Tmax - 1);
}

Tensor DecodeWindow::start_count_ids() const {
  std::vector<int32_t> ids;
  for (int64_t v : start) ids.push_back(static_cast<int32_t>(v));
  for (int64_t v : count) ids.push_back(static_cast<int32_t>(v));
  return Tensor::from_ints(ids, {2 * rows()});
}

Tensor DecodeWindow::device_extents(Stream& s) const {
  return device_start_count.defined() ? device_start_count : ids_on_device(start_count_ids(), s);
}

KVCache::KVCache(int64_t B, int64_t Tmax, int64_t NKV, int64_t HS, DType dtype, Device device)
    : keys_(Tensor::zeros({B, NKV, Tmax, HS}, dtype, device)),
      values_(Tensor::zeros({B, NKV, Tmax, HS}, dtype, device)) {}

namespace cpu {
namespace {

// Row i of S (raw scores over keys 0..L-1) -> softmax(scale·S) over keys 0..last, zeros after.
template <typename T>
void softmax_prefix(T* row, int64_t last, int64_t L, T scale) {
  T m = row[0];
  for (int64_t s = 1; s <= last; ++s) m = std::max(m, row[s]);
  T sum = 0;
  for (int64_t s = 0; s <= last; ++s) {
    row[s] = std::exp((row[s] - m) * scale);
    sum += row[s];
  }
  const T inv = T(1) / sum;
  for (int64_t s = 0; s <= last; ++s) row[s] *= inv;
  for (int64_t s = last + 1; s < L; ++s) row[s] = 0;
}

}  // namespace

template <typename T>
void cached_attention_forward(const T* qkv, T* kc, T* vc, T* out, const int64_t* start,
                              const int64_t* count, int64_t B, int64_t W, int64_t Tmax, int64_t NH,
                              int64_t NKV, int64_t HS) {
  fix_eigen_blocking();
  const int64_t width = (NH + 2 * NKV) * HS, C = NH * HS, group = NH / NKV;
  const T scale = T(1) / std::sqrt(static_cast<T>(HS));
  // The window's keys and values first, one (row, key/value head) pair per task: query heads
  // sharing a key/value head then only read the cache.
#pragma omp parallel for
  for (int64_t bg = 0; bg < B * NKV; ++bg) {
    const int64_t b = bg / NKV, g = bg % NKV;
    const T* rows = qkv + b * W * width + (NH + g) * HS;
    for (int64_t i = 0; i < count[b]; ++i) {
      std::memcpy(kc + (bg * Tmax + start[b] + i) * HS, rows + i * width, sizeof(T) * HS);
      std::memcpy(vc + (bg * Tmax + start[b] + i) * HS, rows + i * width + NKV * HS,
                  sizeof(T) * HS);
    }
  }
  // One (row, query head) pair per task, writing only its own output columns: deterministic
  // whatever the thread count (as model/ops/attention_cpu.cc).
#pragma omp parallel
  {
    RowMajorMat<T> S;
#pragma omp for
    for (int64_t bh = 0; bh < B * NH; ++bh) {
      const int64_t b = bh / NH, h = bh % NH;
      const int64_t s0 = start[b], n = count[b];
      const int64_t kv = b * NKV + h / group;
      StridedRows<T> O(out + b * W * C + h * HS, W, HS, Eigen::OuterStride<>(C));
      if (n == 0) {
        O.setZero();
        continue;
      }
      const int64_t L = s0 + n;
      CStridedRows<T> Q(qkv + b * W * width + h * HS, W, HS, Eigen::OuterStride<>(width));
      CStridedRows<T> Kc(kc + kv * Tmax * HS, L, HS, Eigen::OuterStride<>(HS));
      CStridedRows<T> Vc(vc + kv * Tmax * HS, L, HS, Eigen::OuterStride<>(HS));
      S.resize(W, L);
      S.noalias() = Q * Kc.transpose();
      for (int64_t i = 0; i < W; ++i)
        softmax_prefix(S.data() + i * L, s0 + std::min(i, n - 1), L, scale);
      O.noalias() = S * Vc;
    }
  }
}

template void cached_attention_forward<float>(const float*, float*, float*, float*, const int64_t*,
                                              const int64_t*, int64_t, int64_t, int64_t, int64_t,
                                              int64_t, int64_t);
template void cached_attention_forward<double>(const double*, double*, double*, double*,
                                               const int64_t*, const int64_t*, int64_t, int64_t,
                                               int64_t, int64_t, int64_t, int64_t);

}  // namespace cpu

Var cached_attention(const Var& qkv, KVCache& cache, const DecodeWindow& win) {
  GTRON_CHECK(!grad_enabled(), "cached_attention is for generation: run it under NoGradGuard");
  GTRON_CHECK(qkv.shape().rank() == 3, "cached_attention: qkv ", qkv.shape().str());
  Tensor& kc = cache.keys();
  const int64_t NKV = kc.dim(1), Tmax = kc.dim(2), HS = kc.dim(3);
  const int64_t B = qkv.shape()[0], W = qkv.shape()[1], width = qkv.shape()[2];
  const int64_t NH = width % HS == 0 ? width / HS - 2 * NKV : 0;
  GTRON_CHECK(B == kc.dim(0) && NH > 0 && NH % NKV == 0 && W == win.width && win.rows() == B &&
                  qkv.dtype() == kc.dtype() && qkv.device() == kc.device(),
              "cached_attention: qkv ", qkv.shape().str(), " against a cache of ", kc.shape().str(),
              " and a window of width ", win.width);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t s0 = win.start[b], n = win.count[b];
    GTRON_CHECK(n >= 0 && n <= W && s0 >= 0 && s0 + n <= Tmax, "cached_attention: row ", b,
                " slots [", s0, ", ", s0 + n, ") outside the cache of ", Tmax, " positions");
  }
  Stream& s = current_stream(qkv.device());
  Tensor y = Tensor::empty(Shape{B, W, NH * HS}, qkv.dtype(), qkv.device(), &s);
  if (qkv.device().is_cuda()) {
    const Tensor sc = win.device_extents(s);
    Tensor scratch = scratch_floats(cuda::cached_attention_scratch_floats(B, W, Tmax, NH, HS), s);
    cuda::cached_attention_forward(qkv.value().raw(), kc.raw(), cache.values().raw(), y.raw(),
                                   sc.data<int32_t>(), scratch.data<float>(), B, W, Tmax, NH, NKV,
                                   HS, qkv.dtype(), s.native());
    return Var::output(y, false);
  }
  dispatch_float(qkv.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* qp = qkv.value().data<T>();
    T* kp = kc.data<T>();
    T* vp = cache.values().data<T>();
    T* yp = y.data<T>();
    const std::vector<int64_t> start = win.start, count = win.count;
    s.run([=] {
      cpu::cached_attention_forward<T>(qp, kp, vp, yp, start.data(), count.data(), B, W, Tmax, NH,
                                       NKV, HS);
    });
  });
  return Var::output(y, false);
}

Var rope_window(const Var& qkv, const Tensor& inv_freq, int NH, int NKV, int HS,
                const DecodeWindow& win) {
  GTRON_CHECK(!grad_enabled(), "rope_window is for generation: run it under NoGradGuard");
  const int64_t width = static_cast<int64_t>(NH + 2 * NKV) * HS;
  GTRON_CHECK(qkv.shape().rank() == 3 && qkv.shape()[2] == width && qkv.shape()[1] == win.width &&
                  qkv.shape()[0] == win.rows() && inv_freq.numel() == HS / 2,
              "rope_window: qkv ", qkv.shape().str(), " for ", NH, " + 2·", NKV, " heads of ", HS,
              " over a window of ", win.rows(), " rows of ", win.width);
  const int64_t B = win.rows(), W = win.width;
  Stream& s = current_stream(qkv.device());
  Tensor y = Tensor::empty(qkv.shape(), qkv.dtype(), qkv.device(), &s);
  const Tensor& x = qkv.value();
  if (x.device().is_cuda()) {
    // Every row at once, its first position read on the device (what a captured step needs).
    const Tensor sc = win.device_extents(s);
    cuda::rope_forward_at(x.raw(), inv_freq.data<float>(), y.raw(), B, W, NH, NKV, HS,
                          sc.data<int32_t>(), x.dtype(), s.native());
    return Var::output(y, false);
  }
  // One rotation per row, at the row's own first position (the kernel takes one pos0 per call).
  for (int64_t b = 0; b < B; ++b) {
    const int64_t pos0 = win.start[static_cast<size_t>(b)], off = b * W * width;
    dispatch_float(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* xp = x.data<T>() + off;
      const T* fp = inv_freq.data<T>();
      T* yp = y.data<T>() + off;
      s.run([=] { cpu::rope_forward<T>(xp, fp, yp, 1, W, NH, NKV, HS, pos0); });
    });
  }
  return Var::output(y, false);
}

}  // namespace gtron

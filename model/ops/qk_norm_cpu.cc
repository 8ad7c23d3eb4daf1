// CPU kernels of qk_rmsnorm. Each (row, head) is independent for y and dx (row-parallel); the
// gamma gradients reduce over rows serially, rows and heads in order, so they are bit-identical
// whatever the thread count.
#include <cmath>

#include "model/ops/qk_norm.h"

namespace gtron::cpu {

template <typename T>
void qk_rmsnorm_forward(const T* x, const T* gq, const T* gk, T* y, T* rrms, int64_t N, int NH,
                        int NKV, int64_t HS, double eps) {
  const int64_t W = (NH + 2 * NKV) * HS;  // row width
  const int normed = NH + NKV;
#pragma omp parallel for if (N * W >= (1 << 14))
  for (int64_t i = 0; i < N; ++i) {
    const T* xi = x + i * W;
    T* yi = y + i * W;
    for (int h = 0; h < normed; ++h) {
      const T* g = h < NH ? gq : gk;
      const T* xh = xi + h * HS;
      T ss = 0;
      for (int64_t c = 0; c < HS; ++c) ss += xh[c] * xh[c];
      const T r = T(1) / std::sqrt(ss / static_cast<T>(HS) + static_cast<T>(eps));
      for (int64_t c = 0; c < HS; ++c) yi[h * HS + c] = xh[c] * r * g[c];
      rrms[i * normed + h] = r;
    }
    for (int64_t c = normed * HS; c < W; ++c) yi[c] = xi[c];
  }
}

// With x̂ = x·r and g = dy·gamma: dx = r · (g − x̂·mean(g·x̂)); dgamma += dy·x̂.
template <typename T>
void qk_rmsnorm_backward(const T* x, const T* gq, const T* gk, const T* rrms, const T* dy, T* dx,
                         T* dgq, T* dgk, int64_t N, int NH, int NKV, int64_t HS) {
  const int64_t W = (NH + 2 * NKV) * HS;
  const int normed = NH + NKV;
  if (dx != nullptr) {
#pragma omp parallel for if (N * W >= (1 << 14))
    for (int64_t i = 0; i < N; ++i) {
      for (int h = 0; h < normed; ++h) {
        const T* g = h < NH ? gq : gk;
        const int64_t o = i * W + h * HS;
        const T r = rrms[i * normed + h];
        T sum = 0;
        for (int64_t c = 0; c < HS; ++c) sum += dy[o + c] * g[c] * (x[o + c] * r);
        const T mean = sum / static_cast<T>(HS);
        for (int64_t c = 0; c < HS; ++c) {
          dx[o + c] += r * (dy[o + c] * g[c] - x[o + c] * r * mean);
        }
      }
      for (int64_t c = normed * HS; c < W; ++c) dx[i * W + c] += dy[i * W + c];
    }
  }
  for (int64_t i = 0; i < N; ++i) {
    for (int h = 0; h < normed; ++h) {
      T* dg = h < NH ? dgq : dgk;
      if (dg == nullptr) continue;
      const int64_t o = i * W + h * HS;
      const T r = rrms[i * normed + h];
      for (int64_t c = 0; c < HS; ++c) dg[c] += dy[o + c] * (x[o + c] * r);
    }
  }
}

#define GTRON_QK_NORM(T)                                                                         \
  template void qk_rmsnorm_forward<T>(const T*, const T*, const T*, T*, T*, int64_t, int, int,   \
                                      int64_t, double);                                          \
  template void qk_rmsnorm_backward<T>(const T*, const T*, const T*, const T*, const T*, T*, T*, \
                                       T*, int64_t, int, int, int64_t);
GTRON_QK_NORM(float)
GTRON_QK_NORM(double)
#undef GTRON_QK_NORM

}  // namespace gtron::cpu

// CPU kernels of layernorm and rmsnorm: one tight loop per row.
//
// Determinism policy: rows are independent, so y and dx run row-parallel (each row on one thread,
// its sums in column order). dgamma and dbeta reduce over rows into shared [C] vectors; they run
// serially, rows in order 0..N-1, so the gradients are bit-identical whatever the thread count.
// Statistics use the tensor's own float type; the variance is two-pass (no E[x²] − E[x]²
// cancellation).
#include <cmath>

#include "model/ops/norm.h"

namespace gtron::cpu {

namespace {
constexpr int64_t kParallelMin = 1 << 14;  // elements; below this a thread team costs more
}  // namespace

template <typename T>
void layernorm_forward(const T* x, const T* gamma, const T* beta, T* y, T* mean, T* rstd, int64_t N,
                       int64_t C, double eps) {
  const T e = static_cast<T>(eps);
#pragma omp parallel for if (N * C >= kParallelMin)
  for (int64_t i = 0; i < N; ++i) {
    const T* xi = x + i * C;
    T sum = 0;
    for (int64_t c = 0; c < C; ++c) sum += xi[c];
    const T m = sum / static_cast<T>(C);
    T var = 0;
    for (int64_t c = 0; c < C; ++c) var += (xi[c] - m) * (xi[c] - m);
    const T r = T(1) / std::sqrt(var / static_cast<T>(C) + e);
    T* yi = y + i * C;
    for (int64_t c = 0; c < C; ++c) yi[c] = (xi[c] - m) * r * gamma[c] + beta[c];
    mean[i] = m;
    rstd[i] = r;
  }
}

// With x̂ = (x − mean)·rstd and g = dy·gamma:  dx = rstd · (g − mean(g) − x̂·mean(g·x̂)).
template <typename T>
void layernorm_backward(const T* x, const T* gamma, const T* mean, const T* rstd, const T* dy,
                        T* dx, T* dgamma, T* dbeta, int64_t N, int64_t C) {
  if (dx != nullptr) {
#pragma omp parallel for if (N * C >= kParallelMin)
    for (int64_t i = 0; i < N; ++i) {
      const T* xi = x + i * C;
      const T* dyi = dy + i * C;
      const T m = mean[i];
      const T r = rstd[i];
      T sum_g = 0, sum_gx = 0;
      for (int64_t c = 0; c < C; ++c) {
        const T g = dyi[c] * gamma[c];
        sum_g += g;
        sum_gx += g * (xi[c] - m) * r;
      }
      const T mean_g = sum_g / static_cast<T>(C);
      const T mean_gx = sum_gx / static_cast<T>(C);
      T* dxi = dx + i * C;
      for (int64_t c = 0; c < C; ++c) {
        const T xhat = (xi[c] - m) * r;
        dxi[c] += r * (dyi[c] * gamma[c] - mean_g - xhat * mean_gx);
      }
    }
  }
  if (dgamma == nullptr && dbeta == nullptr) return;
  for (int64_t i = 0; i < N; ++i) {
    const T* xi = x + i * C;
    const T* dyi = dy + i * C;
    const T m = mean[i];
    const T r = rstd[i];
    if (dgamma != nullptr) {
      for (int64_t c = 0; c < C; ++c) dgamma[c] += dyi[c] * ((xi[c] - m) * r);
    }
    if (dbeta != nullptr) {
      for (int64_t c = 0; c < C; ++c) dbeta[c] += dyi[c];
    }
  }
}

template <typename T>
void rmsnorm_forward(const T* x, const T* gamma, T* y, T* rrms, int64_t N, int64_t C, double eps) {
  const T e = static_cast<T>(eps);
#pragma omp parallel for if (N * C >= kParallelMin)
  for (int64_t i = 0; i < N; ++i) {
    const T* xi = x + i * C;
    T sq = 0;
    for (int64_t c = 0; c < C; ++c) sq += xi[c] * xi[c];
    const T r = T(1) / std::sqrt(sq / static_cast<T>(C) + e);
    T* yi = y + i * C;
    for (int64_t c = 0; c < C; ++c) yi[c] = xi[c] * r * gamma[c];
    rrms[i] = r;
  }
}

// With x̂ = x·rrms and g = dy·gamma:  dx = rrms · (g − x̂·mean(g·x̂)).
template <typename T>
void rmsnorm_backward(const T* x, const T* gamma, const T* rrms, const T* dy, T* dx, T* dgamma,
                      int64_t N, int64_t C) {
  if (dx != nullptr) {
#pragma omp parallel for if (N * C >= kParallelMin)
    for (int64_t i = 0; i < N; ++i) {
      const T* xi = x + i * C;
      const T* dyi = dy + i * C;
      const T r = rrms[i];
      T sum_gx = 0;
      for (int64_t c = 0; c < C; ++c) sum_gx += dyi[c] * gamma[c] * (xi[c] * r);
      const T mean_gx = sum_gx / static_cast<T>(C);
      T* dxi = dx + i * C;
      for (int64_t c = 0; c < C; ++c) {
        dxi[c] += r * (dyi[c] * gamma[c] - (xi[c] * r) * mean_gx);
      }
    }
  }
  if (dgamma == nullptr) return;
  for (int64_t i = 0; i < N; ++i) {
    const T* xi = x + i * C;
    const T* dyi = dy + i * C;
    const T r = rrms[i];
    for (int64_t c = 0; c < C; ++c) dgamma[c] += dyi[c] * (xi[c] * r);
  }
}

template void layernorm_forward<float>(const float*, const float*, const float*, float*, float*,
                                       float*, int64_t, int64_t, double);
template void layernorm_forward<double>(const double*, const double*, const double*, double*,
                                        double*, double*, int64_t, int64_t, double);
template void layernorm_backward<float>(const float*, const float*, const float*, const float*,
                                        const float*, float*, float*, float*, int64_t, int64_t);
template void layernorm_backward<double>(const double*, const double*, const double*, const double*,
                                         const double*, double*, double*, double*, int64_t,
                                         int64_t);
template void rmsnorm_forward<float>(const float*, const float*, float*, float*, int64_t, int64_t,
                                     double);
template void rmsnorm_forward<double>(const double*, const double*, double*, double*, int64_t,
                                      int64_t, double);
template void rmsnorm_backward<float>(const float*, const float*, const float*, const float*,
                                      float*, float*, int64_t, int64_t);
template void rmsnorm_backward<double>(const double*, const double*, const double*, const double*,
                                       double*, double*, int64_t, int64_t);

}  // namespace gtron::cpu

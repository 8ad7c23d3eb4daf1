// CPU kernels of layernorm and rmsnorm: one pass of fixed blocks per row (model/ops/cpu_math.h).
//
// Determinism policy: rows are independent, so y and dx run row-parallel (each row on one thread,
// its sums in fixed lane order). dgamma and dbeta reduce over rows into shared [C] vectors; they
// run serially, rows in order 0..N-1, so the gradients are bit-identical whatever the thread
// count. Statistics use the tensor's own float type; the variance is two-pass (no E[x²] − E[x]²
// cancellation).
#include <cmath>

#include "model/ops/cpu_math.h"
#include "model/ops/norm.h"

namespace gtron::cpu {

namespace {
constexpr int64_t kParallelMin = 1 << 14;  // elements; below this a thread team costs more
}  // namespace

template <typename T>
void layernorm_forward(const T* x, const T* gamma, const T* beta, T* y, T* mean, T* rstd, int64_t N,
                       int64_t C, double eps) {
#pragma omp parallel for if (N * C >= kParallelMin)
  for (int64_t i = 0; i < N; ++i) {
    const T* xi = x + i * C;
    const T m = row_sum(xi, C) / static_cast<T>(C);
    Block<T> acc = Block<T>::Zero();
    for (int64_t c = 0; c < C; c += kBlock) {
      const Block<T> d = load_block(xi + c, block_len(c, C), m) - m;  // padding gives d = 0
      acc += d * d;
    }
    const T r = T(1) / std::sqrt(lane_sum(acc) / static_cast<T>(C) + static_cast<T>(eps));
    for (int64_t c = 0; c < C; c += kBlock) {
      const int len = block_len(c, C);
      const Block<T> xhat = (load_block(xi + c, len) - m) * r;
      store_block(y + i * C + c,
                  Block<T>(xhat * load_block(gamma + c, len) + load_block(beta + c, len)), len);
    }
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
      Block<T> sum_g = Block<T>::Zero(), sum_gx = Block<T>::Zero();
      for (int64_t c = 0; c < C; c += kBlock) {
        const int len = block_len(c, C);
        const Block<T> g = load_block(dyi + c, len) * load_block(gamma + c, len);  // 0 past len
        sum_g += g;
        sum_gx += g * (load_block(xi + c, len) - m) * r;
      }
      const T mean_g = lane_sum(sum_g) / static_cast<T>(C);
      const T mean_gx = lane_sum(sum_gx) / static_cast<T>(C);
      for (int64_t c = 0; c < C; c += kBlock) {
        const int len = block_len(c, C);
        const Block<T> g = load_block(dyi + c, len) * load_block(gamma + c, len);
        const Block<T> xhat = (load_block(xi + c, len) - m) * r;
        add_block(dx + i * C + c, Block<T>(r * (g - mean_g - xhat * mean_gx)), len);
      }
    }
  }
  if (dgamma == nullptr && dbeta == nullptr) return;
  for (int64_t i = 0; i < N; ++i) {
    const T* xi = x + i * C;
    const T* dyi = dy + i * C;
    for (int64_t c = 0; c < C; c += kBlock) {
      const int len = block_len(c, C);
      const Block<T> d = load_block(dyi + c, len);
      if (dgamma != nullptr) {
        add_block(dgamma + c, Block<T>(d * ((load_block(xi + c, len) - mean[i]) * rstd[i])), len);
      }
      if (dbeta != nullptr) add_block(dbeta + c, d, len);
    }
  }
}

template <typename T>
void rmsnorm_forward(const T* x, const T* gamma, T* y, T* rrms, int64_t N, int64_t C, double eps) {
#pragma omp parallel for if (N * C >= kParallelMin)
  for (int64_t i = 0; i < N; ++i) {
    const T* xi = x + i * C;
    Block<T> acc = Block<T>::Zero();
    for (int64_t c = 0; c < C; c += kBlock) acc += load_block(xi + c, block_len(c, C)).square();
    const T r = T(1) / std::sqrt(lane_sum(acc) / static_cast<T>(C) + static_cast<T>(eps));
    for (int64_t c = 0; c < C; c += kBlock) {
      const int len = block_len(c, C);
      store_block(y + i * C + c, Block<T>(load_block(xi + c, len) * r * load_block(gamma + c, len)),
                  len);
    }
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
      Block<T> sum_gx = Block<T>::Zero();
      for (int64_t c = 0; c < C; c += kBlock) {
        const int len = block_len(c, C);
        sum_gx +=
            load_block(dyi + c, len) * load_block(gamma + c, len) * (load_block(xi + c, len) * r);
      }
      const T mean_gx = lane_sum(sum_gx) / static_cast<T>(C);
      for (int64_t c = 0; c < C; c += kBlock) {
        const int len = block_len(c, C);
        const Block<T> g = load_block(dyi + c, len) * load_block(gamma + c, len);
        const Block<T> xhat = load_block(xi + c, len) * r;
        add_block(dx + i * C + c, Block<T>(r * (g - xhat * mean_gx)), len);
      }
    }
  }
  if (dgamma == nullptr) return;
  for (int64_t i = 0; i < N; ++i) {
    for (int64_t c = 0; c < C; c += kBlock) {
      const int len = block_len(c, C);
      const Block<T> xhat = load_block(x + i * C + c, len) * rrms[i];
      add_block(dgamma + c, Block<T>(load_block(dy + i * C + c, len) * xhat), len);
    }
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

// CPU kernels of GELU (tanh approximation). Elementwise: each element on one thread, so the
// parallel loops are bit-deterministic.
#include <cmath>

#include "model/ops/gelu.h"

namespace gtron::cpu {

namespace {
constexpr int64_t kParallelMin = 1 << 14;  // elements; below this a thread team costs more
constexpr double kSqrt2OverPi = 0.7978845608028654;  // sqrt(2/π)
constexpr double kCubic = 0.044715;
}  // namespace

template <typename T>
void gelu_forward(const T* x, T* y, int64_t n) {
  const T k = static_cast<T>(kSqrt2OverPi);
  const T a = static_cast<T>(kCubic);
#pragma omp parallel for if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const T v = x[i];
    y[i] = T(0.5) * v * (T(1) + std::tanh(k * (v + a * v * v * v)));
  }
}

// With u = k·(x + a·x³):  gelu'(x) = ½(1 + tanh u) + ½·x·(1 − tanh²u)·k·(1 + 3a·x²).
template <typename T>
void gelu_backward(const T* x, const T* dy, T* dx, int64_t n) {
  const T k = static_cast<T>(kSqrt2OverPi);
  const T a = static_cast<T>(kCubic);
#pragma omp parallel for if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const T v = x[i];
    const T th = std::tanh(k * (v + a * v * v * v));
    const T d =
        T(0.5) * (T(1) + th) + T(0.5) * v * (T(1) - th * th) * k * (T(1) + T(3) * a * v * v);
    dx[i] += d * dy[i];
  }
}

template void gelu_forward<float>(const float*, float*, int64_t);
template void gelu_forward<double>(const double*, double*, int64_t);
template void gelu_backward<float>(const float*, const float*, float*, int64_t);
template void gelu_backward<double>(const double*, const double*, double*, int64_t);

}  // namespace gtron::cpu

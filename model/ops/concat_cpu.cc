// CPU kernels of concat_features: row copies. Each output element is written by one thread.
#include <cstring>

#include "model/ops/concat.h"
#include "model/ops/eigen.h"

namespace gtron::cpu {

namespace {
constexpr int64_t kParallelMin = 1 << 15;  // elements; below this a thread team costs more
}  // namespace

template <typename T>
void concat_forward(const T* a, const T* b, T* y, int64_t N, int64_t Ca, int64_t Cb) {
  const int64_t C = Ca + Cb;
#pragma omp parallel for if (N * C >= kParallelMin)
  for (int64_t i = 0; i < N; ++i) {
    std::memcpy(y + i * C, a + i * Ca, sizeof(T) * Ca);
    std::memcpy(y + i * C + Ca, b + i * Cb, sizeof(T) * Cb);
  }
}

template <typename T>
void concat_backward(const T* dy, T* da, T* db, int64_t N, int64_t Ca, int64_t Cb) {
  const int64_t C = Ca + Cb;
#pragma omp parallel for if (N * C >= kParallelMin)
  for (int64_t i = 0; i < N; ++i) {
    if (da != nullptr) Vec<T>(da + i * Ca, Ca) += CVec<T>(dy + i * C, Ca);
    if (db != nullptr) Vec<T>(db + i * Cb, Cb) += CVec<T>(dy + i * C + Ca, Cb);
  }
}

template void concat_forward<float>(const float*, const float*, float*, int64_t, int64_t, int64_t);
template void concat_forward<double>(const double*, const double*, double*, int64_t, int64_t,
                                     int64_t);
template void concat_backward<float>(const float*, float*, float*, int64_t, int64_t, int64_t);
template void concat_backward<double>(const double*, double*, double*, int64_t, int64_t, int64_t);

}  // namespace gtron::cpu

// CPU kernels of SwiGLU, row by row in fixed blocks (model/ops/cpu_math.h): each element on one
// thread through the same packet code, so the parallel loops are bit-deterministic.
#include "model/ops/cpu_math.h"
#include "model/ops/swiglu.h"

namespace gtron::cpu {

namespace {

constexpr int64_t kParallelMin = 1 << 14;  // elements; below this a thread team costs more

template <typename T>
inline Block<T> sigmoid(const Block<T>& g) {
  return T(1) / (T(1) + (-g).exp());
}

}  // namespace

template <typename T>
void swiglu_forward(const T* x, T* y, int64_t N, int64_t F) {
#pragma omp parallel for if (N * F >= kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const T* gate = x + n * 2 * F;
    const T* up = gate + F;
    for (int64_t j = 0; j < F; j += kBlock) {
      const int len = block_len(j, F);
      const Block<T> g = load_block(gate + j, len);
      store_block(y + n * F + j, Block<T>(g * sigmoid(g) * load_block(up + j, len)), len);
    }
  }
}

template <typename T>
void swiglu_backward(const T* x, const T* dy, T* dx, int64_t N, int64_t F) {
#pragma omp parallel for if (N * F >= kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const T* gate = x + n * 2 * F;
    const T* up = gate + F;
    T* dgate = dx + n * 2 * F;
    T* dup = dgate + F;
    for (int64_t j = 0; j < F; j += kBlock) {
      const int len = block_len(j, F);
      const Block<T> g = load_block(gate + j, len);
      const Block<T> d = load_block(dy + n * F + j, len);
      const Block<T> sg = sigmoid(g);
      const Block<T> dsilu = sg * (T(1) + g * (T(1) - sg));
      add_block(dgate + j, Block<T>(d * load_block(up + j, len) * dsilu), len);
      add_block(dup + j, Block<T>(d * g * sg), len);
    }
  }
}

template void swiglu_forward<float>(const float*, float*, int64_t, int64_t);
template void swiglu_forward<double>(const double*, double*, int64_t, int64_t);
template void swiglu_backward<float>(const float*, const float*, float*, int64_t, int64_t);
template void swiglu_backward<double>(const double*, const double*, double*, int64_t, int64_t);

}  // namespace gtron::cpu

// CPU kernels of GELU (tanh approximation), in fixed blocks (model/ops/cpu_math.h): each element
// on one thread through the same packet code, so the parallel loops are bit-deterministic.
#include "model/ops/cpu_math.h"
#include "model/ops/gelu.h"

namespace gtron::cpu {

namespace {

constexpr int64_t kParallelMin = 1 << 14;  // elements; below this a thread team costs more
constexpr double kSqrt2OverPi = 0.7978845608028654;  // sqrt(2/π)
constexpr double kCubic = 0.044715;

// u = sqrt(2/π)·(x + 0.044715·x³)
template <typename T>
inline Block<T> gelu_arg(const Block<T>& x) {
  return T(kSqrt2OverPi) * (x + T(kCubic) * x.cube());
}

}  // namespace

template <typename T>
void gelu_forward(const T* x, T* y, int64_t n) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for if (n >= kParallelMin)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t i = b * kBlock;
    const int len = block_len(i, n);
    const Block<T> xb = load_block(x + i, len);
    store_block(y + i, Block<T>(T(0.5) * xb * (T(1) + gelu_arg(xb).tanh())), len);
  }
}

// gelu'(x) = ½(1 + tanh u) + ½·x·(1 − tanh²u)·sqrt(2/π)·(1 + 3·0.044715·x²).
template <typename T>
void gelu_backward(const T* x, const T* dy, T* dx, int64_t n) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for if (n >= kParallelMin)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t i = b * kBlock;
    const int len = block_len(i, n);
    const Block<T> xb = load_block(x + i, len);
    const Block<T> th = gelu_arg(xb).tanh();
    const Block<T> du = T(kSqrt2OverPi) * (T(1) + T(3 * kCubic) * xb.square());
    const Block<T> d = T(0.5) * (T(1) + th) + T(0.5) * xb * (T(1) - th.square()) * du;
    add_block(dx + i, Block<T>(d * load_block(dy + i, len)), len);
  }
}

template void gelu_forward<float>(const float*, float*, int64_t);
template void gelu_forward<double>(const double*, double*, int64_t);
template void gelu_backward<float>(const float*, const float*, float*, int64_t);
template void gelu_backward<double>(const double*, const double*, double*, int64_t);

}  // namespace gtron::cpu

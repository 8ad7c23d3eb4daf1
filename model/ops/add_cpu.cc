#include "model/ops/add.h"
#include "model/ops/eigen.h"

namespace gtron::cpu {

template <typename T>
void add_forward(const T* a, const T* b, T* y, int64_t n) {
  Vec<T>(y, n) = CVec<T>(a, n) + CVec<T>(b, n);
}

template <typename T>
void accumulate(T* dst, const T* src, int64_t n) {
  Vec<T>(dst, n) += CVec<T>(src, n);
}

template void add_forward<float>(const float*, const float*, float*, int64_t);
template void add_forward<double>(const double*, const double*, double*, int64_t);
template void accumulate<float>(float*, const float*, int64_t);
template void accumulate<double>(double*, const double*, int64_t);

}  // namespace gtron::cpu

#include "model/ops/eigen.h"
#include "model/ops/linear.h"

namespace gtron::cpu {

template <typename T>
void linear_forward(const T* x, const T* w, const T* b, T* y, int64_t N, int64_t Cin,
                    int64_t Cout) {
  fix_eigen_blocking();
  CMat<T> X(x, N, Cin);
  CMat<T> W(w, Cout, Cin);
  Mat<T> Y(y, N, Cout);
  Y.noalias() = X * W.transpose();
  if (b != nullptr) Y.rowwise() += CVec<T>(b, Cout).transpose();
}

template <typename T>
void linear_backward(const T* x, const T* w, const T* dy, T* dx, T* dw, T* db, int64_t N,
                     int64_t Cin, int64_t Cout) {
  fix_eigen_blocking();
  CMat<T> X(x, N, Cin);
  CMat<T> W(w, Cout, Cin);
  CMat<T> DY(dy, N, Cout);
  if (dx != nullptr) Mat<T>(dx, N, Cin).noalias() += DY * W;
  if (dw != nullptr) Mat<T>(dw, Cout, Cin).noalias() += DY.transpose() * X;
  if (db != nullptr) Vec<T>(db, Cout) += DY.colwise().sum().transpose();
}

template void linear_forward<float>(const float*, const float*, const float*, float*, int64_t,
                                    int64_t, int64_t);
template void linear_forward<double>(const double*, const double*, const double*, double*, int64_t,
                                     int64_t, int64_t);
template void linear_backward<float>(const float*, const float*, const float*, float*, float*,
                                     float*, int64_t, int64_t, int64_t);
template void linear_backward<double>(const double*, const double*, const double*, double*, double*,
                                      double*, int64_t, int64_t, int64_t);

}  // namespace gtron::cpu

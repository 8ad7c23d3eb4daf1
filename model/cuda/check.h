// The backend call checks: one generic macro, one failure policy.
#pragma once

#include <cuda_runtime.h>

#include "model/check.h"

#define GTRON_CHECK_CALL(ok, call, what)                                     \
  do {                                                                       \
    if (!(ok)) {                                                             \
      int dev_ = -1;                                                         \
      cudaGetDevice(&dev_);                                                  \
      ::gtron::check_failed(call, __FILE__, __LINE__,                        \
                            ::gtron::str_cat(what, " (device ", dev_, ")")); \
    }                                                                        \
  } while (0)

#define CUDA_CHECK(expr)                                                    \
  do {                                                                      \
    cudaError_t err_ = (expr);                                              \
    GTRON_CHECK_CALL(err_ == cudaSuccess, #expr, cudaGetErrorString(err_)); \
  } while (0)

#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

namespace gtron::cuda {

template <typename T>
constexpr T ceil_div(T a, T b) {
  return (a + b - 1) / b;
}

}  // namespace gtron::cuda

// Shape and device preconditions shared by the ops. A mismatch is a caller bug in model code, so it
// aborts via GTRON_CHECK with both shapes in the message.
#pragma once

#include <string>

#include "model/tensor.h"

namespace gtron {

inline void check_shape(const char* what, const Shape& got, const Shape& want) {
  GTRON_CHECK(got == want, what, ": shape ", got.str(), ", expected ", want.str());
}

inline void check_same_device_dtype(const char* op, const Tensor& a, const Tensor& b) {
  GTRON_CHECK(a.device() == b.device() && a.dtype() == b.dtype(), op, ": operands on ",
              a.device().str(), "/", dtype_name(a.dtype()), " and ", b.device().str(), "/",
              dtype_name(b.dtype()));
}

// The CUDA kernels of the ops land with the GPU backend; until an op has one, a CUDA tensor reaching
// it is an invariant violation (device selection keeps such runs on CPU).
inline void require_cpu(const char* op, Device d) {
  GTRON_CHECK(d.is_cpu(), op, ": no CUDA kernel in this build for ", d.str());
}

}  // namespace gtron

// Shape, device and dtype preconditions shared by the ops. A mismatch is a caller bug in model
// code, so it aborts via GTRON_CHECK with both shapes (or types) in the message.
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

// A parameter operand `p` (gamma, beta, positions, bias) next to activations `x`: on x's device,
// in x's dtype — or, on CUDA, in f32 next to bf16 activations (the kernels read fp32 master values
// directly and compute in fp32 anyway).
inline void check_param_operand(const char* op, const Tensor& x, const Tensor& p) {
  if (x.device().is_cuda() && p.device() == x.device() && p.dtype() == DType::kF32) return;
  check_same_device_dtype(op, x, p);
}

}  // namespace gtron

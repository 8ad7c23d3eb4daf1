// gelu (tanh approximation, as GPT-2): y = 0.5·x·(1 + tanh(sqrt(2/π)·(x + 0.044715·x³))).
#pragma once

#include <cstdint>

#include "model/autograd.h"

namespace gtron {

// Any shape. Backward accumulates dx += gelu'(x)·dy.
Var gelu(const Var& x);

namespace cpu {
template <typename T>
void gelu_forward(const T* x, T* y, int64_t n);
// Accumulates dx += gelu'(x)·dy.
template <typename T>
void gelu_backward(const T* x, const T* dy, T* dx, int64_t n);
}  // namespace cpu

namespace cuda {
// n elements in `act` (f32 or bf16), fp32 math, on `stream` (a cudaStream_t).
void gelu_forward(const void* x, void* y, int64_t n, DType act, void* stream);
// Accumulates dx += gelu'(x)·dy, or writes dx = gelu'(x)·dy with `overwrite`.
void gelu_backward(const void* x, const void* dy, void* dx, int64_t n, DType act, void* stream,
                   bool overwrite = false);
}  // namespace cuda

}  // namespace gtron

// add: y = a + b elementwise (the residual connection). Same shape, dtype and device.
// Backward accumulates: da += dy, db += dy.
#pragma once

#include <cstdint>

#include "model/autograd.h"

namespace gtron {

Var add(const Var& a, const Var& b);
// dst += src (same shape and dtype) on the current stream of dst's device. Not recorded.
void accumulate_into(Tensor& dst, const Tensor& src);
// In a backward: in's gradient += grad, where grad is final and nobody reads it afterwards (an
// op output's gradient, handed on like add's): an empty slot takes grad's buffer itself (Note [add
// backward aliasing]), a filled one accumulates. Nothing when `in` wants no gradient.
void hand_on_gradient(const Var& in, const Tensor& grad);

namespace cpu {
template <typename T>
void add_forward(const T* a, const T* b, T* y, int64_t n);
// dst += src
template <typename T>
void accumulate(T* dst, const T* src, int64_t n);
}  // namespace cpu

namespace cuda {
// y = a + b over n elements on `stream` (a cudaStream_t). f32 and bf16.
void add_forward(const void* a, const void* b, void* y, int64_t n, DType dtype, void* stream);
// dst += src over n elements (f32, bf16).
void accumulate(void* dst, const void* src, int64_t n, DType dtype, void* stream);
}  // namespace cuda

}  // namespace gtron

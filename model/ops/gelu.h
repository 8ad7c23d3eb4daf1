// gelu (tanh approximation, as GPT-2): y = 0.5·x·(1 + tanh(sqrt(2/π)·(x + 0.044715·x³))).
#pragma once

#include <cstdint>

#include "model/autograd.h"

namespace gtron {

namespace fp8 {
struct QuantizedRows;
}  // namespace fp8

// Any shape. Backward accumulates dx += gelu'(x)·dy.
// With `codes`: y's FP8 codes as well (Note [fp8 fused producers] in model/ops/fp8.h), the rows
// layout fp8_quantize_rows makes of y as rows of its last dim, into new scratch on the stream, in
// the same pass as y. REQUIRES (codes): x on CUDA in bf16, rank >= 1.
Var gelu(const Var& x, fp8::QuantizedRows* codes = nullptr);

namespace cpu {
template <typename T>
void gelu_forward(const T* x, T* y, int64_t n);
// Accumulates dx += gelu'(x)·dy.
template <typename T>
void gelu_backward(const T* x, const T* dy, T* dx, int64_t n);
}  // namespace cpu

namespace cuda {
// n elements in `act` (f32 or bf16), fp32 math, on `stream` (a cudaStream_t). With `q` (act bf16),
// also y's FP8 codes as rows of K (n % K == 0): q[n / K, K] and rows-layout scales qs (what
// fp8_quantize_rows makes of y), in the same pass where the layout allows.
void gelu_forward(const void* x, void* y, int64_t n, DType act, void* stream, uint8_t* q = nullptr,
                  float* qs = nullptr, int64_t K = 0);
// Accumulates dx += gelu'(x)·dy, or writes dx = gelu'(x)·dy with `overwrite`.
void gelu_backward(const void* x, const void* dy, void* dx, int64_t n, DType act, void* stream,
                   bool overwrite = false);
}  // namespace cuda

}  // namespace gtron

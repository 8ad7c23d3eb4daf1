// SwiGLU (Llama's MLP activation): y = silu(gate) ⊙ up with silu(g) = g·sigmoid(g), on the
// output of one GEMM that makes both halves.
#pragma once

#include <cstdint>

#include "model/autograd.h"

namespace gtron {

// x: [..., 2F] holding [gate | up] (gate in columns [0, F), up in [F, 2F)). Returns [..., F].
// Backward accumulates into both halves of dx:
//   d gate += dy·up·silu'(gate), silu'(g) = σ(g)·(1 + g·(1 − σ(g))),   d up += dy·silu(gate).
// REQUIRES: the last dim even and > 0.
Var swiglu(const Var& x);

namespace cpu {
// N rows: x [N, 2F], y [N, F].
template <typename T>
void swiglu_forward(const T* x, T* y, int64_t N, int64_t F);
// Accumulates dx [N, 2F] += the gradient for dy [N, F].
template <typename T>
void swiglu_backward(const T* x, const T* dy, T* dx, int64_t N, int64_t F);
}  // namespace cpu

namespace cuda {
// The CPU contract in `act` (f32 or bf16), fp32 math, on `stream` (a cudaStream_t). The backward
// accumulates into dx, or writes it with `overwrite`.
void swiglu_forward(const void* x, void* y, int64_t N, int64_t F, DType act, void* stream);
void swiglu_backward(const void* x, const void* dy, void* dx, int64_t N, int64_t F, DType act,
                     void* stream, bool overwrite = false);
}  // namespace cuda

}  // namespace gtron

// SwiGLU (Llama's MLP activation): y = silu(gate) ⊙ up with silu(g) = g·sigmoid(g), on the
// output of one GEMM that makes both halves.
#pragma once

#include <cstdint>

#include "model/autograd.h"

namespace gtron {

namespace fp8 {
struct QuantizedRows;
}  // namespace fp8

// x: [..., 2F] holding [gate | up] (gate in columns [0, F), up in [F, 2F)). Returns [..., F].
// Backward accumulates into both halves of dx:
//   d gate += dy·up·silu'(gate), silu'(g) = σ(g)·(1 + g·(1 − σ(g))),   d up += dy·silu(gate).
// REQUIRES: the last dim even and > 0.
// With `codes`: y's FP8 codes as well (Note [fp8 fused producers] in model/ops/fp8.h), the rows
// layout fp8_quantize_rows makes of y ([N, F], tiles along F), into new scratch on the stream, in
// the same pass as y. REQUIRES (codes): x on CUDA in bf16.
Var swiglu(const Var& x, fp8::QuantizedRows* codes = nullptr);
// The backward into x's gradient from dy [N, F] on CUDA, as swiglu's (shared with
// swiglu_linear_fp8, model/ops/fused_mlp.h): written or accumulated, with x's gradient codes where
// its reader asked for them (Note [gradient fp8 codes] in model/autograd.h).
void swiglu_backward_cuda(const Var& x, const Tensor& dy, int64_t N, int64_t F);

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
// accumulates into dx, or writes it with `overwrite`. With `q` (act bf16), the forward also writes
// y's FP8 codes q[N, F] and rows-layout scales qs (what fp8_quantize_rows makes of y), in the same
// pass where the layout allows.
void swiglu_forward(const void* x, void* y, int64_t N, int64_t F, DType act, void* stream,
                    uint8_t* q = nullptr, float* qs = nullptr);
void swiglu_backward(const void* x, const void* dy, void* dx, int64_t N, int64_t F, DType act,
                     void* stream, bool overwrite = false);
// The backward in bf16, dx written (not accumulated), plus dx's FP8 codes as
// fp8_quantize_rows_cols (model/ops/fp8.h) makes them of dx [N, 2F]: q [N, 2F] with rows-layout
// scales qs, qt [2F, N] with qts (Note [SwiGLU backward with FP8 codes] in swiglu_cuda.cu).
// dx null: the codes only (the reader never reads dx's values).
// REQUIRES: swiglu_backward_codes_ok(N, F, x, dy, dx); q and qt 16-byte aligned.
bool swiglu_backward_codes_ok(int64_t N, int64_t F, const void* x, const void* dy, const void* dx);
void swiglu_backward_fp8(const void* x, const void* dy, void* dx, int64_t N, int64_t F, uint8_t* q,
                         float* qs, uint8_t* qt, float* qts, void* stream);
// The forward's output y [N, F] (stored only if y is non-null) with its FP8 codes both ways, as
// fp8_quantize_rows_cols makes them of y: q [N, F] with rows-layout scales qs, qt [F, N] with qts
// (Note [SwiGLU forward with both codes] in swiglu_cuda.cu). REQUIRES: swiglu_backward_codes_ok(N,
// F, x, y, nullptr) (the same whole tiles); q and qt 16-byte aligned.
void swiglu_forward_fp8(const void* x, void* y, int64_t N, int64_t F, uint8_t* q, float* qs,
                        uint8_t* qt, float* qts, void* stream);
}  // namespace cuda

}  // namespace gtron

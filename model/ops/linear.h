// linear: y = x · Wᵀ + b (PyTorch nn.Linear layout, W is [out, in]).
#pragma once

#include <cstdint>

#include "model/autograd.h"

namespace gtron {

namespace fp8 {
struct QuantizedWeight;
struct QuantizedRows;
}  // namespace fp8

// x: [N, Cin] (any leading shape flattening to N rows), w: [Cout, Cin], b: [Cout] or undefined.
// Returns y: x's leading shape with last dim Cout.
// Backward accumulates: dx += dy·W, dW += dyᵀ·x, db += Σ_rows dy.
// With `residual` (y's shape, dtype and device): y = residual + x·Wᵀ + b, on CUDA in the GEMM's
// epilogue (one rounding), elsewhere as add(residual, linear(x, w, b)); dresidual += dy.
// With `fp8`, the three products run in FP8 (Note [fp8 recipe] in model/ops/fp8.h): on CUDA over
// bf16 activations where cuda::fp8_gemm_ok(N, Cin, Cout) (else the bf16 products), on the CPU as
// its quantize-dequantize emulation. `wq` (CUDA FP8 only; else ignored): w's codes made beforehand
// (Note [fp8 weights once a step] in model/ops/fp8.h), or null to quantize w in the op. `xq`
// (likewise): x's codes written by x's producer (Note [fp8 fused producers]), read by the forward
// product instead of quantizing x; the backward still reads x.
Var linear(const Var& x, const Var& w, const Var& b, const Var& residual = Var(), bool fp8 = false,
           const fp8::QuantizedWeight* wq = nullptr, const fp8::QuantizedRows* xq = nullptr);

namespace cpu {
template <typename T>
void linear_forward(const T* x, const T* w, const T* b, T* y, int64_t N, int64_t Cin, int64_t Cout);
// Any of dx, dw, db may be null (no gradient wanted). Accumulates.
template <typename T>
void linear_backward(const T* x, const T* w, const T* dy, T* dx, T* dw, T* db, int64_t N,
                     int64_t Cin, int64_t Cout);
}  // namespace cpu

namespace cuda {
// y[N, Cout] = x[N, Cin] · w[Cout, Cin]ᵀ (+ bias[Cout]) on `stream` (a cudaStream_t), through
// model/cuda/gemm.h. x, w and y are in `act` (f32 or bf16). bias is null, or in `bias_dtype`:
// act, or f32 with bf16 activations; either is added in the GEMM epilogue to the fp32 accumulator
// (y rounded once), falling back to a separate pass where cuBLASLt has no such epilogue.
// With `residual` ([N, Cout] in act, not y), y = residual + x · wᵀ (+ bias), the residual read in
// the epilogue (beta = 1) and added before the one rounding.
void linear_forward(const void* x, const void* w, const void* bias, DType bias_dtype, void* y,
                    int64_t N, int64_t Cin, int64_t Cout, DType act, void* stream,
                    const void* residual = nullptr);
// Floats of scratch linear_backward needs when db is given (the deterministic column sum).
int64_t linear_backward_scratch_floats(int64_t N, int64_t Cout);
// db[Cout] (f32) += Σ_j partial[j·Cout + c] over `chunks` fixed-row-chunk partials of dy that its
// writer formed (Note [gradient column partials] in model/autograd.h): the finish of the column
// sums, in their fixed order (model/cuda/column_sum.cuh).
void linear_bias_grad_from_partials(const float* partial, int64_t chunks, int64_t Cout, float* db,
                                    void* stream);
// Accumulates, each pointer optional (null: no gradient wanted):
//   dx[N, Cin] (act) += dy·w,   dw[Cout, Cin] (dw_dtype) += dyᵀ·x,   db[Cout] (f32) += Σ_rows dy.
// dw is f32 (a main_grad) or act (e.g. a bf16 send buffer); db is f32 whatever `act` is. db is a
// fixed-order reduction (model/cuda/column_sum.cuh); `scratch` holds
// linear_backward_scratch_floats(N, Cout) floats.
// With dx_overwrite (dw_overwrite), dx (dw) is written (beta = 0) instead of accumulated into.
void linear_backward(const void* x, const void* w, const void* dy, void* dx, void* dw,
                     DType dw_dtype, float* db, float* scratch, int64_t N, int64_t Cin,
                     int64_t Cout, DType act, void* stream, bool dx_overwrite = false,
                     bool dw_overwrite = false);
}  // namespace cuda

}  // namespace gtron

// concat along the last (feature) dim: [..., Ca] ++ [..., Cb] -> [..., Ca + Cb].
#pragma once

#include <cstdint>

#include "model/autograd.h"

namespace gtron {

namespace fp8 {
struct QuantizedRows;
}  // namespace fp8

// a, b: same leading shape. Backward accumulates the matching column blocks into da and db.
// With `codes`: y's FP8 codes as well (Note [fp8 fused producers] in model/ops/fp8.h), the rows
// layout fp8_quantize_rows makes of y, into new scratch on the stream, in the same pass as y.
// REQUIRES (codes): a and b on CUDA in bf16.
Var concat_features(const Var& a, const Var& b, fp8::QuantizedRows* codes = nullptr);

namespace cpu {
// N rows: y[i] = [a[i] (Ca) | b[i] (Cb)].
template <typename T>
void concat_forward(const T* a, const T* b, T* y, int64_t N, int64_t Ca, int64_t Cb);
// da or db may be null. Accumulates.
template <typename T>
void concat_backward(const T* dy, T* da, T* db, int64_t N, int64_t Ca, int64_t Cb);
}  // namespace cpu

namespace cuda {
// N rows: y[i] = [a[i] (Ca) | b[i] (Cb)], all in `act` (f32 or bf16), on `stream`. With `q` (act
// bf16), also y's FP8 codes q[N, Ca + Cb] and rows-layout scales qs (what fp8_quantize_rows makes
// of y), in the same pass where the layout allows.
void concat_forward(const void* a, const void* b, void* y, int64_t N, int64_t Ca, int64_t Cb,
                    DType act, void* stream, uint8_t* q = nullptr, float* qs = nullptr);
// Accumulates da += dy[:, :Ca], db += dy[:, Ca:]; either may be null.
void concat_backward(const void* dy, void* da, void* db, int64_t N, int64_t Ca, int64_t Cb,
                     DType act, void* stream);
}  // namespace cuda

}  // namespace gtron

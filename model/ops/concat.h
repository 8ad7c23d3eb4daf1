// concat along the last (feature) dim: [..., Ca] ++ [..., Cb] -> [..., Ca + Cb].
#pragma once

#include <cstdint>

#include "model/autograd.h"

namespace gtron {

// a, b: same leading shape. Backward accumulates the matching column blocks into da and db.
Var concat_features(const Var& a, const Var& b);

namespace cpu {
// N rows: y[i] = [a[i] (Ca) | b[i] (Cb)].
template <typename T>
void concat_forward(const T* a, const T* b, T* y, int64_t N, int64_t Ca, int64_t Cb);
// da or db may be null. Accumulates.
template <typename T>
void concat_backward(const T* dy, T* da, T* db, int64_t N, int64_t Ca, int64_t Cb);
}  // namespace cpu

namespace cuda {
// N rows: y[i] = [a[i] (Ca) | b[i] (Cb)], all in `act` (f32 or bf16), on `stream`.
void concat_forward(const void* a, const void* b, void* y, int64_t N, int64_t Ca, int64_t Cb,
                    DType act, void* stream);
// Accumulates da += dy[:, :Ca], db += dy[:, Ca:]; either may be null.
void concat_backward(const void* dy, void* da, void* db, int64_t N, int64_t Ca, int64_t Cb,
                     DType act, void* stream);
}  // namespace cuda

}  // namespace gtron

// linear: y = x · Wᵀ + b (PyTorch nn.Linear layout, W is [out, in]).
#pragma once

#include <cstdint>

#include "model/autograd.h"

namespace gtron {

// x: [N, Cin] (any leading shape flattening to N rows), w: [Cout, Cin], b: [Cout] or undefined.
// Returns y: x's leading shape with last dim Cout.
// Backward accumulates: dx += dy·W, dW += dyᵀ·x, db += Σ_rows dy.
Var linear(const Var& x, const Var& w, const Var& b);

namespace cpu {
template <typename T>
void linear_forward(const T* x, const T* w, const T* b, T* y, int64_t N, int64_t Cin, int64_t Cout);
// Any of dx, dw, db may be null (no gradient wanted). Accumulates.
template <typename T>
void linear_backward(const T* x, const T* w, const T* dy, T* dx, T* dw, T* db, int64_t N,
                     int64_t Cin, int64_t Cout);
}  // namespace cpu

}  // namespace gtron

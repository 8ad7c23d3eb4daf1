// embedding: y[b, t, :] = table[tokens[b, t], :]  (gather); backward scatter-adds into the table.
// add_positions: y[b, t, :] = x[b, t, :] + wpe[t, :]  (GPT-2 learned positions).
#pragma once

#include <cstdint>

#include "model/autograd.h"

namespace gtron {

// tokens: i32 [B, T] (CPU tensor for CPU tables), each in [0, V). table: [V, C]. Returns [B, T, C]
// (any tokens shape of rank <= 3 works: the result is tokens' shape + [C]).
// Backward accumulates: dtable[tokens[b, t]] += dy[b, t] (scatter-add; repeated ids sum).
Var embedding(const Tensor& tokens, const Var& table);

// x: [B, T, C], wpe: [Tmax, C] with T <= Tmax. Returns [B, T, C].
// Backward accumulates: dx += dy; dwpe[t] += Σ_b dy[b, t].
Var add_positions(const Var& x, const Var& wpe);

namespace cpu {
// N token rows: y[i, :] = table[tokens[i], :]. Aborts on a token outside [0, V).
template <typename T>
void embedding_forward(const int32_t* tokens, const T* table, T* y, int64_t N, int64_t V,
                       int64_t C);
// dtable[tokens[i], :] += dy[i, :], rows in order 0..N-1 (a fixed order: bit-deterministic).
template <typename T>
void embedding_backward(const int32_t* tokens, const T* dy, T* dtable, int64_t N, int64_t V,
                        int64_t C);
// x, y: [B, Tlen, C]; wpe: the first Tlen rows of the position table.
template <typename T>
void add_positions_forward(const T* x, const T* wpe, T* y, int64_t B, int64_t Tlen, int64_t C);
// dx or dwpe may be null (no gradient wanted). Accumulates.
template <typename T>
void add_positions_backward(const T* dy, T* dx, T* dwpe, int64_t B, int64_t Tlen, int64_t C);
}  // namespace cpu

}  // namespace gtron

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

// The CUDA lookup behind embedding(), from ids already on the table's device: ids i32 [N], each in
// [0, V) — or, with `zero_outside` (the vocab-parallel lookup), also V: a zero row and no gradient;
// y: the output buffer [.., C] of N rows, returned as the op's value.
Var embedding_of_ids(const Tensor& ids, const Var& table, const Tensor& y, bool zero_outside);

// x: [B, T, C], wpe: [Tmax, C] with T <= Tmax. Returns [B, T, C].
// Backward accumulates: dx += dy; dwpe[t] += Σ_b dy[b, t].
// With `positions` (i32 [B, T] on x's device, each in [0, Tmax): the restarted positions of
// document masking, Note [document masking] in model/ops/segments.h): y[b, t] = x[b, t] +
// wpe[positions[b, t]], and dwpe[p] += Σ of dy over the (b, t) at position p, in row order.
Var add_positions(const Var& x, const Var& wpe, const Tensor& positions = Tensor());

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
// N rows at given positions: y[i] = x[i] + wpe[pos[i]]; aborts on a position outside [0, P).
template <typename T>
void add_positions_at_forward(const T* x, const T* wpe, const int32_t* pos, T* y, int64_t N,
                              int64_t P, int64_t C);
// dx[i] += dy[i]; dwpe[pos[i]] += dy[i] for i = 0..N-1 in order. dx or dwpe may be null.
template <typename T>
void add_positions_at_backward(const T* dy, const int32_t* pos, T* dx, T* dwpe, int64_t N,
                               int64_t C);
}  // namespace cpu

namespace cuda {
// tokens: i32 [N] on the device, each in [0, V) (a token outside traps the kernel: the op
// validates host-side ids before copying them). table [V, C] and y [N, C] in `act`.
void embedding_forward(const int32_t* tokens, const void* table, void* y, int64_t N, int64_t V,
                       int64_t C, DType act, void* stream);
// The vocab-parallel lookup (model/ops/vocab_parallel.h): local[i] = tokens[i] − v0 when in
// [0, Vl), else Vl (traps on a token outside [0, Vfull)); then y rows from a table of Vl rows,
// zero for id Vl. embedding_backward skips id V = Vl, so the same ids drive the gradient.
void embedding_local_ids(const int32_t* tokens, int32_t* local, int64_t N, int64_t v0, int64_t Vl,
                         int64_t Vfull, void* stream);
void embedding_forward_or_zero(const int32_t* ids, const void* table, void* y, int64_t N, int64_t V,
                               int64_t C, DType act, void* stream);
// Bytes of scratch embedding_backward needs.
int64_t embedding_backward_scratch_bytes(int64_t N, int64_t V);
// dtable[tokens[i], :] += dy[i, :] for i = 0..N-1 (tokens in [0, V]; id V adds nothing). dy in
// `act`; dtable in `grad_dtype`: f32 (a
// main_grad) or act. Deterministic: a stable radix sort groups the rows by token (keeping row
// order), then one block per distinct token adds its rows in ascending order, so with f32 the
// result is bit-identical to the CPU kernel. `scratch` holds embedding_backward_scratch_bytes.
void embedding_backward(const int32_t* tokens, const void* dy, void* dtable, DType grad_dtype,
                        void* scratch, int64_t N, int64_t V, int64_t C, DType act, void* stream);
// y = x + wpe[t] over x, y: [B, Tlen, C] in `act`; wpe (its first Tlen rows) in `wpe_dtype`: act,
// or f32 with bf16 activations.
void add_positions_forward(const void* x, const void* wpe, DType wpe_dtype, void* y, int64_t B,
                           int64_t Tlen, int64_t C, DType act, void* stream);
// Accumulates dx (act) += dy and dwpe (f32) [Tlen, C] += Σ_b dy[b] in order b = 0..B-1 (bit-
// identical to the CPU kernel in f32); either may be null.
void add_positions_backward(const void* dy, void* dx, float* dwpe, int64_t B, int64_t Tlen,
                            int64_t C, DType act, void* stream);
// N rows at device positions pos [N] (each in [0, P); one outside traps): y[i] = x[i] +
// wpe[pos[i]], dtypes as add_positions_forward. The backward is embedding_backward's scatter-add
// with pos as the ids (and dx += dy by cuda::accumulate).
void add_positions_at_forward(const void* x, const void* wpe, DType wpe_dtype, const int32_t* pos,
                              void* y, int64_t N, int64_t P, int64_t C, DType act, void* stream);
}  // namespace cuda

}  // namespace gtron

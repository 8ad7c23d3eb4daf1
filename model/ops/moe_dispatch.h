// Dispatch and combine of a mixture-of-experts MLP (model/moe.h): tokens permuted into expert
// order for the grouped expert GEMMs, and the experts' outputs brought back, weighted by the
// gates and summed per token.
//
// Note [MoE dispatch order]
// Every token n has k slots s = n·k + j (j = 0 .. k − 1, slot 0 its largest gate), slot s goes to
// expert ids[s]. The permuted rows are the slots in a stable sort by expert, then by token: the
// rows of expert e are the contiguous range [offsets[e], offsets[e + 1]), in token order. Hence
// - each expert reads one contiguous [rows, C] block (a grouped GEMM over the experts; with
//   expert parallelism, the blocks of one rank's experts are what an all-to-all sends it);
// - the shapes are static ([N·k, ·] whatever the routing): only the offsets change from batch to
//   batch, so no tensor is sized by the routing (a graph can hold the ops; the CUDA kernels will
//   read the offsets on the device);
// - combine sums each token's k slots in slot order, and dispatch's backward sums the k rows of a
//   token in slot order: every reduction has one fixed order, reruns are bit-identical.
#pragma once

#include <cstdint>

#include "model/autograd.h"

namespace gtron {

struct MoePlan {
  int64_t N = 0;   // tokens
  int k = 0;       // slots per token
  int64_t E = 0;   // experts
  Tensor pos;      // i32 [N·k]: the permuted row of slot s
  Tensor src;      // i32 [N·k]: the slot of permuted row r (its token is src[r] / k)
  Tensor offsets;  // i32 [E + 1]: expert e's rows are [offsets[e], offsets[e + 1])
};

// The plan of `ids` (i32 [N, k], each in [0, E)), made when the stream runs (so a recorded graph
// re-plans at every replay). `load` (optional, E counters): += the slots each expert received, in
// the same closure.
MoePlan moe_plan(const Tensor& ids, int64_t E, int64_t* load = nullptr);

// x: [..., C] of N rows -> [N·k, C], row r = x[src[r] / k]. Backward accumulates
// dx[n] += Σ_j dxp[pos[n·k + j]], j in order.
Var moe_dispatch(const Var& x, const MoePlan& plan);

// yp: [N·k, C] (permuted rows), gates: [N, k] -> `out_shape` (N rows of C):
// y[n] = Σ_j gates[n, j] · yp[pos[n·k + j]], j in order. Backward accumulates
// dyp[pos[n·k + j]] += gates[n, j]·dy[n] and dgates[n, j] += dy[n] · yp[pos[n·k + j]].
Var moe_combine(const Var& yp, const Var& gates, const MoePlan& plan, const Shape& out_shape);

namespace cpu {
void moe_plan(const int32_t* ids, int64_t N, int k, int64_t E, int32_t* pos, int32_t* src,
              int32_t* offsets, int64_t* load);
template <typename T>
void moe_dispatch_forward(const T* x, const int32_t* src, T* xp, int64_t N, int k, int64_t C);
template <typename T>
void moe_dispatch_backward(const T* dxp, const int32_t* pos, T* dx, int64_t N, int k, int64_t C);
template <typename T>
void moe_combine_forward(const T* yp, const T* gates, const int32_t* pos, T* y, int64_t N, int k,
                         int64_t C);
// Either of dyp, dgates may be null (no gradient wanted). Accumulates.
template <typename T>
void moe_combine_backward(const T* yp, const T* gates, const int32_t* pos, const T* dy, T* dyp,
                          T* dgates, int64_t N, int k, int64_t C);
}  // namespace cpu

}  // namespace gtron

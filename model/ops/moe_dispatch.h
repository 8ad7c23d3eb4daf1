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
//
// Note [MoE plan on CUDA]
// The plan is a counting sort in three kernels, with no host read (the forward stays capturable
// and never waits for the GPU):
//   1. count: each block of kPlanChunk consecutive slots histograms its experts in shared memory
//      (integer atomics: the counts do not depend on their order);
//   2. scan: one block, a thread an expert: its rows before each chunk (a running sum over the
//      chunks in order), the experts' totals scanned into offsets, the load counters advanced;
//   3. place: each block walks its chunk in slot order, 256 slots a round; a slot's rank among the
//      earlier slots of its expert is the rank within its warp (__match_any_sync) plus the
//      counts of the warps before it in the round, plus the chunk's running count.
// So pos, src and offsets are the CPU's, bit for bit. Dispatch is a row gather (the CPU's bits);
// combine and dispatch's backward gather each token's k rows and sum them in slot order in fp32
// (a thread owns an output element: no atomics). Dispatch's backward, sums only, gives the CPU's
// f32 bits; combine may differ from it by the fused multiply-adds either compiler chooses.
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
// the same closure. On CUDA (ids on the device, E <= cuda::kMaxExperts) the counters are
// `device_load` instead (optional, i32 [E] on the device, advanced by the plan's kernels), and
// `load` must be null (Note [MoE plan on CUDA]).
MoePlan moe_plan(const Tensor& ids, int64_t E, int64_t* load = nullptr,
                 const Tensor& device_load = Tensor());

// x: [..., C] of N rows -> [N·k, C], row r = x[src[r] / k]. Backward accumulates
// dx[n] += Σ_j dxp[pos[n·k + j]], j in order.
Var moe_dispatch(const Var& x, const MoePlan& plan);

// yp: [N·k, C] (permuted rows), gates: [N, k] (yp's dtype; on CUDA also f32 next to bf16 rows,
// Note [fp32 routing on CUDA] in moe_router.h) -> `out_shape` (N rows of C, yp's dtype):
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

namespace cuda {
// Bytes of scratch moe_plan needs for N·k slots over E experts.
int64_t moe_plan_scratch_bytes(int64_t slots, int64_t E);
// The CPU contract on the device (Note [MoE plan on CUDA]); `load` (i32 [E]) may be null.
void moe_plan(const int32_t* ids, int64_t N, int k, int64_t E, int32_t* pos, int32_t* src,
              int32_t* offsets, int32_t* load, void* scratch, void* stream);
// Activations in `act` (f32 or bf16), on `stream` (a cudaStream_t). Backwards accumulate, or
// write with `overwrite` (dx: every row of x has k slots; dyp: every permuted row is one slot's).
void moe_dispatch_forward(const void* x, const int32_t* src, void* xp, int64_t N, int k, int64_t C,
                          DType act, void* stream);
void moe_dispatch_backward(const void* dxp, const int32_t* pos, void* dx, int64_t N, int k,
                           int64_t C, DType act, void* stream, bool overwrite);
// gates in `gate_dtype`: act, or f32.
void moe_combine_forward(const void* yp, const void* gates, const int32_t* pos, void* y, int64_t N,
                         int k, int64_t C, DType act, DType gate_dtype, void* stream);
// Either of dyp, dgates may be null (no gradient wanted); dgates accumulates.
void moe_combine_backward(const void* yp, const void* gates, const int32_t* pos, const void* dy,
                          void* dyp, bool dyp_overwrite, void* dgates, int64_t N, int k, int64_t C,
                          DType act, DType gate_dtype, void* stream);
}  // namespace cuda

}  // namespace gtron

// grouped_linear: one linear per contiguous row group, each with its own weight — the experts of
// a mixture-of-experts MLP over the rows dispatch has put in expert order (Note [MoE dispatch
// order] in model/ops/moe_dispatch.h).
#pragma once

#include <cstdint>
#include <vector>

#include "model/autograd.h"

namespace gtron {

// x: [M, Cin]; weights: G vars of [Cout, Cin] (PyTorch layout, as linear's); offsets: i32 [G + 1]
// with 0 = offsets[0] <= ... <= offsets[G] = M, read when the kernel runs (the groups' sizes may
// change from call to call of a recorded graph, the shapes do not). Returns y [M, Cout] with
// y[r] = x[r] · W_gᵀ for the group g holding row r. An empty group reads and writes nothing.
// Backward accumulates: dx[rows of g] += dy·W_g, dW_g += dy_gᵀ·x_g.
// With `fp8`, each group's products take linear's FP8 recipe (model/ops/fp8.h: its CPU
// emulation; the rows of a group are whole 1x128 tiles of their own, so a group quantizes as a
// linear over those rows would).
// On CUDA (Note [grouped GEMM on CUDA]): the offsets on the device (or copied there), read by the
// kernels only, never by the host; weights in x's dtype (bf16 shadows next to bf16 rows), weight
// gradients f32 (main_grad); G <= cuda::kMaxGroups; no fp8 yet.
Var grouped_linear(const Var& x, const std::vector<Var>& weights, const Tensor& offsets,
                   bool fp8 = false);

namespace cuda {
// The most groups one grouped GEMM takes: their pointers travel by value in the kernel's
// arguments (8 bytes each; CUDA 12.1+ allows 32 KiB of arguments).
constexpr int kMaxGroups = 512;
// The three products over G row groups of an [M, ·] buffer, group g's rows
// [offsets[g], offsets[g + 1]) (offsets: i32 [G + 1] on the device), on `stream` (a
// cudaStream_t). x, dy, y, dx and the weights in `act` (f32 or bf16); w[g] (host array of G
// device pointers) is group g's [Cout, Cin] weight.
//   forward:  y[rows of g] = x[rows of g] · w[g]ᵀ                      (written)
//   data:     dx[rows of g] (+)= dy[rows of g] · w[g]                  (written with overwrite)
//   weight:   dw[g] (f32 [Cout, Cin]) (+)= dy[rows of g]ᵀ · x[rows of g]; dw[g] null: skipped;
//             overwrite[g]: written (zeros for an empty group) instead of accumulated.
void grouped_linear_forward(const void* x, const void* const* w, void* y, const int32_t* offsets,
                            int64_t M, int64_t Cin, int64_t Cout, int G, DType act, void* stream);
void grouped_linear_backward_data(const void* dy, const void* const* w, void* dx,
                                  const int32_t* offsets, int64_t M, int64_t Cin, int64_t Cout,
                                  int G, DType act, void* stream, bool overwrite);
void grouped_linear_backward_weight(const void* x, const void* dy, float* const* dw,
                                    const bool* overwrite, const int32_t* offsets, int64_t M,
                                    int64_t Cin, int64_t Cout, int G, DType act, void* stream);
}  // namespace cuda

}  // namespace gtron

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
Var grouped_linear(const Var& x, const std::vector<Var>& weights, const Tensor& offsets,
                   bool fp8 = false);

}  // namespace gtron

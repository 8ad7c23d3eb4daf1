// The tensor-parallel seam of the ops: the collectives Megatron-style split layers need, behind
// an interface the model sees (parallel/tensor_parallel.h implements it over a Communicator), and
// the three autograd ops built on it (Note [tensor-parallel layout] in model/tensor_parallel.h).
//
//   tp_copy   "f": identity forward; the backward sums the input gradient over the TP group (the
//             input of a column-parallel layer feeds every rank's slice of the GEMM).
//   tp_reduce "g": sums a row-parallel layer's partial outputs over the group, then adds the
//             replicated bias; identity backward (every rank's partial got the same gradient).
//   tp_gather_features: the outputs of a column-parallel layer, concatenated over the group.
//   tp_gather_tokens / tp_scatter_tokens / tp_split_tokens: their sequence-parallel twins.
//
// Every rank of the group records the same ops in the same order (SPMD). CPU tensors (f32, f64)
// or CUDA tensors (f32, bf16; a CUDA bias may be f32 with a f32 main_grad gradient), every copy,
// sum and collective ordered on the current stream.
#pragma once

#include "model/autograd.h"

namespace gtron {

enum class TpReduce { kSum, kMax };

class TensorParallelGroup {
 public:
  virtual ~TensorParallelGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Reduces `t` in place over the group. Ordered on the current stream of t's device: it starts
  // after the work already queued there, and the work queued after it sees the result (a graph
  // capture records both). Every rank receives bit-identical values.
  virtual void all_reduce(Tensor& t, TpReduce op) = 0;
  // out (size() · in.numel() elements) holds rank r's `in` at [r·n, (r+1)·n); ordered likewise.
  virtual void all_gather(const Tensor& in, Tensor& out) = 0;
};

// y = x. Backward accumulates dx += Σ_TP dy.
Var tp_copy(const Var& x, TensorParallelGroup& g);
// y = Σ_TP x (+ bias [C] on every row when defined; x: [..., C]). Backward accumulates dx += dy and
// dbias += Σ_rows dy (rows in order).
Var tp_reduce(const Var& x, TensorParallelGroup& g, const Var& bias = Var());
// x: [..., c] -> [..., size·c], rank r's features at columns [r·c, (r+1)·c). Backward
// accumulates dx += dy[..., r·c : (r+1)·c] (dy is the same on every rank: no communication).
Var tp_gather_features(const Var& x, TensorParallelGroup& g);

// Sequence parallelism (Megatron): the norm/residual regions hold this rank's chunk of the
// sequence, positions [r·Tc, (r+1)·Tc) of every row b of a [B, T, C] tensor (T = size·Tc).
// tp_gather_tokens: [B, Tc, C] chunks -> [B, T, C] (all-gather); backward: the chunk of Σ_TP dy
//   (a reduce-scatter; here an all-reduce and a copy, bit-identical on every rank).
Var tp_gather_tokens(const Var& x, TensorParallelGroup& g);
// tp_scatter_tokens: partial [B, T, C] -> this rank's chunk of Σ_TP x (a reduce-scatter), plus
//   bias [C] when defined; backward: dx += all-gather of the chunks' dy, dbias += Σ_rows dy.
Var tp_scatter_tokens(const Var& x, TensorParallelGroup& g, const Var& bias = Var());
// tp_split_tokens: replicated [B, T, C] -> this rank's chunk (no communication); backward: dx +=
//   all-gather of the chunks' dy.
Var tp_split_tokens(const Var& x, TensorParallelGroup& g);
// Rows [begin, end) of a [n, ...] value (the positions of a chunk). Backward accumulates into
// those rows of dx.
Var slice_rows(const Var& x, int64_t begin, int64_t end);

}  // namespace gtron

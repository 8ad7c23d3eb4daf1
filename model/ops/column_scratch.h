// Scratch for the column-sum partials of CUDA parameter gradients (linear biases, norm gamma and
// beta), and the deferral of their finishes to the end of the tape run.
//
// Note [deferred column finishes]
// Every deterministic column sum (model/cuda/column_sum.cuh) ends with a small finish launch that
// adds the fixed-order partials of each column into the gradient: on GPT-2 124M about 75 of them
// a step (four linear biases and two LayerNorms a block), each a latency-bound launch of a few
// µs. Nothing reads those gradients before the backward ends but a grad-ready hook (DDP's
// reduction). So inside a tape run (Note [work at the end of a tape run] in model/autograd.h):
// - column_scratch allocates the partials' scratch, keeps it alive until the run ends, and makes
//   the run's cuda::FinishBatch (model/cuda/column_finish.h) this thread's active batch: the
//   op's column_tree_finish then queues its (partials, output) pairs there;
// - at the end of the run (inside the capture when the run is a graph region's) one launch per
//   64 outputs finishes them all, and the scratch is released;
// - before a grad-ready hook fires, the queued finishes run first (the hook reads main_grad).
// The bits are those of the separate launches: the same arithmetic, and the pairs of one output
// added in the order they were queued. No other writer interleaves with them: these gradients get
// only column sums. Outside a tape run each finish launches at once.
#pragma once

#include <cstdint>

#include "model/autograd.h"
#include "model/stream.h"
#include "model/tensor.h"

namespace gtron {

// Tests only: off, each finish launches at once inside tape runs too (the reference that the
// deferred finishes equal bit for bit); on by default. For the process, not thread-local.
void set_column_finish_deferral_for_testing(bool on);

// At least `floats` floats of scratch on `s` for column-sum partials; inside a tape run (and s a
// CUDA stream), kept alive until the run's finishes have run, and the run's batch made active.
Tensor column_scratch(int64_t floats, Stream& s);
// Partials made elsewhere (Note [gradient column partials] in model/autograd.h) that a finish
// queued now reads: kept alive like column_scratch's until the run's finishes have run.
void keep_column_scratch(const Tensor& t, Stream& s);

// Note [gradient column partials] (model/autograd.h): b's gradient += Σ_rows of y's gradient,
// finished from the partials y's last writer left on it (taken from y). Returns false, doing
// nothing, when there are none (or b wants no gradient). Call it before anything reads y's
// gradient: that access drops them.
bool bias_grad_from_partials(const Var& y, const Var& b, Stream& s);

}  // namespace gtron

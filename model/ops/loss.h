// Losses: softmax cross-entropy with masked positions, and scalar scaling/summing for the MTP loss.
#pragma once

#include <cstdint>

#include "model/autograd.h"

namespace gtron {

// Target value for positions that have no target (the MTP tail): excluded from loss and gradient.
constexpr int32_t kMaskedTarget = -1;

// logits: [..., Vp] (Vp = padded vocab), targets: i32 with logits' leading shape, each in [0, V) or
// kMaskedTarget. Softmax runs over the first V columns only (the padded tail gets zero gradient).
// Returns a scalar (rank 0): the mean CE over unmasked positions (0 if all are masked).
// Backward accumulates dlogits += (softmax − onehot) / n_unmasked · dloss.
Var cross_entropy(const Var& logits, const Tensor& targets, int64_t V);

// y = s · x (loss scaling, MTP weighting λ/D). Backward accumulates dx += s·dy.
Var scale(const Var& x, double s);

namespace cpu {
// logits: [N, Vp], targets: [N]. Aborts on a target outside [0, V) that is not kMaskedTarget.
// Writes the row statistics the backward reuses, over the first V columns: rmax[N] (the row max)
// and rlse[N] = log Σ exp(logit − rmax) (both unspecified on masked rows; kept apart so f32 never
// subtracts two large near-equal numbers), and the mean loss into loss[0], summed over rows in
// order (bit-deterministic).
template <typename T>
void cross_entropy_forward(const T* logits, const int32_t* targets, T* rmax, T* rlse, T* loss,
                           int64_t N, int64_t V, int64_t Vp);
// dloss[0] is read when the kernel runs. Accumulates into dlogits[:, :V]; the tail is untouched.
template <typename T>
void cross_entropy_backward(const T* logits, const int32_t* targets, const T* rmax, const T* rlse,
                            const T* dloss, T* dlogits, int64_t N, int64_t V, int64_t Vp);
template <typename T>
void scale_forward(const T* x, T* y, int64_t n, double s);
// Accumulates dx += s·dy.
template <typename T>
void scale_backward(const T* dy, T* dx, int64_t n, double s);
}  // namespace cpu

}  // namespace gtron

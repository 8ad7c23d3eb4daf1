// Losses: softmax cross-entropy with masked positions, and scalar scaling/summing for the MTP loss.
#pragma once

#include <cstdint>

#include "model/autograd.h"

namespace gtron {

// Target value for positions that have no target (the MTP tail): excluded from loss and gradient.
constexpr int32_t kMaskedTarget = -1;

// Host-side targets check before a copy to the device (the CPU kernel checks its own): each in
// [0, V) or kMaskedTarget.
void check_targets_on_host(const Tensor& targets, int64_t V);

// logits: [..., Vp] (Vp = padded vocab), targets: i32 with logits' leading shape, each in [0, V) or
// kMaskedTarget. Softmax runs over the first V columns only (the padded tail gets zero gradient).
// Returns a scalar (rank 0): the mean CE over unmasked positions (0 if all are masked).
// Backward accumulates dlogits += (softmax − onehot) / n_unmasked · dloss.
// `overwrite_logits` (the caller promises nothing else reads the logits after this loss, e.g. the
// model's head): on CUDA, when the logits' gradient slot is still empty at backward, the gradient
// is written over the logits' own buffer, which becomes that slot (no second [N, Vp] buffer, one
// pass instead of zero-fill + read-modify-write). The value is the same either way.
//
// `known` (a promise about the backward, made at forward time): this loss's upstream gradient
// will be exactly seed[0]·float(weight) in f32 (what backward_with(total, seed) delivers through
// add and scale(·, weight)). On CUDA with overwrite_logits and grad mode on, the forward then
// computes the loss and writes the gradient over the logits in the same pass over them, and the
// backward only hands that buffer on (Note [one-pass cross-entropy] below): values,
// gradient and memory as without the promise. A broken promise is caught on the device: the
// gradient is rescaled to the one that arrived (one more rounding). Ignored elsewhere.
struct KnownLossGrad {
  Tensor seed;          // f32 scalar on the logits' device, holding its value when backward runs
  double weight = 1.0;  // rounded to float, as scale() rounds its factor
};
Var cross_entropy(const Var& logits, const Tensor& targets, int64_t V,
                  bool overwrite_logits = false, const KnownLossGrad* known = nullptr);

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

namespace cuda {
// logits [N, Vp] in `act` (f32 or bf16); targets i32 [N] on the device, each in [0, V) or
// kMaskedTarget (anything else traps the kernel; the op validates host-side targets before
// copying them). Writes, all on the device (no host sync):
//   count[0] (i32) = the number of unmasked rows;
//   rmax, rlse [N] (f32) = the row max and log Σ exp(logit − rmax) over the first V columns
//     (unspecified on masked rows);
//   loss[0] (f32) = the mean CE over unmasked rows (0 if none), summed in a fixed order.
// Fused mode: when dlogits is not null, the same pass over each row also accumulates
//   dlogits[:, :V] (act) += (softmax − onehot) · dloss[0] / count[0],
// forming each probability once for loss and gradient together (dloss: an f32 device scalar that
// must hold its value when the kernel runs). The tail [V, Vp) is never read or written.
void cross_entropy_forward(const void* logits, const int32_t* targets, float* rmax, float* rlse,
                           int32_t* count, float* loss, void* dlogits, const float* dloss,
                           int64_t N, int64_t V, int64_t Vp, DType act, void* stream);
// The unfused backward from the forward's statistics: accumulates
//   dlogits[:, :V] += (softmax − onehot) · dloss[0] / count[0]   (nothing when count[0] = 0).
void cross_entropy_backward(const void* logits, const int32_t* targets, const float* rmax,
                            const float* rlse, const int32_t* count, const float* dloss,
                            void* dlogits, int64_t N, int64_t V, int64_t Vp, DType act,
                            void* stream, int64_t v0 = 0);
// The same gradient written over `logits` itself: logits[:, :V] = (softmax − onehot) · dloss[0] /
// count[0] from the saved statistics, zeros over the tail [V, Vp) and over masked rows.
// Both backwards: `v0` (vocab-parallel) is the full column of the logits' column 0, so the onehot
// sits at column target − v0 (none when outside [0, V)); V then counts this rank's columns below
// the real vocabulary.
void cross_entropy_backward_inplace(void* logits, const int32_t* targets, const float* rmax,
                                    const float* rlse, const int32_t* count, const float* dloss,
                                    int64_t N, int64_t V, int64_t Vp, DType act, void* stream,
                                    int64_t v0 = 0);

// Note [one-pass cross-entropy]
// Training knows the loss's upstream gradient before the forward runs: backward is seeded with a
// device scalar, and the loss of MTP depth k reaches it through scale(·, λ/D) only, so each CE
// receives exactly seed·w (w = 1 for the main head, float(λ/D) for a depth; f32 arithmetic, the
// zero-initialized slots adding exactly). Given that promise (cross_entropy's KnownLossGrad), one
// block per row
// 1. copies the row into shared memory (cp.async, 16 bytes per copy: bf16 50304 columns are 98 KiB,
//    two blocks per SM) — or, when the row does not fit, reads it from global twice;
// 2. computes the statistics from that copy with the rows kernel's own code (row_stats: same
//    block size, same order, the same bits) and saves the target logit before anything is
//    written (finalize then reads it from tlogit);
// 3. writes the gradient over the logits with the in-place backward's code (write_row_grad) and
//    g = (seed·w)/count, the same f32 operations as the backward's dloss/count.
// HBM sees the logits read once and written once (the two-pass path reads them twice), and loss,
// statistics and gradient equal the two-pass path's bit for bit. The backward only checks the
// promise: onepass_check_kernel compares the gradient that arrived with seed·w on the device (no
// host sync) and, where they differ, rescales the written gradient by their ratio (correct to one
// more rounding; it traps when seed·w is 0 or not finite, which cannot be rescaled).
//
// The one-pass cross-entropy (Note [one-pass cross-entropy]): count, rmax, rlse
// and loss as cross_entropy_forward writes them, and in the same pass over each row `logits`
// becomes the in-place backward's gradient for an upstream gradient of seed[0]·weight (f32,
// read when the kernel runs). tlogit [N] (f32): scratch, the target logits saved before the
// overwrite. Bit for bit the values of cross_entropy_forward + cross_entropy_backward_inplace
// with dloss[0] = seed[0]·weight.
void cross_entropy_onepass(void* logits, const int32_t* targets, float* rmax, float* rlse,
                           float* tlogit, int32_t* count, float* loss, const float* seed,
                           float weight, int64_t N, int64_t V, int64_t Vp, DType act, void* stream);
// cross_entropy_onepass in its three steps, for a caller that forms the logits a block of rows
// at a time (model/ops/classifier.h): cross_entropy_count over all N targets; then, per block,
// the rows step with logits, targets, rmax, rlse and tlogit offset to the block's first row (count
// is the whole count); then the finalize over all N. The same values as cross_entropy_onepass.
void cross_entropy_onepass_rows(void* logits, const int32_t* targets, float* rmax, float* rlse,
                                float* tlogit, const int32_t* count, const float* seed,
                                float weight, int64_t rows, int64_t V, int64_t Vp, DType act,
                                void* stream);
void cross_entropy_onepass_finalize(const int32_t* targets, const float* rmax, const float* rlse,
                                    const float* tlogit, const int32_t* count, float* loss,
                                    int64_t N, void* stream);
// Traps (printing both values) unless dloss[0] == seed[0]·weight: the check of a backward whose
// gradient was already consumed in the forward and cannot be rescaled.
void cross_entropy_promise_check(const float* seed, float weight, const float* dloss, void* stream);
// The one-pass backward's check: when dloss[0] differs from seed[0]·weight, the n gradient values
// written by cross_entropy_onepass are scaled by dloss[0] / (seed[0]·weight) (a trap when that
// divisor is 0 or not finite); else nothing is touched.
void cross_entropy_onepass_check(void* dlogits, int64_t n, const float* seed, float weight,
                                 const float* dloss, DType act, void* stream);
// The vocab-parallel CE's pieces (model/ops/vocab_parallel.cc), the single-GPU kernels reused:
// count[0] = unmasked targets (each in [0, V) or masked, else a trap);
void cross_entropy_count(const int32_t* targets, int32_t* count, int64_t N, int64_t V,
                         void* stream);
// rmax, rsum [N] = the row max and Σ exp(logit − rmax) over the first V of Vp columns (the rows
// kernel, keeping the sum instead of its log; unspecified on masked rows);
void cross_entropy_row_sums(const void* logits, const int32_t* targets, float* rmax, float* rsum,
                            int64_t N, int64_t V, int64_t Vp, DType act, void* stream);
// given the group max gmax [N] of this rank's lmax [N]: sums[i] (this rank's Σ exp, [2N] buffer)
// becomes Σ exp(logit − gmax), sums[N + i] the target logit where this rank's `valid` columns of
// its Vl hold target − v0, else 0 (masked rows: both 0), ready for the group sum;
void vocab_parallel_rescale(const void* logits, const int32_t* targets, const float* lmax,
                            const float* gmax, float* sums, int64_t N, int64_t Vl, int64_t valid,
                            int64_t v0, DType act, void* stream);
// after the group sum: rlse [N] = log sums[:N], loss[0] = the mean over unmasked rows of
// rlse − (target logit − gmax), the single-GPU finalize.
void vocab_parallel_finalize(const int32_t* targets, const float* gmax, const float* sums,
                             float* rlse, const int32_t* count, float* loss, int64_t N,
                             void* stream);
// y = s·x and dx += s·dy over n elements (f32 or bf16), s rounded to float.
void scale_forward(const void* x, void* y, int64_t n, double s, DType dtype, void* stream);
void scale_backward(const void* dy, void* dx, int64_t n, double s, DType dtype, void* stream);
}  // namespace cuda

}  // namespace gtron

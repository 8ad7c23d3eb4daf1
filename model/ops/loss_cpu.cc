// CPU kernels of the losses.
//
// Cross-entropy: per row, a max-subtracted log-sum-exp over the first V columns, in fixed blocks
// (model/ops/cpu_math.h). The padded tail [V, Vp) is never read, so whatever it holds cannot leak
// into loss or gradient. Rows whose target is kMaskedTarget are skipped; the loss is the mean over
// the other rows.
//
// Determinism policy: the per-row log-sum-exps and the gradient rows run in parallel (each row on
// one thread); the sum of the row losses into the scalar is serial, rows in order.
#include <cmath>

#include "model/check.h"
#include "model/ops/cpu_math.h"
#include "model/ops/loss.h"

namespace gtron::cpu {

namespace {

constexpr int64_t kParallelMin = 1 << 14;  // elements; below this a thread team costs more

// Number of rows with a target; aborts on a target that is neither in [0, V) nor masked.
int64_t count_unmasked(const int32_t* targets, int64_t N, int64_t V) {
  int64_t n = 0;
  for (int64_t i = 0; i < N; ++i) {
    const int32_t t = targets[i];
    GTRON_CHECK(t == kMaskedTarget || (t >= 0 && t < V), "cross_entropy: target ", t, " at row ", i,
                " outside [0, ", V, ") and not kMaskedTarget (", kMaskedTarget, ")");
    n += t != kMaskedTarget;
  }
  return n;
}

}  // namespace

template <typename T>
void cross_entropy_forward(const T* logits, const int32_t* targets, T* rmax, T* rlse, T* loss,
                           int64_t N, int64_t V, int64_t Vp) {
  const int64_t n = count_unmasked(targets, N, V);
#pragma omp parallel for if (N * V >= kParallelMin)
  for (int64_t i = 0; i < N; ++i) {
    if (targets[i] == kMaskedTarget) continue;
    const T* row = logits + i * Vp;
    const T m = row_max(row, V);
    Block<T> acc = Block<T>::Zero();
    for (int64_t j = 0; j < V; j += kBlock) {
      const int len = block_len(j, V);
      acc += mask_tail(Block<T>((load_block(row + j, len, m) - m).exp()), len);
    }
    rmax[i] = m;
    rlse[i] = std::log(lane_sum(acc));
  }
  T total = 0;
  for (int64_t i = 0; i < N; ++i) {
    if (targets[i] == kMaskedTarget) continue;
    // −log softmax[target] = log Σ exp(l − m) − (l[target] − m)
    total += rlse[i] - (logits[i * Vp + targets[i]] - rmax[i]);
  }
  loss[0] = n > 0 ? total / static_cast<T>(n) : T(0);
}

template <typename T>
void cross_entropy_backward(const T* logits, const int32_t* targets, const T* rmax, const T* rlse,
                            const T* dloss, T* dlogits, int64_t N, int64_t V, int64_t Vp) {
  const int64_t n = count_unmasked(targets, N, V);
  if (n == 0) return;
  const T g = dloss[0] / static_cast<T>(n);
#pragma omp parallel for if (N * V >= kParallelMin)
  for (int64_t i = 0; i < N; ++i) {
    const int32_t t = targets[i];
    if (t == kMaskedTarget) continue;
    const T* row = logits + i * Vp;
    T* d = dlogits + i * Vp;
    const T m = rmax[i];
    const T l = rlse[i];
    for (int64_t j = 0; j < V; j += kBlock) {
      const int len = block_len(j, V);
      Block<T> p = (load_block(row + j, len) - m - l).exp();
      if (t >= j && t < j + len) p[t - j] -= T(1);  // − onehot
      add_block(d + j, Block<T>(p * g), len);
    }
  }
}

template <typename T>
void scale_forward(const T* x, T* y, int64_t n, double s) {
  const T f = static_cast<T>(s);
  for (int64_t i = 0; i < n; ++i) y[i] = f * x[i];
}

template <typename T>
void scale_backward(const T* dy, T* dx, int64_t n, double s) {
  const T f = static_cast<T>(s);
  for (int64_t i = 0; i < n; ++i) dx[i] += f * dy[i];
}

template void cross_entropy_forward<float>(const float*, const int32_t*, float*, float*, float*,
                                           int64_t, int64_t, int64_t);
template void cross_entropy_forward<double>(const double*, const int32_t*, double*, double*,
                                            double*, int64_t, int64_t, int64_t);
template void cross_entropy_backward<float>(const float*, const int32_t*, const float*,
                                            const float*, const float*, float*, int64_t, int64_t,
                                            int64_t);
template void cross_entropy_backward<double>(const double*, const int32_t*, const double*,
                                             const double*, const double*, double*, int64_t,
                                             int64_t, int64_t);
template void scale_forward<float>(const float*, float*, int64_t, double);
template void scale_forward<double>(const double*, double*, int64_t, double);
template void scale_backward<float>(const float*, float*, int64_t, double);
template void scale_backward<double>(const double*, double*, int64_t, double);

}  // namespace gtron::cpu

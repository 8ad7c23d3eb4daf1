// CPU kernels of embedding and add_positions.
//
// Determinism policy: the forward passes and dx write each output element from exactly one
// thread. The reductions into shared rows (the embedding scatter-add, where ids repeat, and the
// Σ_b into dwpe) run serially in a fixed order, so gradients are bit-identical run to run
// whatever the thread count.
#include <cstring>

#include "model/check.h"
#include "model/ops/eigen.h"
#include "model/ops/embedding.h"

namespace gtron::cpu {

namespace {
constexpr int64_t kParallelMin = 1 << 15;  // elements; below this a thread team costs more
}  // namespace

template <typename T>
void embedding_forward(const int32_t* tokens, const T* table, T* y, int64_t N, int64_t V,
                       int64_t C) {
  for (int64_t i = 0; i < N; ++i) {
    GTRON_CHECK(tokens[i] >= 0 && tokens[i] < V, "embedding: token ", tokens[i], " at row ", i,
                " outside [0, ", V, ")");
  }
#pragma omp parallel for if (N * C >= kParallelMin)
  for (int64_t i = 0; i < N; ++i) {
    std::memcpy(y + i * C, table + static_cast<int64_t>(tokens[i]) * C, sizeof(T) * C);
  }
}

template <typename T>
void embedding_backward(const int32_t* tokens, const T* dy, T* dtable, int64_t N, int64_t V,
                        int64_t C) {
  for (int64_t i = 0; i < N; ++i) {
    GTRON_CHECK(tokens[i] >= 0 && tokens[i] < V, "embedding: token ", tokens[i], " at row ", i,
                " outside [0, ", V, ")");
    Vec<T>(dtable + static_cast<int64_t>(tokens[i]) * C, C) += CVec<T>(dy + i * C, C);
  }
}

template <typename T>
void add_positions_forward(const T* x, const T* wpe, T* y, int64_t B, int64_t Tlen, int64_t C) {
#pragma omp parallel for if (B * Tlen * C >= kParallelMin)
  for (int64_t r = 0; r < B * Tlen; ++r) {
    Vec<T>(y + r * C, C) = CVec<T>(x + r * C, C) + CVec<T>(wpe + (r % Tlen) * C, C);
  }
}

template <typename T>
void add_positions_backward(const T* dy, T* dx, T* dwpe, int64_t B, int64_t Tlen, int64_t C) {
  const int64_t TC = Tlen * C;
  if (dx != nullptr) {
#pragma omp parallel for if (B * TC >= kParallelMin)
    for (int64_t b = 0; b < B; ++b) Vec<T>(dx + b * TC, TC) += CVec<T>(dy + b * TC, TC);
  }
  if (dwpe != nullptr) {
    // Serial: dwpe[t] receives Σ_b in the order b = 0..B-1.
    for (int64_t b = 0; b < B; ++b) Vec<T>(dwpe, TC) += CVec<T>(dy + b * TC, TC);
  }
}

template <typename T>
void add_positions_at_forward(const T* x, const T* wpe, const int32_t* pos, T* y, int64_t N,
                              int64_t P, int64_t C) {
  for (int64_t i = 0; i < N; ++i) {
    GTRON_CHECK(pos[i] >= 0 && pos[i] < P, "add_positions: position ", pos[i], " at row ", i,
                " outside [0, ", P, ")");
  }
#pragma omp parallel for if (N * C >= kParallelMin)
  for (int64_t r = 0; r < N; ++r) {
    Vec<T>(y + r * C, C) = CVec<T>(x + r * C, C) + CVec<T>(wpe + pos[r] * C, C);
  }
}

template <typename T>
void add_positions_at_backward(const T* dy, const int32_t* pos, T* dx, T* dwpe, int64_t N,
                               int64_t C) {
  if (dx != nullptr) Vec<T>(dx, N * C) += CVec<T>(dy, N * C);
  if (dwpe != nullptr) {
    // Serial: a position's row receives its dy rows in row order.
    for (int64_t r = 0; r < N; ++r) Vec<T>(dwpe + pos[r] * C, C) += CVec<T>(dy + r * C, C);
  }
}

template void add_positions_at_forward<float>(const float*, const float*, const int32_t*, float*,
                                              int64_t, int64_t, int64_t);
template void add_positions_at_forward<double>(const double*, const double*, const int32_t*,
                                               double*, int64_t, int64_t, int64_t);
template void add_positions_at_backward<float>(const float*, const int32_t*, float*, float*,
                                               int64_t, int64_t);
template void add_positions_at_backward<double>(const double*, const int32_t*, double*, double*,
                                                int64_t, int64_t);

template void embedding_forward<float>(const int32_t*, const float*, float*, int64_t, int64_t,
                                       int64_t);
template void embedding_forward<double>(const int32_t*, const double*, double*, int64_t, int64_t,
                                        int64_t);
template void embedding_backward<float>(const int32_t*, const float*, float*, int64_t, int64_t,
                                        int64_t);
template void embedding_backward<double>(const int32_t*, const double*, double*, int64_t, int64_t,
                                         int64_t);
template void add_positions_forward<float>(const float*, const float*, float*, int64_t, int64_t,
                                           int64_t);
template void add_positions_forward<double>(const double*, const double*, double*, int64_t, int64_t,
                                            int64_t);
template void add_positions_backward<float>(const float*, float*, float*, int64_t, int64_t,
                                            int64_t);
template void add_positions_backward<double>(const double*, double*, double*, int64_t, int64_t,
                                             int64_t);

}  // namespace gtron::cpu

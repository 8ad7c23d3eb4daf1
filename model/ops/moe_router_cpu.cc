// CPU kernels of the MoE router: one row per token, each row on one thread in a fixed order, so
// the parallel loops are bit-deterministic; the balance loss sums in one fixed order.
#include <cmath>
#include <vector>

#include "model/ops/moe_router.h"

namespace gtron::cpu {

namespace {
constexpr int64_t kParallelMin = 1 << 14;  // elements; below this a thread team costs more
}  // namespace

template <typename T>
void router_scores_forward(const T* z, T* s, int64_t N, int64_t E, MoeRouterKind kind) {
#pragma omp parallel for if (N * E >= kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const T* zr = z + n * E;
    T* sr = s + n * E;
    if (kind == MoeRouterKind::kSigmoid) {
      for (int64_t e = 0; e < E; ++e) sr[e] = T(1) / (T(1) + std::exp(-zr[e]));
      continue;
    }
    T mx = zr[0];
    for (int64_t e = 1; e < E; ++e) mx = std::max(mx, zr[e]);
    T sum = 0;
    for (int64_t e = 0; e < E; ++e) {
      sr[e] = std::exp(zr[e] - mx);
      sum += sr[e];
    }
    for (int64_t e = 0; e < E; ++e) sr[e] /= sum;
  }
}

template <typename T>
void router_scores_backward(const T* s, const T* ds, T* dz, int64_t N, int64_t E,
                            MoeRouterKind kind) {
#pragma omp parallel for if (N * E >= kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const T* sr = s + n * E;
    const T* dr = ds + n * E;
    T* out = dz + n * E;
    if (kind == MoeRouterKind::kSigmoid) {
      for (int64_t e = 0; e < E; ++e) out[e] += dr[e] * sr[e] * (T(1) - sr[e]);
      continue;
    }
    T dot = 0;
    for (int64_t e = 0; e < E; ++e) dot += dr[e] * sr[e];
    for (int64_t e = 0; e < E; ++e) out[e] += sr[e] * (dr[e] - dot);
  }
}

template <typename T>
void topk_gates_forward(const T* s, const T* bias, int32_t* ids, T* gates, int64_t N, int64_t E,
                        int k, bool normalize) {
#pragma omp parallel for if (N * E * k >= kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const T* sr = s + n * E;
    int32_t* id = ids + n * k;
    T* g = gates + n * k;
    // k passes of an argmax over the experts not yet chosen: strict > keeps the lower index on a
    // tie (Note [router determinism]). E·k compares; E and k are small.
    uint64_t chosen_lo = 0;  // a bitmask for E <= 64, else the linear scan below
    for (int j = 0; j < k; ++j) {
      int32_t best = -1;
      T best_v = 0;
      for (int64_t e = 0; e < E; ++e) {
        bool taken = false;
        if (E <= 64) {
          taken = (chosen_lo >> e) & 1u;
        } else {
          for (int i = 0; i < j && !taken; ++i) taken = id[i] == e;
        }
        if (taken) continue;
        const T v = bias != nullptr ? sr[e] + bias[e] : sr[e];
        if (best < 0 || v > best_v) {
          best = static_cast<int32_t>(e);
          best_v = v;
        }
      }
      id[j] = best;
      if (E <= 64) chosen_lo |= uint64_t{1} << best;
      g[j] = sr[best];
    }
    if (normalize) {
      T sum = 0;
      for (int j = 0; j < k; ++j) sum += g[j];
      for (int j = 0; j < k; ++j) g[j] /= sum;
    }
  }
}

template <typename T>
void topk_gates_backward(const T* s, const int32_t* ids, const T* gates, const T* dgates, T* ds,
                         int64_t N, int64_t E, int k, bool normalize) {
#pragma omp parallel for if (N * E >= kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const T* sr = s + n * E;
    const int32_t* id = ids + n * k;
    const T* g = gates + n * k;
    const T* dg = dgates + n * k;
    T* out = ds + n * E;
    if (!normalize) {
      for (int j = 0; j < k; ++j) out[id[j]] += dg[j];
      continue;
    }
    T sum = 0, dot = 0;
    for (int j = 0; j < k; ++j) {
      sum += sr[id[j]];
      dot += dg[j] * g[j];
    }
    for (int j = 0; j < k; ++j) out[id[j]] += (dg[j] - dot) / sum;
  }
}

template <typename T>
void moe_aux_loss_forward(const T* s, const int32_t* ids, T* loss, T* coef, int64_t N, int64_t E,
                          int k, double weight, bool normalize_rows) {
  std::vector<int64_t> count(static_cast<size_t>(E), 0);
  for (int64_t i = 0; i < N * k; ++i) ++count[static_cast<size_t>(ids[i])];
  // P_e = mean_n p[n, e], summed row by row in order (each row normalized first if asked).
  std::vector<T> P(static_cast<size_t>(E), T(0));
  for (int64_t n = 0; n < N; ++n) {
    const T* sr = s + n * E;
    T inv = 1;
    if (normalize_rows) {
      T sum = 0;
      for (int64_t e = 0; e < E; ++e) sum += sr[e];
      inv = T(1) / sum;
    }
    for (int64_t e = 0; e < E; ++e) P[static_cast<size_t>(e)] += sr[e] * inv;
  }
  T total = 0;
  const T scale = static_cast<T>(weight * static_cast<double>(E));
  for (int64_t e = 0; e < E; ++e) {
    const T f = static_cast<T>(count[static_cast<size_t>(e)]) / static_cast<T>(N * k);
    coef[e] = scale * f / static_cast<T>(N);
    total += coef[e] * P[static_cast<size_t>(e)];
  }
  loss[0] = total;
}

template <typename T>
void moe_aux_loss_backward(const T* s, const T* coef, T dloss, T* ds, int64_t N, int64_t E,
                           bool normalize_rows) {
#pragma omp parallel for if (N * E >= kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const T* sr = s + n * E;
    T* out = ds + n * E;
    if (!normalize_rows) {
      for (int64_t e = 0; e < E; ++e) out[e] += dloss * coef[e];
      continue;
    }
    // p = s / S: dp/ds_j = (δ_ej − p_e) / S, so ds_j += (c_j − Σ_e c_e·p_e) / S.
    T sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += sr[e];
    T dot = 0;
    for (int64_t e = 0; e < E; ++e) dot += coef[e] * sr[e];
    dot /= sum;
    for (int64_t e = 0; e < E; ++e) out[e] += dloss * (coef[e] - dot) / sum;
  }
}

#define GTRON_ROUTER_INSTANTIATE(T)                                                               \
  template void router_scores_forward<T>(const T*, T*, int64_t, int64_t, MoeRouterKind);          \
  template void router_scores_backward<T>(const T*, const T*, T*, int64_t, int64_t,               \
                                          MoeRouterKind);                                         \
  template void topk_gates_forward<T>(const T*, const T*, int32_t*, T*, int64_t, int64_t, int,    \
                                      bool);                                                      \
  template void topk_gates_backward<T>(const T*, const int32_t*, const T*, const T*, T*, int64_t, \
                                       int64_t, int, bool);                                       \
  template void moe_aux_loss_forward<T>(const T*, const int32_t*, T*, T*, int64_t, int64_t, int,  \
                                        double, bool);                                            \
  template void moe_aux_loss_backward<T>(const T*, const T*, T, T*, int64_t, int64_t, bool);
GTRON_ROUTER_INSTANTIATE(float)
GTRON_ROUTER_INSTANTIATE(double)
#undef GTRON_ROUTER_INSTANTIATE

}  // namespace gtron::cpu

// CPU kernels of MoE dispatch and combine (Note [MoE dispatch order]): the plan is one counting
// sort; the row copies and sums run one token (or one permuted row) per thread iteration, each
// sum in slot order, so results are bit-identical across runs and thread counts.
#include <cstring>
#include <vector>

#include "model/check.h"
#include "model/ops/moe_dispatch.h"

namespace gtron::cpu {

namespace {
constexpr int64_t kParallelMin = 1 << 14;  // elements; below this a thread team costs more
}  // namespace

void moe_plan(const int32_t* ids, int64_t N, int k, int64_t E, int32_t* pos, int32_t* src,
              int32_t* offsets, int64_t* load) {
  std::vector<int32_t> count(static_cast<size_t>(E), 0);
  for (int64_t s = 0; s < N * k; ++s) {
    GTRON_CHECK(ids[s] >= 0 && ids[s] < E, "moe_plan: slot ", s, " routed to expert ", ids[s],
                " of ", E);
    ++count[static_cast<size_t>(ids[s])];
  }
  offsets[0] = 0;
  for (int64_t e = 0; e < E; ++e) offsets[e + 1] = offsets[e] + count[static_cast<size_t>(e)];
  if (load != nullptr) {
    for (int64_t e = 0; e < E; ++e) load[e] += count[static_cast<size_t>(e)];
  }
  // Slots in token order, each placed at its expert's cursor: stable by token within an expert.
  std::vector<int32_t> cursor(offsets, offsets + E);
  for (int64_t s = 0; s < N * k; ++s) {
    const int32_t r = cursor[static_cast<size_t>(ids[s])]++;
    pos[s] = r;
    src[r] = static_cast<int32_t>(s);
  }
}

template <typename T>
void moe_dispatch_forward(const T* x, const int32_t* src, T* xp, int64_t N, int k, int64_t C) {
#pragma omp parallel for if (N * k * C >= kParallelMin)
  for (int64_t r = 0; r < N * k; ++r) {
    std::memcpy(xp + r * C, x + static_cast<int64_t>(src[r] / k) * C, sizeof(T) * C);
  }
}

template <typename T>
void moe_dispatch_backward(const T* dxp, const int32_t* pos, T* dx, int64_t N, int k, int64_t C) {
#pragma omp parallel for if (N * k * C >= kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    T* out = dx + n * C;
    for (int j = 0; j < k; ++j) {
      const T* in = dxp + static_cast<int64_t>(pos[n * k + j]) * C;
      for (int64_t c = 0; c < C; ++c) out[c] += in[c];
    }
  }
}

template <typename T>
void moe_combine_forward(const T* yp, const T* gates, const int32_t* pos, T* y, int64_t N, int k,
                         int64_t C) {
#pragma omp parallel for if (N * k * C >= kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    T* out = y + n * C;
    for (int j = 0; j < k; ++j) {
      const T g = gates[n * k + j];
      const T* in = yp + static_cast<int64_t>(pos[n * k + j]) * C;
      if (j == 0) {
        for (int64_t c = 0; c < C; ++c) out[c] = g * in[c];
      } else {
        for (int64_t c = 0; c < C; ++c) out[c] += g * in[c];
      }
    }
  }
}

template <typename T>
void moe_combine_backward(const T* yp, const T* gates, const int32_t* pos, const T* dy, T* dyp,
                          T* dgates, int64_t N, int k, int64_t C) {
  // Each permuted row belongs to exactly one slot: the rows a token writes are its own.
#pragma omp parallel for if (N * k * C >= kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const T* d = dy + n * C;
    for (int j = 0; j < k; ++j) {
      const int64_t r = pos[n * k + j];
      if (dgates != nullptr) {
        const T* in = yp + r * C;
        T dot = 0;
        for (int64_t c = 0; c < C; ++c) dot += d[c] * in[c];
        dgates[n * k + j] += dot;
      }
      if (dyp != nullptr) {
        const T g = gates[n * k + j];
        T* out = dyp + r * C;
        for (int64_t c = 0; c < C; ++c) out[c] += g * d[c];
      }
    }
  }
}

#define GTRON_DISPATCH_INSTANTIATE(T)                                                          \
  template void moe_dispatch_forward<T>(const T*, const int32_t*, T*, int64_t, int, int64_t);  \
  template void moe_dispatch_backward<T>(const T*, const int32_t*, T*, int64_t, int, int64_t); \
  template void moe_combine_forward<T>(const T*, const T*, const int32_t*, T*, int64_t, int,   \
                                       int64_t);                                               \
  template void moe_combine_backward<T>(const T*, const T*, const int32_t*, const T*, T*, T*,  \
                                        int64_t, int, int64_t);
GTRON_DISPATCH_INSTANTIATE(float)
GTRON_DISPATCH_INSTANTIATE(double)
#undef GTRON_DISPATCH_INSTANTIATE

}  // namespace gtron::cpu

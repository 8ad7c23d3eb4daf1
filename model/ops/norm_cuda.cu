// layernorm and rmsnorm on CUDA. RMSNorm is LayerNorm without centering and without beta, so one
// kernel template (kLN) serves both.
//
// Rows: one warp per row, 8 rows per block. A lane walks its columns in packs (16-byte loads when
// C is a multiple of the pack and every pointer is aligned); the row is read three times (sum,
// centred sum of squares, output), the re-reads hitting L1/L2. Statistics are fp32, the variance
// two-pass as on the CPU, and the warp sums are xor butterflies (deterministic).
// Parameter gradients: fixed-order column sums (model/cuda/column_sum.cuh), never atomics.
#include <climits>

#include "model/cuda/column_sum.cuh"
#include "model/cuda/kernel_util.cuh"
#include "model/ops/norm.h"

namespace gtron::cuda {

namespace {

constexpr int kRowsPerBlock = 8;  // warps per block

// y = (x − mean)·rstd·gamma (+ beta); writes mean (LN only) and rstd per row.
template <typename T, typename P, int kV, bool kLN>
__global__ void norm_forward_kernel(const T* __restrict__ x, const P* __restrict__ gamma,
                                    const P* __restrict__ beta, T* __restrict__ y,
                                    float* __restrict__ mean, float* __restrict__ rstd, int64_t N,
                                    int C, float eps) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;  // whole warps leave together: the shuffles below see full warps
  const T* xr = x + row * C;
  float m = 0.0f;
  if constexpr (kLN) {
    float sum = 0.0f;
    for (int c = lane * kV; c < C; c += 32 * kV) {
      float v[kV];
      load_floats<kV>(xr + c, v);
#pragma unroll
      for (int k = 0; k < kV; ++k) sum += v[k];
    }
    m = warp_sum(sum) / static_cast<float>(C);
  }
  float sq = 0.0f;
  for (int c = lane * kV; c < C; c += 32 * kV) {
    float v[kV];
    load_floats<kV>(xr + c, v);
#pragma unroll
    for (int k = 0; k < kV; ++k) sq += (v[k] - m) * (v[k] - m);
  }
  const float r = 1.0f / sqrtf(warp_sum(sq) / static_cast<float>(C) + eps);
  for (int c = lane * kV; c < C; c += 32 * kV) {
    float v[kV], g[kV], out[kV];
    load_floats<kV>(xr + c, v);
    load_floats<kV>(gamma + c, g);
#pragma unroll
    for (int k = 0; k < kV; ++k) out[k] = (v[k] - m) * r * g[k];
    if constexpr (kLN) {
      float b[kV];
      load_floats<kV>(beta + c, b);
#pragma unroll
      for (int k = 0; k < kV; ++k) out[k] += b[k];
    }
    store_floats<kV>(y + row * C + c, out);
  }
  if (lane == 0) {
    if constexpr (kLN) mean[row] = m;
    rstd[row] = r;
  }
}

// With x̂ = (x − mean)·rstd and g = dy·gamma:
//   LN:  dx += rstd·(g − mean(g) − x̂·mean(g·x̂))      RMS: dx += rstd·(g − x̂·mean(g·x̂))
template <typename T, typename P, int kV, bool kLN>
__global__ void norm_backward_dx_kernel(const T* __restrict__ x, const P* __restrict__ gamma,
                                        const float* __restrict__ mean,
                                        const float* __restrict__ rstd, const T* __restrict__ dy,
                                        T* __restrict__ dx, int64_t N, int C) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const T* xr = x + row * C;
  const T* dyr = dy + row * C;
  const float m = kLN ? mean[row] : 0.0f;
  const float r = rstd[row];
  float sum_g = 0.0f, sum_gx = 0.0f;
  for (int c = lane * kV; c < C; c += 32 * kV) {
    float v[kV], d[kV], g[kV];
    load_floats<kV>(xr + c, v);
    load_floats<kV>(dyr + c, d);
    load_floats<kV>(gamma + c, g);
#pragma unroll
    for (int k = 0; k < kV; ++k) {
      const float gg = d[k] * g[k];
      sum_g += gg;
      sum_gx += gg * ((v[k] - m) * r);
    }
  }
  const float mean_g = kLN ? warp_sum(sum_g) / static_cast<float>(C) : 0.0f;
  const float mean_gx = warp_sum(sum_gx) / static_cast<float>(C);
  for (int c = lane * kV; c < C; c += 32 * kV) {
    float v[kV], d[kV], g[kV], out[kV];
    load_floats<kV>(xr + c, v);
    load_floats<kV>(dyr + c, d);
    load_floats<kV>(gamma + c, g);
#pragma unroll
    for (int k = 0; k < kV; ++k) {
      const float xhat = (v[k] - m) * r;
      out[k] = r * (d[k] * g[k] - mean_g - xhat * mean_gx);
    }
    add_floats<kV>(dx + row * C + c, out);
  }
}

// Column-sum terms: dgamma += dy·x̂ and (LN) dbeta += dy.
template <typename T, bool kLN>
struct NormParamTerm {
  const T* x;
  const T* dy;
  const float* mean;
  const float* rstd;
  int64_t C;
  __device__ void operator()(int64_t r, int64_t c, float (&t)[kLN ? 2 : 1]) const {
    const float d = to_float(dy[r * C + c]);
    const float m = kLN ? mean[r] : 0.0f;
    t[0] = d * ((to_float(x[r * C + c]) - m) * rstd[r]);
    if constexpr (kLN) t[1] = d;
  }
};

template <typename T, typename P, bool kLN>
void launch_forward(const void* x, const void* gamma, const void* beta, void* y, float* mean,
                    float* rstd, int64_t N, int64_t C, double eps, void* stream) {
  constexpr int kV = kPack<T>;
  const auto* xp = static_cast<const T*>(x);
  const auto* gp = static_cast<const P*>(gamma);
  const auto* bp = static_cast<const P*>(beta);
  auto* yp = static_cast<T*>(y);
  const auto blocks = static_cast<unsigned>(ceil_div<int64_t>(N, kRowsPerBlock));
  auto st = static_cast<cudaStream_t>(stream);
  const int c = static_cast<int>(C);
  const float e = static_cast<float>(eps);
  if (C % kV == 0 && is_aligned(x, 16) && is_aligned(y, 16) && is_aligned(gamma, sizeof(P) * kV) &&
      is_aligned(beta, sizeof(P) * kV)) {
    norm_forward_kernel<T, P, kV, kLN>
        <<<blocks, kRowsPerBlock * 32, 0, st>>>(xp, gp, bp, yp, mean, rstd, N, c, e);
  } else {
    norm_forward_kernel<T, P, 1, kLN>
        <<<blocks, kRowsPerBlock * 32, 0, st>>>(xp, gp, bp, yp, mean, rstd, N, c, e);
  }
  CUDA_CHECK_LAUNCH();
}

template <typename T, typename P, bool kLN>
void launch_backward(const void* x, const void* gamma, const float* mean, const float* rstd,
                     const void* dy, void* dx, float* dgamma, float* dbeta, float* scratch,
                     int64_t N, int64_t C, void* stream) {
  constexpr int kV = kPack<T>;
  const auto* xp = static_cast<const T*>(x);
  const auto* gp = static_cast<const P*>(gamma);
  const auto* dyp = static_cast<const T*>(dy);
  auto st = static_cast<cudaStream_t>(stream);
  if (dx != nullptr) {
    auto* dxp = static_cast<T*>(dx);
    const auto blocks = static_cast<unsigned>(ceil_div<int64_t>(N, kRowsPerBlock));
    const int c = static_cast<int>(C);
    if (C % kV == 0 && is_aligned(x, 16) && is_aligned(dy, 16) && is_aligned(dx, 16) &&
        is_aligned(gamma, sizeof(P) * kV)) {
      norm_backward_dx_kernel<T, P, kV, kLN>
          <<<blocks, kRowsPerBlock * 32, 0, st>>>(xp, gp, mean, rstd, dyp, dxp, N, c);
    } else {
      norm_backward_dx_kernel<T, P, 1, kLN>
          <<<blocks, kRowsPerBlock * 32, 0, st>>>(xp, gp, mean, rstd, dyp, dxp, N, c);
    }
    CUDA_CHECK_LAUNCH();
  }
  column_sums<kLN ? 2 : 1>(NormParamTerm<T, kLN>{xp, dyp, mean, rstd, C}, N, C, scratch, dgamma,
                           dbeta, st);
}

void check_sizes(const char* op, int64_t N, int64_t C) {
  GTRON_CHECK(N >= 0 && C >= 0 && C <= INT_MAX, op, ": ", N, " rows of ", C, " columns");
}

}  // namespace

void layernorm_forward(const void* x, const void* gamma, const void* beta, DType param, void* y,
                       float* mean, float* rstd, int64_t N, int64_t C, double eps, DType act,
                       void* stream) {
  check_sizes("layernorm", N, C);
  if (N == 0 || C == 0) return;
  dispatch_act_param("layernorm", act, param, [&](auto t, auto p) {
    launch_forward<decltype(t), decltype(p), true>(x, gamma, beta, y, mean, rstd, N, C, eps,
                                                   stream);
  });
}

int64_t layernorm_backward_scratch_floats(int64_t N, int64_t C) {
  return column_scratch_floats(N, C, 2);
}

int64_t rmsnorm_backward_scratch_floats(int64_t N, int64_t C) {
  return column_scratch_floats(N, C, 1);
}

void layernorm_backward(const void* x, const void* gamma, DType param, const float* mean,
                        const float* rstd, const void* dy, void* dx, float* dgamma, float* dbeta,
                        float* scratch, int64_t N, int64_t C, DType act, void* stream) {
  check_sizes("layernorm", N, C);
  if (N == 0 || C == 0) return;
  dispatch_act_param("layernorm", act, param, [&](auto t, auto p) {
    launch_backward<decltype(t), decltype(p), true>(x, gamma, mean, rstd, dy, dx, dgamma, dbeta,
                                                    scratch, N, C, stream);
  });
}

void rmsnorm_forward(const void* x, const void* gamma, DType param, void* y, float* rrms, int64_t N,
                     int64_t C, double eps, DType act, void* stream) {
  check_sizes("rmsnorm", N, C);
  if (N == 0 || C == 0) return;
  dispatch_act_param("rmsnorm", act, param, [&](auto t, auto p) {
    launch_forward<decltype(t), decltype(p), false>(x, gamma, nullptr, y, nullptr, rrms, N, C, eps,
                                                    stream);
  });
}

void rmsnorm_backward(const void* x, const void* gamma, DType param, const float* rrms,
                      const void* dy, void* dx, float* dgamma, float* scratch, int64_t N, int64_t C,
                      DType act, void* stream) {
  check_sizes("rmsnorm", N, C);
  if (N == 0 || C == 0) return;
  dispatch_act_param("rmsnorm", act, param, [&](auto t, auto p) {
    launch_backward<decltype(t), decltype(p), false>(x, gamma, nullptr, rrms, dy, dx, dgamma,
                                                     nullptr, scratch, N, C, stream);
  });
}

}  // namespace gtron::cuda

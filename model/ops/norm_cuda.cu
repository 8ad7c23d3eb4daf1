// layernorm and rmsnorm on CUDA. RMSNorm is LayerNorm without centering and without beta, so one
// kernel template (kLN) serves both.
//
// Rows: one warp per row, 8 rows per block. A lane walks its columns in packs (16-byte loads when
// C is a multiple of the pack and every pointer is aligned); the row is read three times (sum,
// centred sum of squares, output), the re-reads hitting L1/L2. Statistics are fp32, the variance
// two-pass as on the CPU, and the warp sums are xor butterflies (deterministic).
// Parameter gradients: fixed-order sums, never atomics — in the same pass as dx where the row fits
// a warp's registers (Note [one-pass norm backward]), else two-pass column sums
// (model/cuda/column_sum.cuh).
//
// Note [one-pass norm backward]
// The backward reads x and dy once for dx, dgamma and dbeta together. Block b owns the rows
// [b·R, (b+1)·R), R = norm_chunk_rows(N) (a multiple of 8, at least 16, so at most 256 blocks:
// for N = 16384, 64 rows a block and 256 blocks, one wave at two blocks per SM); warp w takes rows
// w, w + 8, ... of them. A lane keeps its columns of the row in registers (kPacks packs of kV:
// columns (lane + 32·j)·kV + e, as the dx-only kernel walks them), so dx is formed from one read
// of x and dy, with the expressions of norm_backward_dx_kernel in the same order, while the lane
// accumulates dy·x̂ and dy of its columns over the warp's rows in fixed order. At the end the 8
// warps' sums meet in a fixed tree (warps 4..7 into 0..3, then 2..3 into 0..1, then 1 into 0)
// through shared memory, and warp 0 writes the block's partial[k][b][c]. The last blocks to
// arrive add the ≤ 256 partials of each column in the fixed tree of Note [one-pass column sums]
// (Note [one-launch column finish], model/cuda/column_sum.cuh). Covered:
// rows of at most 4 packs a lane (bf16 C <= 1024, f32 C <= 512, 16-byte aligned) or, unaligned or
// C not a multiple of the pack, at most 8 elements a lane (C <= 256); other shapes take the dx
// kernel plus the two-pass column sums. Registers bound the coverage: with bf16 rows LayerNorm
// at 3 packs a lane (C = 768) fits 128 registers without spills (two blocks per SM), at 4 packs
// it takes ~180 (one block per SM), and 6 packs would take ~240.
#include <algorithm>
#include <climits>
#include <type_traits>

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

constexpr int kFusedMaxPacks = 4;      // packs a lane holds (16-byte path)
constexpr int kFusedScalarElems = 8;   // elements a lane holds (one-element path)
constexpr int64_t kFusedMinRows = 16;  // rows per block at least
constexpr int64_t kFusedMaxBlocks = 256;

int64_t norm_chunk_rows(int64_t N) {
  const int64_t rows = std::max(kFusedMinRows, ceil_div<int64_t>(N, kFusedMaxBlocks));
  return ceil_div<int64_t>(rows, kRowsPerBlock) * kRowsPerBlock;
}

int64_t norm_chunks(int64_t N) { return ceil_div<int64_t>(N, norm_chunk_rows(N)); }

// dx (+)= the dx kernel's formula, and partial[k][blockIdx.x][c] = the block's Σ dy·x̂ (k = 0) and
// Σ dy (k = 1, LN) over its rows (Note [one-pass norm backward]). dx may be null.
template <typename T, typename P, int kV, int kPacks, bool kLN>
__global__ void __launch_bounds__(kRowsPerBlock * 32, kPacks* kV <= 24 ? 2 : 1)
    norm_backward_fused_kernel(const T* __restrict__ x, const P* __restrict__ gamma,
                               const float* __restrict__ mean, const float* __restrict__ rstd,
                               const T* __restrict__ dy, T* __restrict__ dx, int64_t N, int C,
                               int64_t rows_per_block, float* __restrict__ partial,
                               ColumnFinish fin) {
  constexpr int K = kLN ? 2 : 1;
  constexpr int kE = kPacks * kV;  // columns a lane owns
  __shared__ float slots[kRowsPerBlock / 2][K][kE][32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * rows_per_block;
  const int64_t r1 = r0 + rows_per_block < N ? r0 + rows_per_block : N;
  float acc[K][kE];
#pragma unroll
  for (int k = 0; k < K; ++k)
#pragma unroll
    for (int e = 0; e < kE; ++e) acc[k][e] = 0.0f;
  for (int64_t row = r0 + warp; row < r1; row += kRowsPerBlock) {  // warp-uniform
    const float m = kLN ? mean[row] : 0.0f;
    const float r = rstd[row];
    Pack<T, kV> xs[kPacks], ds[kPacks];
#pragma unroll
    for (int j = 0; j < kPacks; ++j) {
      const int c = (lane + 32 * j) * kV;
      if (c < C) {
        xs[j] = *reinterpret_cast<const Pack<T, kV>*>(x + row * C + c);
        ds[j] = *reinterpret_cast<const Pack<T, kV>*>(dy + row * C + c);
      }
    }
    float sum_g = 0.0f, sum_gx = 0.0f;
#pragma unroll
    for (int j = 0; j < kPacks; ++j) {
      const int c = (lane + 32 * j) * kV;
      if (c >= C) continue;
      float g[kV];
      load_floats<kV>(gamma + c, g);
#pragma unroll
      for (int e = 0; e < kV; ++e) {
        const float d = to_float(ds[j].v[e]);
        const float xhat = (to_float(xs[j].v[e]) - m) * r;
        const float gg = d * g[e];
        sum_g += gg;
        sum_gx += gg * xhat;
        acc[0][j * kV + e] += d * xhat;
        if constexpr (kLN) acc[K - 1][j * kV + e] += d;
      }
    }
    if (dx == nullptr) continue;
    const float mean_g = kLN ? warp_sum(sum_g) / static_cast<float>(C) : 0.0f;
    const float mean_gx = warp_sum(sum_gx) / static_cast<float>(C);
#pragma unroll
    for (int j = 0; j < kPacks; ++j) {
      const int c = (lane + 32 * j) * kV;
      if (c >= C) continue;
      float g[kV], out[kV];
      load_floats<kV>(gamma + c, g);
#pragma unroll
      for (int e = 0; e < kV; ++e) {
        const float xhat = (to_float(xs[j].v[e]) - m) * r;
        out[e] = r * (to_float(ds[j].v[e]) * g[e] - mean_g - xhat * mean_gx);
      }
      add_floats<kV>(dx + row * C + c, out);
    }
  }
  // The fixed tree over the warps: 4..7 into 0..3, 2..3 into 0..1, 1 into 0.
#pragma unroll
  for (int h = kRowsPerBlock / 2; h > 0; h /= 2) {
    if (warp >= h && warp < 2 * h) {
#pragma unroll
      for (int k = 0; k < K; ++k)
#pragma unroll
        for (int e = 0; e < kE; ++e) slots[warp - h][k][e][lane] = acc[k][e];
    }
    __syncthreads();
    if (warp < h) {
#pragma unroll
      for (int k = 0; k < K; ++k)
#pragma unroll
        for (int e = 0; e < kE; ++e) acc[k][e] += slots[warp][k][e][lane];
    }
    __syncthreads();
  }
#pragma unroll
  for (int j = 0; j < kPacks; ++j) {
    const int c = (lane + 32 * j) * kV;
    if (warp != 0 || c >= C) continue;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      float out[kV];
#pragma unroll
      for (int e = 0; e < kV; ++e) out[e] = acc[k][j * kV + e];
      store_floats<kV>(partial + (k * static_cast<int64_t>(gridDim.x) + blockIdx.x) * C + c, out);
    }
  }
  finish_columns<K>(fin, partial, gridDim.x, C, 0, gridDim.x, 0, C);
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

// The one-pass backward (Note [one-pass norm backward]) with kPacks packs of kV a lane, then the
// finish of the partials into dgamma and dbeta.
template <typename T, typename P, int kV, int kPacks, bool kLN>
void launch_fused(const T* x, const P* gamma, const float* mean, const float* rstd, const T* dy,
                  T* dx, float* dgamma, float* dbeta, float* scratch, int64_t N, int64_t C,
                  cudaStream_t st) {
  static_assert(kRowsPerBlock * 32 == kFinishThreads, "norm backward: the finish's block size");
  const int64_t chunks = norm_chunks(N);
  const ColumnFinish fin = plan_column_finish(kLN ? 2 : 1, 1, chunks, C, dgamma, dbeta, st);
  norm_backward_fused_kernel<T, P, kV, kPacks, kLN>
      <<<static_cast<unsigned>(chunks), kRowsPerBlock * 32, 0, st>>>(
          x, gamma, mean, rstd, dy, dx, N, static_cast<int>(C), norm_chunk_rows(N), scratch, fin);
  CUDA_CHECK_LAUNCH();
  finish_unless_fused<kLN ? 2 : 1>(fin, scratch, chunks, C, st);
}

// Runs the one-pass backward if the shape is covered (see the note); false: not launched.
template <typename T, typename P, bool kLN>
bool try_fused_backward(const T* x, const P* gamma, const float* mean, const float* rstd,
                        const T* dy, T* dx, float* dgamma, float* dbeta, float* scratch, int64_t N,
                        int64_t C, cudaStream_t st) {
  constexpr int kV = kPack<T>;
  const bool packed = C % kV == 0 && is_aligned(x, 16) && is_aligned(dy, 16) &&
                      is_aligned(dx, 16) && is_aligned(gamma, sizeof(P) * kV);
  auto run = [&](auto v, auto packs) {
    launch_fused<T, P, decltype(v)::value, decltype(packs)::value, kLN>(
        x, gamma, mean, rstd, dy, dx, dgamma, dbeta, scratch, N, C, st);
    return true;
  };
  using Vec = std::integral_constant<int, kV>;
  using One = std::integral_constant<int, 1>;
  if (packed) {
    switch (ceil_div<int64_t>(C / kV, 32)) {
      case 1:
        return run(Vec{}, std::integral_constant<int, 1>{});
      case 2:
        return run(Vec{}, std::integral_constant<int, 2>{});
      case 3:
        return run(Vec{}, std::integral_constant<int, 3>{});
      case 4:
        return run(Vec{}, std::integral_constant<int, kFusedMaxPacks>{});
      default:
        return false;
    }
  }
  if (C > 32 * kFusedScalarElems) return false;
  return run(One{}, std::integral_constant<int, kFusedScalarElems>{});
}

template <typename T, typename P, bool kLN>
void launch_backward(const void* x, const void* gamma, const float* mean, const float* rstd,
                     const void* dy, void* dx, float* dgamma, float* dbeta, float* scratch,
                     int64_t N, int64_t C, void* stream) {
  constexpr int kV = kPack<T>;
  const auto* xp = static_cast<const T*>(x);
  const auto* gp = static_cast<const P*>(gamma);
  const auto* dyp = static_cast<const T*>(dy);
  auto* dxp = static_cast<T*>(dx);
  auto st = static_cast<cudaStream_t>(stream);
  if ((dgamma != nullptr || dbeta != nullptr) &&
      try_fused_backward<T, P, kLN>(xp, gp, mean, rstd, dyp, dxp, dgamma, dbeta, scratch, N, C,
                                    st)) {
    return;
  }
  if (dx != nullptr) {
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

// Either path's partials: the one-pass kernel's [K][norm_chunks(N)][C] or the column sums'.
int64_t layernorm_backward_scratch_floats(int64_t N, int64_t C) {
  return std::max(column_scratch_floats(N, C, 2), 2 * norm_chunks(N) * C);
}

int64_t rmsnorm_backward_scratch_floats(int64_t N, int64_t C) {
  return std::max(column_scratch_floats(N, C, 1), norm_chunks(N) * C);
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

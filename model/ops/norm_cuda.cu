// layernorm and rmsnorm on CUDA. RMSNorm is LayerNorm without centering and without beta, so one
// kernel template (kLN) serves both.
//
// Rows: one warp per row, 8 rows per block. A lane walks its columns in packs (16-byte loads when
// C is a multiple of the pack and every pointer is aligned); the row is read three times (sum,
// centred sum of squares, output), the re-reads hitting L1/L2. Statistics are fp32, the variance
// two-pass as on the CPU, and the warp sums are xor butterflies (deterministic).
// The residual add before a LayerNorm rides in the same row pass, forward and backward
// (Note [fused residual add and LayerNorm], model/ops/add_norm.h).
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
// through shared memory, and warp 0 writes the block's partial[k][b][c]. column_tree_finish
// (Note [one-pass column sums]) adds the ≤ 256 partials of each column in its fixed tree. Covered:
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
#include "model/ops/add.h"
#include "model/ops/add_norm.h"
#include "model/ops/norm.h"

namespace gtron::cuda {

namespace {

constexpr int kRowsPerBlock = 8;  // warps per block

// Where a forward row comes from: first() on the first visit of each column pack, again() on the
// later two (Note [fused residual add and LayerNorm]).
template <typename T, int kV>
struct PlainRow {  // the row of x
  const T* x;
  __device__ void first(int c, float (&v)[kV]) const { load_floats<kV>(x + c, v); }
  __device__ void again(int c, float (&v)[kV]) const { load_floats<kV>(x + c, v); }
};

template <typename T, int kV>
struct SumRow {  // h = x + a, rounded to T as add's kernel rounds it; first() also stores h
  const T* x;
  const T* a;
  T* h;
  __device__ void again(int c, float (&v)[kV]) const {
    float w[kV];
    load_floats<kV>(x + c, v);
    load_floats<kV>(a + c, w);
#pragma unroll
    for (int k = 0; k < kV; ++k) v[k] = to_float(from_float<T>(v[k] + w[k]));
  }
  __device__ void first(int c, float (&v)[kV]) const {
    again(c, v);
    store_floats<kV>(h + c, v);
  }
};

// One warp normalizes one row: y = (v − mean)·rstd·gamma (+ beta) of the row `src` yields;
// returns mean (0 for RMS) and rstd in *m and *r (every lane).
template <typename T, typename P, int kV, bool kLN, typename Row>
__device__ __forceinline__ void norm_row_forward(const Row& src, const P* __restrict__ gamma,
                                                 const P* __restrict__ beta, T* __restrict__ yr,
                                                 int C, float eps, int lane, float* m, float* r) {
  float mu = 0.0f;
  if constexpr (kLN) {
    float sum = 0.0f;
    for (int c = lane * kV; c < C; c += 32 * kV) {
      float v[kV];
      src.first(c, v);
#pragma unroll
      for (int k = 0; k < kV; ++k) sum += v[k];
    }
    mu = warp_sum(sum) / static_cast<float>(C);
  }
  float sq = 0.0f;
  for (int c = lane * kV; c < C; c += 32 * kV) {
    float v[kV];
    if constexpr (kLN) {
      src.again(c, v);
    } else {
      src.first(c, v);
    }
#pragma unroll
    for (int k = 0; k < kV; ++k) sq += (v[k] - mu) * (v[k] - mu);
  }
  const float rs = 1.0f / sqrtf(warp_sum(sq) / static_cast<float>(C) + eps);
  for (int c = lane * kV; c < C; c += 32 * kV) {
    float v[kV], g[kV], out[kV];
    src.again(c, v);
    load_floats<kV>(gamma + c, g);
#pragma unroll
    for (int k = 0; k < kV; ++k) out[k] = (v[k] - mu) * rs * g[k];
    if constexpr (kLN) {
      float b[kV];
      load_floats<kV>(beta + c, b);
#pragma unroll
      for (int k = 0; k < kV; ++k) out[k] += b[k];
    }
    store_floats<kV>(yr + c, out);
  }
  *m = mu;
  *r = rs;
}

// y = (x − mean)·rstd·gamma (+ beta); writes mean (LN only) and rstd per row.
template <typename T, typename P, int kV, bool kLN>
__global__ void norm_forward_kernel(const T* __restrict__ x, const P* __restrict__ gamma,
                                    const P* __restrict__ beta, T* __restrict__ y,
                                    float* __restrict__ mean, float* __restrict__ rstd, int64_t N,
                                    int C, float eps) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;  // whole warps leave together: the shuffles below see full warps
  float m, r;
  norm_row_forward<T, P, kV, kLN>(PlainRow<T, kV>{x + row * C}, gamma, beta, y + row * C, C, eps,
                                  lane, &m, &r);
  if (lane == 0) {
    if constexpr (kLN) mean[row] = m;
    rstd[row] = r;
  }
}

// h = x + a and y = layernorm(h) (Note [fused residual add and LayerNorm]).
template <typename T, typename P, int kV>
__global__ void add_norm_forward_kernel(const T* __restrict__ x, const T* __restrict__ a,
                                        T* __restrict__ h, const P* __restrict__ gamma,
                                        const P* __restrict__ beta, T* __restrict__ y,
                                        float* __restrict__ mean, float* __restrict__ rstd,
                                        int64_t N, int C, float eps) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  float m, r;
  norm_row_forward<T, P, kV, true>(SumRow<T, kV>{x + row * C, a + row * C, h + row * C}, gamma,
                                   beta, y + row * C, C, eps, lane, &m, &r);
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

// dx[0, kV) += out. kAlso: the sum, once rounded, is also written to (also_add: added into) `also`
// — the residual gradient's second consumer (Note [fused residual add and LayerNorm]).
// The sum is read back as stored (this thread's own write), so dx's arithmetic is add_floats'
// whether or not `also` rides along.
template <bool kAlso, int kV, typename T>
__device__ __forceinline__ void write_dx(T* dx, T* also, bool also_add, int64_t i,
                                         const float (&out)[kV]) {
  add_floats<kV>(dx + i, out);
  if constexpr (kAlso) {
    float sum[kV];
    load_floats<kV>(dx + i, sum);
    if (also_add) {
      add_floats<kV>(also + i, sum);
    } else {
      store_floats<kV>(also + i, sum);
    }
  }
}

// With x̂ = (x − mean)·rstd and g = dy·gamma:
//   LN:  dx += rstd·(g − mean(g) − x̂·mean(g·x̂))      RMS: dx += rstd·(g − x̂·mean(g·x̂))
template <typename T, typename P, int kV, bool kLN, bool kAlso>
__global__ void norm_backward_dx_kernel(const T* __restrict__ x, const P* __restrict__ gamma,
                                        const float* __restrict__ mean,
                                        const float* __restrict__ rstd, const T* __restrict__ dy,
                                        T* __restrict__ dx, T* __restrict__ also, bool also_add,
                                        int64_t N, int C) {
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
    write_dx<kAlso>(dx, also, also_add, row * C + c, out);
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
template <typename T, typename P, int kV, int kPacks, bool kLN, bool kAlso>
__global__ void __launch_bounds__(kRowsPerBlock * 32, kPacks* kV <= 24 ? 2 : 1)
    norm_backward_fused_kernel(const T* __restrict__ x, const P* __restrict__ gamma,
                               const float* __restrict__ mean, const float* __restrict__ rstd,
                               const T* __restrict__ dy, T* __restrict__ dx, T* __restrict__ also,
                               bool also_add, int64_t N, int C, int64_t rows_per_block,
                               float* __restrict__ partial) {
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
      write_dx<kAlso>(dx, also, also_add, row * C + c, out);
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
  if (warp != 0) return;
#pragma unroll
  for (int j = 0; j < kPacks; ++j) {
    const int c = (lane + 32 * j) * kV;
    if (c >= C) continue;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      float out[kV];
#pragma unroll
      for (int e = 0; e < kV; ++e) out[e] = acc[k][j * kV + e];
      store_floats<kV>(partial + (k * static_cast<int64_t>(gridDim.x) + blockIdx.x) * C + c, out);
    }
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

// y = norm(x); or, with `a` (LN only), h = x + a and y = layernorm(h). The pack width is the one
// the plain norm takes on its rows (x, or h: so the statistics sum in the same order, Note [fused
// residual add and LayerNorm]); x or a unaligned where h is not: add's kernel, then the norm's.
template <typename T, typename P, bool kLN>
void launch_forward(const void* x, const void* gamma, const void* beta, void* y, float* mean,
                    float* rstd, int64_t N, int64_t C, double eps, void* stream,
                    const void* a = nullptr, void* h = nullptr) {
  constexpr int kV = kPack<T>;
  const bool packed = C % kV == 0 && is_aligned(a ? h : x, 16) && is_aligned(y, 16) &&
                      is_aligned(gamma, sizeof(P) * kV) && is_aligned(beta, sizeof(P) * kV);
  if (a != nullptr && packed && !(is_aligned(x, 16) && is_aligned(a, 16))) {
    add_forward(x, a, h, N * C, std::is_same_v<T, float> ? DType::kF32 : DType::kBF16, stream);
    x = h;
    a = nullptr;
  }
  const auto* xp = static_cast<const T*>(x);
  const auto* gp = static_cast<const P*>(gamma);
  const auto* bp = static_cast<const P*>(beta);
  auto* yp = static_cast<T*>(y);
  const auto blocks = static_cast<unsigned>(ceil_div<int64_t>(N, kRowsPerBlock));
  auto st = static_cast<cudaStream_t>(stream);
  const int c = static_cast<int>(C);
  const float e = static_cast<float>(eps);
  auto run = [&](auto v) {
    constexpr int kW = decltype(v)::value;
    if constexpr (kLN) {
      if (a != nullptr) {
        add_norm_forward_kernel<T, P, kW><<<blocks, kRowsPerBlock * 32, 0, st>>>(
            xp, static_cast<const T*>(a), static_cast<T*>(h), gp, bp, yp, mean, rstd, N, c, e);
        return;
      }
    }
    norm_forward_kernel<T, P, kW, kLN>
        <<<blocks, kRowsPerBlock * 32, 0, st>>>(xp, gp, bp, yp, mean, rstd, N, c, e);
  };
  if (packed) {
    run(std::integral_constant<int, kV>{});
  } else {
    run(std::integral_constant<int, 1>{});
  }
  CUDA_CHECK_LAUNCH();
}

// The second consumer of dx in the fused residual backward (kAlso): written, or added into.
template <typename T>
struct DxAlso {
  T* p = nullptr;
  bool add = false;
};

// Whether the backward kernels take 16-byte packs (else one element at a time).
template <typename T, typename P>
bool packed_backward(const void* x, const void* dy, const void* dx, const void* gamma, int64_t C) {
  return C % kPack<T> == 0 && is_aligned(x, 16) && is_aligned(dy, 16) && is_aligned(dx, 16) &&
         is_aligned(gamma, sizeof(P) * kPack<T>);
}

// The one-pass backward (Note [one-pass norm backward]) with kPacks packs of kV a lane, then the
// finish of the partials into dgamma and dbeta.
template <typename T, typename P, int kV, int kPacks, bool kLN, bool kAlso>
void launch_fused(const T* x, const P* gamma, const float* mean, const float* rstd, const T* dy,
                  T* dx, DxAlso<T> also, float* dgamma, float* dbeta, float* scratch, int64_t N,
                  int64_t C, cudaStream_t st) {
  const int64_t chunks = norm_chunks(N);
  norm_backward_fused_kernel<T, P, kV, kPacks, kLN, kAlso>
      <<<static_cast<unsigned>(chunks), kRowsPerBlock * 32, 0, st>>>(
          x, gamma, mean, rstd, dy, dx, also.p, also.add, N, static_cast<int>(C),
          norm_chunk_rows(N), scratch);
  CUDA_CHECK_LAUNCH();
  column_tree_finish<kLN ? 2 : 1>(scratch, chunks, C, dgamma, dbeta, st);
}

// Runs the one-pass backward if the shape is covered (see the note); false: not launched.
template <typename T, typename P, bool kLN, bool kAlso>
bool try_fused_backward(const T* x, const P* gamma, const float* mean, const float* rstd,
                        const T* dy, T* dx, DxAlso<T> also, float* dgamma, float* dbeta,
                        float* scratch, int64_t N, int64_t C, cudaStream_t st) {
  constexpr int kV = kPack<T>;
  auto run = [&](auto v, auto packs) {
    launch_fused<T, P, decltype(v)::value, decltype(packs)::value, kLN, kAlso>(
        x, gamma, mean, rstd, dy, dx, also, dgamma, dbeta, scratch, N, C, st);
    return true;
  };
  using Vec = std::integral_constant<int, kV>;
  using One = std::integral_constant<int, 1>;
  if (packed_backward<T, P>(x, dy, dx, gamma, C)) {
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

template <typename T, typename P, bool kLN, bool kAlso = false>
void launch_backward(const void* x, const void* gamma, const float* mean, const float* rstd,
                     const void* dy, void* dx, float* dgamma, float* dbeta, float* scratch,
                     int64_t N, int64_t C, void* stream, DxAlso<T> also = {}) {
  constexpr int kV = kPack<T>;
  const auto* xp = static_cast<const T*>(x);
  const auto* gp = static_cast<const P*>(gamma);
  const auto* dyp = static_cast<const T*>(dy);
  auto* dxp = static_cast<T*>(dx);
  auto st = static_cast<cudaStream_t>(stream);
  if ((dgamma != nullptr || dbeta != nullptr) &&
      try_fused_backward<T, P, kLN, kAlso>(xp, gp, mean, rstd, dyp, dxp, also, dgamma, dbeta,
                                           scratch, N, C, st)) {
    return;
  }
  if (dx != nullptr) {
    const auto blocks = static_cast<unsigned>(ceil_div<int64_t>(N, kRowsPerBlock));
    const int c = static_cast<int>(C);
    if (packed_backward<T, P>(x, dy, dx, gamma, C)) {
      norm_backward_dx_kernel<T, P, kV, kLN, kAlso><<<blocks, kRowsPerBlock * 32, 0, st>>>(
          xp, gp, mean, rstd, dyp, dxp, also.p, also.add, N, c);
    } else {
      norm_backward_dx_kernel<T, P, 1, kLN, kAlso><<<blocks, kRowsPerBlock * 32, 0, st>>>(
          xp, gp, mean, rstd, dyp, dxp, also.p, also.add, N, c);
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

void add_layernorm_forward(const void* x, const void* a, const void* gamma, const void* beta,
                           DType param, void* h, void* y, float* mean, float* rstd, int64_t N,
                           int64_t C, double eps, DType act, void* stream) {
  check_sizes("add_layernorm", N, C);
  if (N == 0 || C == 0) return;
  dispatch_act_param("add_layernorm", act, param, [&](auto t, auto p) {
    launch_forward<decltype(t), decltype(p), true>(x, gamma, beta, y, mean, rstd, N, C, eps, stream,
                                                   a, h);
  });
}

void add_layernorm_backward(const void* h, const void* gamma, DType param, const float* mean,
                            const float* rstd, const void* dy, void* dh, void* also, bool also_add,
                            float* dgamma, float* dbeta, float* scratch, int64_t N, int64_t C,
                            DType act, void* stream) {
  check_sizes("add_layernorm", N, C);
  if (N == 0 || C == 0) return;
  GTRON_CHECK(dh != nullptr && dh != also, "add_layernorm backward: dh must be its own buffer");
  dispatch_act_param("add_layernorm", act, param, [&](auto t, auto p) {
    using T = decltype(t);
    using P = decltype(p);
    // Folded where the pack width allows (an unaligned `also` under 16-byte packs: a second pass).
    if (also != nullptr && (is_aligned(also, 16) || !packed_backward<T, P>(h, dy, dh, gamma, C))) {
      launch_backward<T, P, true, true>(h, gamma, mean, rstd, dy, dh, dgamma, dbeta, scratch, N, C,
                                        stream, DxAlso<T>{static_cast<T*>(also), also_add});
      return;
    }
    launch_backward<T, P, true>(h, gamma, mean, rstd, dy, dh, dgamma, dbeta, scratch, N, C, stream);
    if (also == nullptr) return;
    if (also_add) {
      accumulate(also, dh, N * C, act, stream);
    } else {
      CUDA_CHECK(cudaMemcpyAsync(also, dh, static_cast<size_t>(N * C) * sizeof(T),
                                 cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(stream)));
    }
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

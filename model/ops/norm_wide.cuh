// The norm backward's kernels for rows past the one-pass kernel's reach (bf16 C above 1024: GPT-2
// 774M and 1.5B, head size 128, Llama-3.2-1B), launched by model/ops/norm_cuda.cu: dx from
// registers in one round trip (Note [resident norm dx]) and the first pass of the parameter
// gradients' column sums in 16-byte packs (Note [packed norm parameter partials]). Both give the
// bits of the reference kernels in norm_cuda.cu, which stay the path under
// cuda::set_norm_fast(false).
#pragma once

#include <cstdint>

#include "model/cuda/column_sum.cuh"
#include "model/cuda/kernel_util.cuh"
#include "model/ops/norm_backward.cuh"
#include "model/ops/norm_cuda.cuh"

namespace gtron::cuda {
namespace {

// Note [resident norm dx]
// Rows wider than the one-pass kernel covers (bf16 C up to 2048 here, 6-8 packs a lane: GPT-2
// 774M and 1.5B, head size 128 at C = 1536, Llama-3.2-1B) run the dx kernel and the two-pass
// column sums. The loop kernel (norm_backward_dx_kernel in norm_cuda.cu) waits on memory once per
// pack for the sums, reads x, dy and gamma again for dx and then waits on dx before adding: on the
// H100 at C = 1536, N = 16384 it moved x, dy and dx at about 2 TB/s. This one holds the lane's
// packs of x and dy in registers and loads the dx it adds into with them, so a row costs one round
// trip (1.87 ms a step against 2.45 at that shape, 25 norms a step; with the packed partials below
// the step went from 84.72 / 84.92 to 83.58 / 83.61 ms, alternating in one command, the same loss
// bits); the expressions and their order are the loop kernel's (the same bits; norm_fast_cuda_test
// compares them). bf16 rows under norm_fast() only, like the staged kernel; the loop kernel is the
// reference. Its rows hold 150-220 registers a thread (ptxas converts the packs as it loads them;
// bounded to 128 it spills): blocks of 4 rows, so 2-3 of them share an SM.
constexpr int kResidentRows = 4;

template <typename T, typename P, int kPacks, bool kLN, bool kAlso>
__global__ void __launch_bounds__(kResidentRows * 32)
    norm_backward_dx_resident_kernel(const T* __restrict__ x, const P* __restrict__ gamma,
                                     const float* __restrict__ mean, const float* __restrict__ rstd,
                                     const T* __restrict__ dy, T* __restrict__ dx,
                                     T* __restrict__ also, bool also_add, int64_t N, int C) {
  constexpr int kV = kPack<T>;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kResidentRows + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const T* xr = x + row * C;
  const T* dyr = dy + row * C;
  T* dxr = dx + row * C;
  Pack<T, kV> xp[kPacks], dp[kPacks], op[kPacks];
#pragma unroll
  for (int j = 0; j < kPacks; ++j) {
    const int c = (lane + 32 * j) * kV;
    if (c < C) {
      xp[j] = *reinterpret_cast<const Pack<T, kV>*>(xr + c);
      dp[j] = *reinterpret_cast<const Pack<T, kV>*>(dyr + c);
      op[j] = *reinterpret_cast<const Pack<T, kV>*>(dxr + c);
    }
  }
  const float m = kLN ? mean[row] : 0.0f;
  const float r = rstd[row];
  float sum_g = 0.0f, sum_gx = 0.0f;
  // The column terms, dead here: the partials kernel forms them.
  float unused[kLN ? 2 : 1][kPacks * kV];
  lane_row_terms<T, P, kV, kPacks, kLN>(xp, dp, gamma, m, r, C, lane, unused, sum_g, sum_gx);
  const float mean_g = kLN ? warp_sum(sum_g) / static_cast<float>(C) : 0.0f;
  const float mean_gx = warp_sum(sum_gx) / static_cast<float>(C);
#pragma unroll
  for (int j = 0; j < kPacks; ++j) {
    const int c = (lane + 32 * j) * kV;
    if (c >= C) continue;
    float sum[kV];
    lane_dx_terms<T, P, kV>(xp[j], dp[j], gamma + c, m, r, mean_g, mean_gx, sum);
#pragma unroll
    for (int k = 0; k < kV; ++k) sum[k] = to_float(op[j].v[k]) + sum[k];  // add_floats' arithmetic
    store_floats<kV>(dxr + c, sum);
    if constexpr (kAlso) {  // write_dx's: the sum as stored
      float stored[kV];
#pragma unroll
      for (int k = 0; k < kV; ++k) stored[k] = to_float(from_float<T>(sum[k]));
      if (also_add) {
        add_floats<kV>(also + row * C + c, stored);
      } else {
        store_floats<kV>(also + row * C + c, stored);
      }
    }
  }
}

// Note [packed norm parameter partials]
// Where the one-pass backward does not cover the row (C above 1024 in bf16), dgamma and dbeta come
// from the two-pass column sums (model/cuda/column_sum.cuh), whose generic kernel reads one element
// a thread: a warp asks for 64 bytes of a bf16 row, and at C = 1536 on the H100 it moved x and dy
// at about 1.8 TB/s. This kernel is its first pass for bf16 rows in 16-byte packs: pack lane i
// owns kV consecutive columns, and every column keeps the generic kernel's order (row lane y sums
// rows y, y + 8, … of the chunk, then the 8 lanes in order y = 0..7, the same chunks): the same
// partials, bit for bit, and the same finish.
template <typename T, int kV, bool kLN>
__global__ void __launch_bounds__(kColTile* kColLanes)
    norm_param_partials_kernel(const T* __restrict__ x, const T* __restrict__ dy,
                               const float* __restrict__ mean, const float* __restrict__ rstd,
                               int64_t N, int64_t C, int64_t rows_per_chunk,
                               float* __restrict__ partial) {
  constexpr int K = kLN ? 2 : 1;
  __shared__ float lanes[K][kColLanes][kV][kColTile];
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x) * kV;
  const int64_t chunk = blockIdx.y;
  const int64_t r0 = chunk * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < N ? r0 + rows_per_chunk : N;
  float acc[K][kV];
#pragma unroll
  for (int k = 0; k < K; ++k)
#pragma unroll
    for (int e = 0; e < kV; ++e) acc[k][e] = 0.0f;
  if (c < C) {
    // kBatch rows' loads issued before any of their sums (the sums keep the row order).
    constexpr int kBatch = 4;
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kBatch * kColLanes) {
      Pack<T, kV> xp[kBatch], dp[kBatch];
      float m[kBatch], rs[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int64_t rb = r + b * kColLanes;
        if (rb < r1) {
          xp[b] = *reinterpret_cast<const Pack<T, kV>*>(x + rb * C + c);
          dp[b] = *reinterpret_cast<const Pack<T, kV>*>(dy + rb * C + c);
          m[b] = kLN ? mean[rb] : 0.0f;
          rs[b] = rstd[rb];
        }
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        if (r + b * kColLanes >= r1) break;
#pragma unroll
        for (int e = 0; e < kV; ++e) {
          const float d = to_float(dp[b].v[e]);
          acc[0][e] += d * ((to_float(xp[b].v[e]) - m[b]) * rs[b]);  // NormParamTerm's terms
          if constexpr (kLN) acc[1][e] += d;
        }
      }
    }
  }
#pragma unroll
  for (int k = 0; k < K; ++k)
#pragma unroll
    for (int e = 0; e < kV; ++e) lanes[k][threadIdx.y][e][threadIdx.x] = acc[k][e];
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
#pragma unroll
    for (int k = 0; k < K; ++k) {
      float s[kV];
#pragma unroll
      for (int e = 0; e < kV; ++e) {
        s[e] = 0.0f;
        for (int y = 0; y < kColLanes; ++y) s[e] += lanes[k][y][e][threadIdx.x];
      }
      store_floats<kV>(partial + (k * static_cast<int64_t>(gridDim.y) + chunk) * C + c, s);
    }
  }
}

}  // namespace
}  // namespace gtron::cuda

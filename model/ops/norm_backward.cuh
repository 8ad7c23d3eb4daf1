// Device pieces of the norm backward kernels (model/ops/norm_cuda.cu): a row's per-lane arithmetic
// and the block's warp tree, which the register kernel and the staged one share so that their
// bits agree (Note [one-pass norm backward], Note [staged norm backward]), and the staged
// kernel's shared-memory ring.
#pragma once

#include <cstdint>

#include "model/cuda/kernel_util.cuh"
#include "model/cuda/mma_tile.cuh"
#include "model/ops/norm_cuda.cuh"

namespace gtron::cuda {

// One row's terms of this lane's columns (Note [one-pass norm backward]): sum_g += Σ dy·gamma,
// sum_gx += Σ dy·gamma·x̂, and acc[0] += dy·x̂, acc[1] += dy (LN) column by column.
template <typename T, typename P, int kV, int kPacks, bool kLN>
__device__ __forceinline__ void lane_row_terms(const Pack<T, kV> (&xs)[kPacks],
                                               const Pack<T, kV> (&ds)[kPacks],
                                               const P* __restrict__ gamma, float m, float r, int C,
                                               int lane, float (&acc)[kLN ? 2 : 1][kPacks * kV],
                                               float& sum_g, float& sum_gx) {
  constexpr int K = kLN ? 2 : 1;
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
}

// out = the dx terms of one pack (norm_backward_dx_kernel's expression); gamma at the pack.
template <typename T, typename P, int kV>
__device__ __forceinline__ void lane_dx_terms(const Pack<T, kV>& xs, const Pack<T, kV>& ds,
                                              const P* __restrict__ gamma, float m, float r,
                                              float mean_g, float mean_gx, float (&out)[kV]) {
  float g[kV];
  load_floats<kV>(gamma, g);
#pragma unroll
  for (int e = 0; e < kV; ++e) {
    const float xhat = (to_float(xs.v[e]) - m) * r;
    out[e] = r * (to_float(ds.v[e]) * g[e] - mean_g - xhat * mean_gx);
  }
}

// The 8 warps' acc meet in the fixed tree (4..7 into 0..3, 2..3 into 0..1, 1 into 0) through
// `slots` (kRowsPerBlock / 2 · K · kE · 32 floats of shared memory), and warp 0 writes the block's
// partial[k][blockIdx.x][c]. Called by every thread of the block.
template <int kV, int kPacks, int K>
__device__ __forceinline__ void block_partials(float (&acc)[K][kPacks * kV], float* slots, int C,
                                               float* __restrict__ partial) {
  constexpr int kE = kPacks * kV;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  auto slot = [&](int w, int k, int e) -> float& {
    return slots[((w * K + k) * kE + e) * 32 + lane];
  };
#pragma unroll
  for (int h = kRowsPerBlock / 2; h > 0; h /= 2) {
    if (warp >= h && warp < 2 * h) {
#pragma unroll
      for (int k = 0; k < K; ++k)
#pragma unroll
        for (int e = 0; e < kE; ++e) slot(warp - h, k, e) = acc[k][e];
    }
    __syncthreads();
    if (warp < h) {
#pragma unroll
      for (int k = 0; k < K; ++k)
#pragma unroll
        for (int e = 0; e < kE; ++e) acc[k][e] += slot(warp, k, e);
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

// write_dx's arithmetic on staged values: dx[i, i + kV) = cur + out (cur: the staged dx), rounded
// once; under kAlso the second slot gets that sum as stored (also_add: prev + it, prev staged).
// `stored`: the dx values as written (rounded), for the column sums of Note [norm dx partials].
template <bool kAlso, int kV, typename T>
__device__ __forceinline__ void write_staged_dx(T* __restrict__ dx, T* __restrict__ also,
                                                bool also_add, int64_t i, const Pack<T, kV>& cur,
                                                const Pack<T, kV>& prev, const float (&out)[kV],
                                                float (&stored)[kV]) {
  float s[kV];
#pragma unroll
  for (int e = 0; e < kV; ++e) s[e] = to_float(cur.v[e]) + out[e];
  Pack<T, kV> pk;
#pragma unroll
  for (int e = 0; e < kV; ++e) pk.v[e] = from_float<T>(s[e]);
  *reinterpret_cast<Pack<T, kV>*>(dx + i) = pk;
#pragma unroll
  for (int e = 0; e < kV; ++e) stored[e] = to_float(pk.v[e]);
  if constexpr (kAlso) {
    float sum[kV];
#pragma unroll
    for (int e = 0; e < kV; ++e) sum[e] = to_float(pk.v[e]);
    if (also_add) {
#pragma unroll
      for (int e = 0; e < kV; ++e) sum[e] = to_float(prev.v[e]) + sum[e];
    }
    store_floats<kV>(also + i, sum);
  }
}

// cp.async.wait_group that is also a compiler barrier: the reads of the staged row below it must
// not move above it (no __syncthreads follows the wait in the staged kernel).
template <int kPending>
__device__ __forceinline__ void staged_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// One lane's share of the staged kernel's ring (ring[warp][stage][operand][pack][lane], 16-byte
// slots; operands x, dy, dx, also, the first `ops` of them): stage() copies a row's operands in
// with cp.async as one commit group, get() reads one pack back.
template <typename T, int kPacks>
struct StagedRows {
  static constexpr int kV = kPack<T>;
  uint4* mine;  // the warp's ring at this lane
  int ops, C, lane;
  const T* x;
  const T* dy;
  const T* dx;
  const T* also;

  __device__ uint4* slot(int stage, int op, int j) const {
    return mine + ((stage * ops + op) * kPacks + j) * 32;
  }
  __device__ Pack<T, kV> get(int stage, int op, int j) const {
    return *reinterpret_cast<const Pack<T, kV>*>(slot(stage, op, j));
  }
  __device__ void stage(int64_t row, int stage) const {
    asm volatile("" ::: "memory");  // this stage's reads (the row before last) stay above
#pragma unroll
    for (int j = 0; j < kPacks; ++j) {
      const int c = (lane + 32 * j) * kV;
      if (c >= C) continue;
      const int64_t i = row * C + c;
      cp_async16(slot(stage, 0, j), x + i, true);
      cp_async16(slot(stage, 1, j), dy + i, true);
      if (ops > 2) cp_async16(slot(stage, 2, j), dx + i, true);
      if (ops > 3) cp_async16(slot(stage, 3, j), also + i, true);
    }
    cp_async_commit();
  }
};

}  // namespace gtron::cuda

// Deterministic column sums: out[c] += Σ_r term(r, c) over N rows, for parameter gradients
// (dgamma, dbeta, dbias) that reduce over every row of an activation.
//
// Policy (no atomics, so the bits never depend on timing):
// - The rows are cut into `column_chunks(N)` consecutive ranges, a pure function of N.
// - Kernel 1: a block covers 32 columns × one chunk. Thread row lane y (of 8) sums rows
//   y, y + 8, ... of the chunk in order; the 8 lane sums are then added in order y = 0..7 and
//   written to partial[k][chunk][c].
// - Kernel 2: one thread per column adds the chunks in order 0..chunks-1, then adds that total
//   into out[c] (once, so out keeps its accumulate-into semantics).
// The caller provides `partial`: column_scratch_floats(N, C, K) floats.
#pragma once

#include <cstdint>

#include "model/cuda/check.h"

namespace gtron::cuda {

constexpr int kColTile = 32;  // columns per block: one warp wide, so row reads coalesce
constexpr int kColLanes = 8;  // row lanes per block
// At most 32 chunks: enough blocks to fill the GPU for C >= 768, and a finish pass that adds 32
// partials per column (256 made it a latency-bound 30 µs chain per launch).
constexpr int64_t kColMaxChunks = 32;
constexpr int64_t kColMinRows = 32;  // rows per chunk before chunks start to multiply

inline int64_t column_chunks(int64_t N) {
  const int64_t c = ceil_div<int64_t>(N, kColMinRows);
  return c < 1 ? 1 : (c > kColMaxChunks ? kColMaxChunks : c);
}

inline int64_t column_scratch_floats(int64_t N, int64_t C, int K) {
  return K * column_chunks(N) * C;
}

// Term: a functor with `__device__ void operator()(int64_t r, int64_t c, float (&t)[K]) const`.
template <int K, typename Term>
__global__ void column_partials_kernel(Term term, int64_t N, int64_t C, int64_t rows_per_chunk,
                                       float* __restrict__ partial) {
  __shared__ float lanes[K][kColLanes][kColTile];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  const int64_t chunk = blockIdx.y;
  const int64_t r0 = chunk * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < N ? r0 + rows_per_chunk : N;
  float acc[K];
#pragma unroll
  for (int k = 0; k < K; ++k) acc[k] = 0.0f;
  if (c < C) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kColLanes) {
      float t[K];
      term(r, c, t);
#pragma unroll
      for (int k = 0; k < K; ++k) acc[k] += t[k];
    }
  }
#pragma unroll
  for (int k = 0; k < K; ++k) lanes[k][threadIdx.y][threadIdx.x] = acc[k];
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
#pragma unroll
    for (int k = 0; k < K; ++k) {
      float s = 0.0f;
      for (int y = 0; y < kColLanes; ++y) s += lanes[k][y][threadIdx.x];
      partial[(k * static_cast<int64_t>(gridDim.y) + chunk) * C + c] = s;
    }
  }
}

template <int K>
__global__ void column_finish_kernel(const float* __restrict__ partial, int64_t chunks, int64_t C,
                                     float* out0, float* out1) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    float* out = k == 0 ? out0 : out1;
    if (out == nullptr) continue;
    float s = 0.0f;
#pragma unroll 8
    for (int64_t j = 0; j < chunks; ++j) s += partial[(k * chunks + j) * C + c];
    out[c] += s;
  }
}

// out_k[c] += Σ_r term_k(r, c) for k < K (K = 1 or 2; a null out_k is skipped), on `stream`.
template <int K, typename Term>
void column_sums(const Term& term, int64_t N, int64_t C, float* partial, float* out0, float* out1,
                 cudaStream_t stream) {
  static_assert(K == 1 || K == 2, "column_sums: one or two outputs");
  if (N == 0 || C == 0 || (out0 == nullptr && out1 == nullptr)) return;
  GTRON_CHECK(partial != nullptr, "column_sums: no scratch for ", N, " x ", C);
  const int64_t chunks = column_chunks(N);
  const int64_t rows_per_chunk = ceil_div<int64_t>(N, chunks);
  const dim3 grid(static_cast<unsigned>(ceil_div<int64_t>(C, kColTile)),
                  static_cast<unsigned>(chunks));
  const dim3 block(kColTile, kColLanes);
  column_partials_kernel<K><<<grid, block, 0, stream>>>(term, N, C, rows_per_chunk, partial);
  CUDA_CHECK_LAUNCH();
  constexpr int kThreads = 256;
  column_finish_kernel<K>
      <<<static_cast<unsigned>(ceil_div<int64_t>(C, kThreads)), kThreads, 0, stream>>>(
          partial, chunks, C, out0, out1);
  CUDA_CHECK_LAUNCH();
}

}  // namespace gtron::cuda

// Deterministic column sums: out[c] += Σ_r term(r, c) over N rows, for parameter gradients
// (dgamma, dbeta, dbias) that reduce over every row of an activation. No atomics anywhere, so the
// bits never depend on timing: every partial covers a fixed set of rows (a pure function of N),
// and every sum runs in a fixed order.
//
// Two-pass column sums (column_sums, any term; the norm backward's fallback):
// - The rows are cut into `column_chunks(N)` consecutive ranges, a pure function of N.
// - Kernel 1: a block covers 32 columns × one chunk. Thread row lane y (of 8) sums rows
//   y, y + 8, ... of the chunk in order; the 8 lane sums are then added in order y = 0..7 and
//   written to partial[k][chunk][c].
// - Kernel 2: column_tree_finish (below) adds the chunks of each column in a fixed tree and adds
//   that total into out[c] (once, so out keeps its accumulate-into semantics).
// The caller provides `partial`: column_scratch_floats(N, C, K) floats.
//
// Note [one-pass column sums]
// dense_column_sums (out[c] += Σ_r x[r, c] of a matrix: the linear bias gradient Σ_rows dy) reads
// x once with 16-byte loads: a block is 32 pack lanes × 8 row lanes; pack lane i owns kV
// consecutive columns (8 bf16 or 4 f32: one warp reads 512 contiguous bytes of a row), row lane y
// sums rows y, y + 8, ... of the block's chunk in order in registers (the loop unrolled so several
// loads are in flight). The 8 row-lane sums are added in order y = 0..7 into partial[chunk][c].
// Chunks hold dense_chunk_rows(N) rows (at least 64, at most 128 chunks): for GPT-2's N = 16384
// rows and C = 768 that is 3 × 128 blocks of 16 rows a thread, partials 1.5% of the bytes read.
// Kernel 2 (column_tree_finish, shared with the two-pass sums and the one-pass norm backward in
// model/ops/norm_cuda.cu): a block covers 32 columns; lane y (of 16) adds partials y, y + 16, ...
// in order, then the 16 lane sums meet in a fixed tree (8, 4, 2, 1) and the total is added into
// out[c] once. Its dependent chain is chunks/16 + 4 adds, not `chunks` (a serial sum over 256
// partials per column was a latency-bound ~30 µs launch).
#pragma once

#include <cstdint>

#include "model/cuda/check.h"
#include "model/cuda/column_finish.h"
#include "model/cuda/kernel_util.cuh"

namespace gtron::cuda {

constexpr int kColTile = 32;  // columns per block: one warp wide, so row reads coalesce
constexpr int kColLanes = 8;  // row lanes per block
// At most 32 chunks: enough blocks to fill the GPU for C >= 768, and a finish pass that adds 32
// partials per column (256 made it a latency-bound 30 µs chain per launch).
constexpr int64_t kColMaxChunks = 32;
constexpr int64_t kColMinRows = 32;  // rows per chunk before chunks start to multiply
constexpr int kTreeLanes = 16;       // partial lanes of column_tree_finish

inline int64_t column_chunks(int64_t N) {
  const int64_t c = ceil_div<int64_t>(N, kColMinRows);
  return c < 1 ? 1 : (c > kColMaxChunks ? kColMaxChunks : c);
}

inline int64_t column_scratch_floats(int64_t N, int64_t C, int K) {
  return K * column_chunks(N) * C;
}

// out[c] += Σ_j p[j·C + c] for j < chunks, for this thread's column c of a block of kColTile ×
// kTreeLanes threads, in the fixed order of Note [one-pass column sums]. Every thread of the
// block calls it (it synchronizes the block).
__device__ __forceinline__ void tree_finish_tile(const float* __restrict__ p, int64_t chunks,
                                                 int64_t C, int64_t c, float* out,
                                                 float (&lanes)[kTreeLanes][kColTile]) {
  float s = 0.0f;
  if (c < C) {
#pragma unroll 16  // up to 256 chunks: every load of a thread in flight at once
    for (int64_t j = threadIdx.y; j < chunks; j += kTreeLanes) s += p[j * C + c];
  }
  lanes[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
#pragma unroll
  for (int h = kTreeLanes / 2; h > 0; h >>= 1) {
    if (threadIdx.y < h) lanes[threadIdx.y][threadIdx.x] += lanes[threadIdx.y + h][threadIdx.x];
    __syncthreads();
  }
  if (threadIdx.y == 0 && c < C) out[c] += lanes[0][threadIdx.x];
}

// out_k[c] += Σ_j partial[(k·chunks + j)·C + c] for j < chunks (k = blockIdx.y; a null out_k is
// skipped). Block: kColTile × kTreeLanes threads.
template <int K>
__global__ void column_tree_finish_kernel(const float* __restrict__ partial, int64_t chunks,
                                          int64_t C, float* out0, float* out1) {
  static_assert(K == 1 || K == 2, "column_tree_finish: one or two outputs");
  __shared__ float lanes[kTreeLanes][kColTile];
  float* out = blockIdx.y == 0 ? out0 : out1;
  if (out == nullptr) return;  // the whole block leaves: no barrier is skipped by a part of it
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  tree_finish_tile(partial + static_cast<int64_t>(blockIdx.y) * chunks * C, chunks, C, c, out,
                   lanes);
}

// Launches column_tree_finish_kernel, or queues its outputs on this thread's active FinishBatch
// (model/cuda/column_finish.h), which finishes them later with the same arithmetic.
template <int K>
void column_tree_finish(const float* partial, int64_t chunks, int64_t C, float* out0, float* out1,
                        cudaStream_t stream) {
  if (FinishBatch* batch = active_finish_batch()) {
    batch->add(partial, chunks, C, out0, stream);
    if constexpr (K == 2) batch->add(partial + chunks * C, chunks, C, out1, stream);
    return;
  }
  const dim3 grid(static_cast<unsigned>(ceil_div<int64_t>(C, kColTile)), K);
  column_tree_finish_kernel<K>
      <<<grid, dim3(kColTile, kTreeLanes), 0, stream>>>(partial, chunks, C, out0, out1);
  CUDA_CHECK_LAUNCH();
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
  column_tree_finish<K>(partial, chunks, C, out0, out1, stream);
}

// One-pass column sums of a dense matrix (Note [one-pass column sums]).
constexpr int64_t kDenseMinRows = 64;     // rows per chunk at least
constexpr int64_t kDenseMaxChunks = 128;  // chunks at most

inline int64_t dense_chunk_rows(int64_t N) {
  int64_t rows = ceil_div<int64_t>(N, kDenseMaxChunks);
  rows = rows < kDenseMinRows ? kDenseMinRows : rows;
  return ceil_div<int64_t>(rows, kColLanes) * kColLanes;
}

inline int64_t dense_column_scratch_floats(int64_t N, int64_t C) {
  return ceil_div<int64_t>(N, dense_chunk_rows(N)) * C;
}

// partial[chunk][c] = Σ of x[r, c] over the chunk's rows (Note [one-pass column sums]).
template <typename T, int kV>
__global__ void __launch_bounds__(kColTile* kColLanes)
    dense_column_partials_kernel(const T* __restrict__ x, int64_t N, int64_t C,
                                 int64_t rows_per_chunk, float* __restrict__ partial) {
  __shared__ float lanes[kColLanes][kV][kColTile];
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x) * kV;
  const int64_t chunk = blockIdx.y;
  const int64_t r0 = chunk * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < N ? r0 + rows_per_chunk : N;
  float acc[kV];
#pragma unroll
  for (int k = 0; k < kV; ++k) acc[k] = 0.0f;
  if (c < C) {
    const T* p = x + (r0 + threadIdx.y) * C + c;
#pragma unroll 8
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kColLanes, p += kColLanes * C) {
      float v[kV];
      load_floats<kV>(p, v);
#pragma unroll
      for (int k = 0; k < kV; ++k) acc[k] += v[k];
    }
  }
#pragma unroll
  for (int k = 0; k < kV; ++k) lanes[threadIdx.y][k][threadIdx.x] = acc[k];
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float s[kV];
#pragma unroll
    for (int k = 0; k < kV; ++k) {
      s[k] = 0.0f;
#pragma unroll
      for (int y = 0; y < kColLanes; ++y) s[k] += lanes[y][k][threadIdx.x];
    }
    store_floats<kV>(partial + chunk * C + c, s);
  }
}

// out[c] += Σ_r x[r, c] for x [N, C] in T (f32 or bf16), on `stream`; `partial` holds
// dense_column_scratch_floats(N, C) floats.
template <typename T>
void dense_column_sums(const T* x, int64_t N, int64_t C, float* partial, float* out,
                       cudaStream_t stream) {
  if (N == 0 || C == 0 || out == nullptr) return;
  GTRON_CHECK(partial != nullptr, "dense_column_sums: no scratch for ", N, " x ", C);
  constexpr int kV = kPack<T>;
  const int64_t rows = dense_chunk_rows(N);
  const int64_t chunks = ceil_div<int64_t>(N, rows);
  const dim3 block(kColTile, kColLanes);
  if (C % kV == 0 && is_aligned(x, 16)) {
    const dim3 grid(static_cast<unsigned>(ceil_div<int64_t>(C / kV, kColTile)),
                    static_cast<unsigned>(chunks));
    dense_column_partials_kernel<T, kV><<<grid, block, 0, stream>>>(x, N, C, rows, partial);
  } else {
    const dim3 grid(static_cast<unsigned>(ceil_div<int64_t>(C, kColTile)),
                    static_cast<unsigned>(chunks));
    dense_column_partials_kernel<T, 1><<<grid, block, 0, stream>>>(x, N, C, rows, partial);
  }
  CUDA_CHECK_LAUNCH();
  column_tree_finish<1>(partial, chunks, C, out, nullptr, stream);
}

}  // namespace gtron::cuda

// Deterministic column sums: out[c] += Σ_r term(r, c) over N rows, for parameter gradients
// (dgamma, dbeta, dbias) that reduce over every row of an activation. No floating-point atomics,
// so the bits never depend on timing: every partial covers a fixed set of rows (a pure function of
// N), and every sum runs in a fixed order. (The one integer atomic, an arrival counter, only picks
// which block adds the partials, never their order: Note [one-launch column finish].)
//
// Two-pass column sums (column_sums, any term; the norm backward's fallback):
// - The rows are cut into `column_chunks(N)` consecutive ranges, a pure function of N.
// - Kernel 1: a block covers 32 columns × one chunk. Thread row lane y (of 8) sums rows
//   y, y + 8, ... of the chunk in order; the 8 lane sums are then added in order y = 0..7 and
//   written to partial[k][chunk][c].
// - The finish (the fixed tree of column_tree_finish, below) adds the chunks of each column and
//   adds that total into out[c] (once, so out keeps its accumulate-into semantics).
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
// The finish (shared with the two-pass sums and the one-pass norm backward in
// model/ops/norm_cuda.cu) adds the partials of a column in a fixed tree: lane y (of 16) adds
// partials y, y + 16, ... in order, then the 16 lane sums meet in a fixed tree (8, 4, 2, 1) and
// the total is added into out[c] once. Its dependent chain is chunks/16 + 4 adds, not `chunks` (a
// serial sum over 256 partials per column was a latency-bound ~30 µs launch).
//
// Note [one-launch column finish]
// The finish runs at the end of the partials kernel itself (finish_columns), not as a second
// launch: that launch took ~6 µs, 53 times a GPT-2 step, nearly all launch and tail latency.
// - Groups: the blocks that write the partials of one set of columns (a dense kernel's column
//   tile: its gridDim.y chunk blocks; the norm kernel: its whole grid) share an arrival counter.
//   A block writes its partials, fences (__threadfence) and takes a ticket (atomicAdd).
// - Finishers: the last F blocks to arrive finish the group, each a 32-column-aligned slice of
//   its K × W columns (F = column_finishers: one 32-column pass a block where the budget allows,
//   so the tail is one pass of L2 reads, not one block reading every partial: GPT-2's norm
//   backward has 256 × 1536 of them). A finisher waits until the group's last block has arrived,
//   fences, and reads the partials from L2 (ld.cg). Only blocks that are done with their own work
//   wait, at most half the SMs' worth in all, so the blocks they wait for always find a slot.
// - Same bits: each column's partials are added in column_tree_finish_kernel's order (lane y of
//   16 sums chunks y, y + 16, ... from 0 in order, then the tree 8, 4, 2, 1, then out += total),
//   whichever blocks finish. The ticket order picks who adds, never the order of the additions.
// - Reset: the last finisher done puts both counters back to zero (atomicExch), so the next
//   launch, eager or a graph replay, finds them ready: no memset per call.
// - Where the counters live: 2 per group, private to the launch's stream (column_finish_counters:
//   made and zeroed once per stream, as cuBLASLt's per-stream workspace is). Launches on one
//   stream never overlap, so they share them; a graph replays on the stream it was captured on
//   (its nodes from a forked stream keep that stream's counters, ordered by the fork). Not in the
//   caller's scratch: that comes from the caching allocator, recycled between ops with whatever
//   bytes they left, so it would need a memset node per call.
// GTRON_COLUMN_FINISH=0 (or set_column_finish_fused(false)) keeps the two launches: the tests'
// reference.
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
constexpr int kTreeLanes = 16;       // partial lanes of the finish tree
// Threads of every partials kernel that finishes in-kernel: 32 columns × 8 row threads, a row
// thread holding tree lanes y and y + 8.
constexpr int kFinishThreads = 256;
constexpr int kFinishRows = kFinishThreads / kColTile;
static_assert(kTreeLanes == 2 * kFinishRows, "finish_columns: two tree lanes a row thread");

inline int64_t column_chunks(int64_t N) {
  const int64_t c = ceil_div<int64_t>(N, kColMinRows);
  return c < 1 ? 1 : (c > kColMaxChunks ? kColMaxChunks : c);
}

inline int64_t column_scratch_floats(int64_t N, int64_t C, int K) {
  return K * column_chunks(N) * C;
}

// out_k[c] += Σ_j partial[(k·chunks + j)·C + c] for j < chunks (k = blockIdx.y; a null out_k is
// skipped), in the fixed order of Note [one-pass column sums]. Block: kColTile × kTreeLanes
// threads. The two-launch finish (GTRON_COLUMN_FINISH=0): finish_columns adds in this order.
template <int K>
__global__ void column_tree_finish_kernel(const float* __restrict__ partial, int64_t chunks,
                                          int64_t C, float* out0, float* out1) {
  static_assert(K == 1 || K == 2, "column_tree_finish: one or two outputs");
  __shared__ float lanes[kTreeLanes][kColTile];
  float* out = blockIdx.y == 0 ? out0 : out1;
  if (out == nullptr) return;  // the whole block leaves: no barrier is skipped by a part of it
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  const float* p = partial + static_cast<int64_t>(blockIdx.y) * chunks * C;
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

template <int K>
void column_tree_finish(const float* partial, int64_t chunks, int64_t C, float* out0, float* out1,
                        cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(ceil_div<int64_t>(C, kColTile)), K);
  column_tree_finish_kernel<K>
      <<<grid, dim3(kColTile, kTreeLanes), 0, stream>>>(partial, chunks, C, out0, out1);
  CUDA_CHECK_LAUNCH();
}

// What a partials kernel needs to finish its sums itself (Note [one-launch column finish]).
// counters == nullptr: it only writes the partials, and the host launches column_tree_finish.
struct ColumnFinish {
  unsigned* counters = nullptr;  // 2 per group: arrivals, finishers done
  int finishers = 1;             // per group
  float* out0 = nullptr;         // a null output is skipped
  float* out1 = nullptr;
};

// The finish plan of a partials launch of `groups` groups of `group_blocks` blocks on `stream`,
// each group finishing `group_cols` columns of each of K outputs.
inline ColumnFinish plan_column_finish(int K, int64_t groups, int64_t group_blocks,
                                       int64_t group_cols, float* out0, float* out1,
                                       cudaStream_t stream) {
  ColumnFinish f;
  f.out0 = out0;
  f.out1 = out1;
  if (!column_finish_fused()) return f;
  f.counters = column_finish_counters(stream, groups);
  f.finishers = column_finishers(groups, K * group_cols, group_blocks);
  return f;
}

// The two-launch path's second launch, when `f` left the finish out of the partials kernel.
template <int K>
void finish_unless_fused(const ColumnFinish& f, const float* partial, int64_t chunks, int64_t C,
                         cudaStream_t stream) {
  if (f.counters == nullptr) column_tree_finish<K>(partial, chunks, C, f.out0, f.out1, stream);
}

// Finisher side: out_k[c] += the tree of the `chunks` partials of the virtual columns [v0, v1)
// of the group's K · W (virtual column v: output k = v / W, column col0 + v % W), 32 at a time.
template <int K>
__device__ void finish_slice(const ColumnFinish& f, const float* partial, int64_t chunks, int64_t C,
                             int64_t col0, int64_t W, int64_t v0, int64_t v1) {
  __shared__ float tree[kFinishRows][kColTile];
  const int tid = static_cast<int>(threadIdx.x + blockDim.x * threadIdx.y);
  const int lx = tid % kColTile, ly = tid / kColTile;
  for (int64_t base = v0; base < v1; base += kColTile) {  // block-uniform
    const int64_t v = base + lx;
    const int k = K == 1 ? 0 : static_cast<int>(v / W);
    const int64_t c = col0 + (v - k * W);
    float* out = k == 0 ? f.out0 : f.out1;
    const bool live = v < v1 && out != nullptr;
    float s0 = 0.0f, s1 = 0.0f;  // tree lanes ly and ly + kFinishRows
    if (live) {
      const float* p = partial + (k * chunks + ly) * C + c;
#pragma unroll 4
      for (int64_t j = ly; j < chunks; j += kTreeLanes, p += kTreeLanes * C) {
        s0 += __ldcg(p);
        if (j + kFinishRows < chunks) s1 += __ldcg(p + kFinishRows * C);
      }
    }
    tree[ly][lx] = s0 + s1;  // the tree's first step (8): lane y += lane y + 8
    __syncthreads();
#pragma unroll
    for (int h = kFinishRows / 2; h > 0; h >>= 1) {
      if (ly < h) tree[ly][lx] += tree[ly + h][lx];
      __syncthreads();
    }
    if (ly == 0 && live) out[c] += tree[0][lx];
    __syncthreads();
  }
}

// Called by every thread of every block of a partials kernel (kFinishThreads a block) after the
// block's partial stores: the block arrives at counter `group` of `group_blocks`; the last F finish
// columns [col0, col1) of each output (Note [one-launch column finish]). Partials are
// partial[(k·chunks + j)·C + c]. No-op for a two-launch plan.
template <int K>
__device__ void finish_columns(const ColumnFinish& f, const float* partial, int64_t chunks,
                               int64_t C, unsigned group, unsigned group_blocks, int64_t col0,
                               int64_t col1) {
  if (f.counters == nullptr) return;
  __shared__ int slot;
  unsigned* arrived = f.counters + 2 * static_cast<int64_t>(group);
  unsigned* done = arrived + 1;
  const int F =
      f.finishers < static_cast<int>(group_blocks) ? f.finishers : static_cast<int>(group_blocks);
  const bool leader = threadIdx.x == 0 && threadIdx.y == 0;
  __threadfence();  // this thread's partials, visible device-wide before the block arrives
  __syncthreads();
  if (leader) {
    const unsigned ticket = atomicAdd(arrived, 1u);
    slot = static_cast<int>(ticket) - (static_cast<int>(group_blocks) - F);
    if (slot >= 0) {  // a finisher: wait for the group's last block
      while (*reinterpret_cast<volatile unsigned*>(arrived) < group_blocks) __nanosleep(64);
    }
  }
  __syncthreads();
  if (slot < 0) return;  // the whole block leaves
  __threadfence();       // every block's partials, seen by this thread's loads below
  const int64_t W = col1 - col0;
  const int64_t width = ceil_div<int64_t>(ceil_div<int64_t>(K * W, F), kColTile) * kColTile;
  const int64_t v0 = slot * width;
  const int64_t v1 = v0 + width < K * W ? v0 + width : K * W;
  finish_slice<K>(f, partial, chunks, C, col0, W, v0, v1);
  if (leader) {  // finish_slice ended on a barrier: the block's output stores are issued
    __threadfence();
    if (atomicAdd(done, 1u) == static_cast<unsigned>(F - 1)) {
      atomicExch(arrived, 0u);
      atomicExch(done, 0u);
    }
  }
}

// Term: a functor with `__device__ void operator()(int64_t r, int64_t c, float (&t)[K]) const`.
template <int K, typename Term>
__global__ void __launch_bounds__(kFinishThreads)
    column_partials_kernel(Term term, int64_t N, int64_t C, int64_t rows_per_chunk,
                           float* __restrict__ partial, ColumnFinish fin) {
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
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kColTile;
  finish_columns<K>(fin, partial, gridDim.y, C, blockIdx.x, gridDim.y, col0,
                    col0 + kColTile < C ? col0 + kColTile : C);
}

// out_k[c] += Σ_r term_k(r, c) for k < K (K = 1 or 2; a null out_k is skipped), on `stream`.
template <int K, typename Term>
void column_sums(const Term& term, int64_t N, int64_t C, float* partial, float* out0, float* out1,
                 cudaStream_t stream) {
  static_assert(K == 1 || K == 2, "column_sums: one or two outputs");
  static_assert(kColTile * kColLanes == kFinishThreads, "column_sums: the finish's block size");
  if (N == 0 || C == 0 || (out0 == nullptr && out1 == nullptr)) return;
  GTRON_CHECK(partial != nullptr, "column_sums: no scratch for ", N, " x ", C);
  const int64_t chunks = column_chunks(N);
  const int64_t rows_per_chunk = ceil_div<int64_t>(N, chunks);
  const int64_t tiles = ceil_div<int64_t>(C, kColTile);
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(chunks));
  const dim3 block(kColTile, kColLanes);
  const ColumnFinish fin = plan_column_finish(K, tiles, chunks, kColTile, out0, out1, stream);
  column_partials_kernel<K><<<grid, block, 0, stream>>>(term, N, C, rows_per_chunk, partial, fin);
  CUDA_CHECK_LAUNCH();
  finish_unless_fused<K>(fin, partial, chunks, C, stream);
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

// partial[chunk][c] = Σ of x[r, c] over the chunk's rows (Note [one-pass column sums]), then the
// finish of the block's column tile when `fin` asks for it (Note [one-launch column finish]).
template <typename T, int kV>
__global__ void __launch_bounds__(kColTile* kColLanes)
    dense_column_partials_kernel(const T* __restrict__ x, int64_t N, int64_t C,
                                 int64_t rows_per_chunk, float* __restrict__ partial,
                                 ColumnFinish fin) {
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
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kColTile * kV;
  finish_columns<1>(fin, partial, gridDim.y, C, blockIdx.x, gridDim.y, col0,
                    col0 + kColTile * kV < C ? col0 + kColTile * kV : C);
}

// out[c] += Σ_r x[r, c] for x [N, C] in T (f32 or bf16), on `stream`; `partial` holds
// dense_column_scratch_floats(N, C) floats.
template <typename T>
void dense_column_sums(const T* x, int64_t N, int64_t C, float* partial, float* out,
                       cudaStream_t stream) {
  static_assert(kColTile * kColLanes == kFinishThreads, "dense_column_sums: the finish's block");
  if (N == 0 || C == 0 || out == nullptr) return;
  GTRON_CHECK(partial != nullptr, "dense_column_sums: no scratch for ", N, " x ", C);
  constexpr int kV = kPack<T>;
  const int64_t rows = dense_chunk_rows(N);
  const int64_t chunks = ceil_div<int64_t>(N, rows);
  const dim3 block(kColTile, kColLanes);
  const int v = C % kV == 0 && is_aligned(x, 16) ? kV : 1;  // columns a thread
  const int64_t tiles = ceil_div<int64_t>(C, kColTile * v);
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(chunks));
  const ColumnFinish fin = plan_column_finish(1, tiles, chunks, kColTile * v, out, nullptr, stream);
  if (v == kV) {
    dense_column_partials_kernel<T, kV><<<grid, block, 0, stream>>>(x, N, C, rows, partial, fin);
  } else {
    dense_column_partials_kernel<T, 1><<<grid, block, 0, stream>>>(x, N, C, rows, partial, fin);
  }
  CUDA_CHECK_LAUNCH();
  finish_unless_fused<1>(fin, partial, chunks, C, stream);
}

}  // namespace gtron::cuda

// The layernorm and rmsnorm backwards on CUDA (the forwards: model/ops/norm_forward_cuda.cu);
// RMSNorm is LayerNorm without centering, so one kernel template (kLN) serves both.
//
// Rows: one warp per row, 8 rows per block; a lane's columns as the forward's (16-byte packs where
// C and every pointer allow, else one element). The residual add before a LayerNorm or an RMSNorm
// rides in the same row pass (Note [fused residual add and LayerNorm], model/ops/add_norm.h).
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
// kernel plus the two-pass column sums (for bf16 rows in packs, the kernels of
// model/ops/norm_wide.cuh). Registers bound the coverage: with bf16 rows LayerNorm
// at 3 packs a lane (C = 768) fits 128 registers without spills (two blocks per SM), at 4 packs
// it takes ~180 (one block per SM), and 6 packs would take ~240.
//
// Note [staged norm backward]
// The row-to-warp assignment above fixes the block count (256 at N = 16384: one wave at two blocks
// per SM), so more warps cannot hide memory latency; and the register-resident kernel waits on
// memory two or three times per row (x and dy, then dx before adding into it, then the second
// slot under kAlso), with nothing of the next row in flight. The staged kernel (16-byte packs;
// unless a test selects the reference kernels) copies each row's operands — x, dy, the dx it adds
// into, and the second slot it adds into (kAlso with also_add) — into shared memory with cp.async
// one row ahead (two stages per warp), and loads the next row's mean and rstd into registers as it
// starts a row: while a warp does a row's arithmetic its next row is arriving, and its per-row wait
// is one round trip at most. A lane reads back only the 16-byte slots it copied itself
// (ring[warp][stage][operand][pack][lane]), so no barrier orders the ring; at the end the ring
// becomes the warp tree's shared memory, after one barrier. The rows, their order, and every
// expression are the register kernel's (model/ops/norm_backward.cuh), so dx, the second slot,
// dgamma and dbeta are the same bits. Shared memory: 8 warps × 2 stages × 2-4 operands × kPacks
// × 512 bytes: 72 KB for C = 768 in bf16 with dx (96 KB with a slot to add into), two blocks per
// SM; a device whose opt-in limit is below the ring's size runs the register kernel.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <type_traits>

#include "model/cuda/column_sum.cuh"
#include "model/cuda/kernel_util.cuh"
#include "model/ops/add.h"
#include "model/ops/add_norm.h"
#include "model/ops/norm.h"
#include "model/ops/norm_backward.cuh"
#include "model/ops/norm_cuda.cuh"
#include "model/ops/norm_wide.cuh"

namespace gtron::cuda {

namespace {

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

constexpr int kFusedScalarElems = 8;   // elements a lane holds (one-element path)
constexpr int64_t kFusedMinRows = 16;  // rows per block at least
constexpr int64_t kFusedMaxBlocks = 256;
constexpr int kStages = 2;  // rows a warp has staged: the current one and the next

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
  __shared__ float slots[kRowsPerBlock / 2 * K * kE * 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * rows_per_block;
  const int64_t r1 = r0 + rows_per_block < N ? r0 + rows_per_block : N;
  float acc[K][kE] = {};
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
    lane_row_terms<T, P, kV, kPacks, kLN>(xs, ds, gamma, m, r, C, lane, acc, sum_g, sum_gx);
    if (dx == nullptr) continue;
    const float mean_g = kLN ? warp_sum(sum_g) / static_cast<float>(C) : 0.0f;
    const float mean_gx = warp_sum(sum_gx) / static_cast<float>(C);
#pragma unroll
    for (int j = 0; j < kPacks; ++j) {
      const int c = (lane + 32 * j) * kV;
      if (c >= C) continue;
      float out[kV];
      lane_dx_terms<T, P, kV>(xs[j], ds[j], gamma + c, m, r, mean_g, mean_gx, out);
      write_dx<kAlso>(dx, also, also_add, row * C + c, out);
    }
  }
  block_partials<kV, kPacks, K>(acc, slots, C, partial);
}

// Operands the staged kernel copies per row: x and dy; the dx it adds into; the slot it adds into.
__host__ __device__ inline int staged_operands(bool with_dx, bool also_add) {
  return with_dx ? (also_add ? 4 : 3) : 2;
}

// Dynamic shared memory of the staged kernel: its ring, or the warp tree's slots if larger; with
// kSum the per-warp dx column sums after that (Note [norm dx partials]).
template <typename T, int kPacks, bool kLN, bool kSum = false>
__host__ __device__ inline int staged_smem_bytes(int operands) {
  const int ring = kRowsPerBlock * kStages * operands * kPacks * 32 * 16;
  const int tree = kRowsPerBlock / 2 * (kLN ? 2 : 1) * kPacks * kPack<T> * 32 * 4;
  const int sums = kSum ? kRowsPerBlock * kPacks * kPack<T> * 32 * 4 : 0;
  return (ring > tree ? ring : tree) + sums;
}

// norm_backward_fused_kernel with each row's operands staged through shared memory one row ahead
// (Note [staged norm backward]); 16-byte packs only. Dynamic shared memory:
// staged_smem_bytes<.., kSum>(staged_operands(dx != nullptr, kAlso && also_add)).
//
// Note [norm dx partials]
// kSum (dx given, no second slot): the block also writes partial[K][blockIdx.x][c], the sum over
// its rows of dx[r, c] as stored (after adding into what dx held, rounded): fixed-row-chunk
// partials of the finished gradient of x, which the linear that made x takes for its bias
// gradient instead of a pass over that gradient (Note [gradient column partials] in
// model/autograd.h). A lane adds its stored values into its own slots of a per-warp shared array
// (sums[warp][element][lane], so no register is held for them through the row loop); at the end
// the 8 warps' sums meet in block_partials' fixed tree. dx, dgamma and dbeta keep their bits.
template <typename T, typename P, int kPacks, bool kLN, bool kAlso, bool kSum = false>
__global__ void __launch_bounds__(kRowsPerBlock * 32, kPacks* kPack<T> <= 24 ? 2 : 1)
    norm_backward_staged_kernel(const T* __restrict__ x, const P* __restrict__ gamma,
                                const float* __restrict__ mean, const float* __restrict__ rstd,
                                const T* __restrict__ dy, T* __restrict__ dx, T* __restrict__ also,
                                bool also_add, int64_t N, int C, int64_t rows_per_block,
                                float* __restrict__ partial) {
  constexpr int kV = kPack<T>;
  constexpr int K = kLN ? 2 : 1;
  constexpr int kE = kPacks * kV;
  using Pk = Pack<T, kV>;
  extern __shared__ uint4 ring[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int ops = staged_operands(dx != nullptr, kAlso && also_add);
  const StagedRows<T, kPacks> rows{
      ring + warp * kStages * ops * kPacks * 32 + lane, ops, C, lane, x, dy, dx, also};
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * rows_per_block;
  const int64_t r1 = r0 + rows_per_block < N ? r0 + rows_per_block : N;
  float acc[K][kE] = {};
  // kSum: this warp's dx column sums, after the ring (or the tree's slots if larger).
  float* sums = reinterpret_cast<float*>(reinterpret_cast<unsigned char*>(ring) +
                                         staged_smem_bytes<T, kPacks, kLN>(ops)) +
                warp * kE * 32 + lane;
  if constexpr (kSum) {
#pragma unroll
    for (int e = 0; e < kE; ++e) sums[e * 32] = 0.0f;
  }
  int64_t row = r0 + warp;
  float m_next = 0.0f, r_next = 0.0f;
  if (row < r1) {
    rows.stage(row, 0);
    m_next = kLN ? mean[row] : 0.0f;
    r_next = rstd[row];
  }
  for (int s = 0; row < r1; row += kRowsPerBlock, s ^= 1) {  // warp-uniform
    const float m = m_next, r = r_next;
    const int64_t next = row + kRowsPerBlock;
    if (next < r1) {
      rows.stage(next, s ^ 1);
      m_next = kLN ? mean[next] : 0.0f;
      r_next = rstd[next];
    } else {
      cp_async_commit();  // an empty group: the wait below still means "this row has landed"
    }
    staged_wait<1>();
    Pk xs[kPacks], ds[kPacks];
#pragma unroll
    for (int j = 0; j < kPacks; ++j) {
      if ((lane + 32 * j) * kV >= C) continue;
      xs[j] = rows.get(s, 0, j);
      ds[j] = rows.get(s, 1, j);
    }
    float sum_g = 0.0f, sum_gx = 0.0f;
    lane_row_terms<T, P, kV, kPacks, kLN>(xs, ds, gamma, m, r, C, lane, acc, sum_g, sum_gx);
    if (dx == nullptr) continue;
    const float mean_g = kLN ? warp_sum(sum_g) / static_cast<float>(C) : 0.0f;
    const float mean_gx = warp_sum(sum_gx) / static_cast<float>(C);
#pragma unroll
    for (int j = 0; j < kPacks; ++j) {
      const int c = (lane + 32 * j) * kV;
      if (c >= C) continue;
      float out[kV];
      lane_dx_terms<T, P, kV>(xs[j], ds[j], gamma + c, m, r, mean_g, mean_gx, out);
      const Pk prev = ops > 3 ? rows.get(s, 3, j) : Pk{};
      float stored[kV];
      write_staged_dx<kAlso>(dx, also, also_add, row * C + c, rows.get(s, 2, j), prev, out, stored);
      if constexpr (kSum) {
#pragma unroll
        for (int e = 0; e < kV; ++e) sums[(j * kV + e) * 32] += stored[e];
      }
    }
  }
  staged_wait<0>();
  __syncthreads();  // every warp is done with its ring: it becomes the tree's slots
  block_partials<kV, kPacks, K>(acc, reinterpret_cast<float*>(ring), C, partial);
  if constexpr (kSum) {
    float dxs[1][kE];
#pragma unroll
    for (int e = 0; e < kE; ++e) dxs[0][e] = sums[e * 32];
    __syncthreads();  // warp 0's tree reads above are done before the slots are reused
    block_partials<kV, kPacks, 1>(dxs, reinterpret_cast<float*>(ring), C,
                                  partial + K * static_cast<int64_t>(gridDim.x) * C);
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

// The largest dynamic shared memory a block may opt into on the current device.
int smem_optin_bytes() {
  static const int bytes = [] {
    int dev = 0, optin = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    return optin;
  }();
  return bytes;
}

// Launches the staged kernel (Note [staged norm backward]) if its shared memory fits the device;
// false: not launched. kSum: the dx partials too (Note [norm dx partials]).
template <typename T, typename P, int kPacks, bool kLN, bool kAlso, bool kSum>
bool launch_staged(const T* x, const P* gamma, const float* mean, const float* rstd, const T* dy,
                   T* dx, DxAlso<T> also, float* scratch, int64_t N, int64_t C, cudaStream_t st) {
  constexpr auto kernel = norm_backward_staged_kernel<T, P, kPacks, kLN, kAlso, kSum>;
  const int most = staged_smem_bytes<T, kPacks, kLN, kSum>(staged_operands(true, kAlso));
  if (most > smem_optin_bytes()) return false;
  static std::atomic<uint64_t> devices{0};  // where the kernel may take `most` bytes already
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  const uint64_t bit = dev < 64 ? uint64_t{1} << dev : 0;
  if (bit == 0 || (devices.load(std::memory_order_relaxed) & bit) == 0) {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, most));
    // All of the unified L1 as shared memory, so two blocks' rings fit on an SM (the kernel's L1
    // traffic is gamma and the row statistics).
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                    cudaSharedmemCarveoutMaxShared));
    devices.fetch_or(bit, std::memory_order_relaxed);
  }
  const int bytes =
      staged_smem_bytes<T, kPacks, kLN, kSum>(staged_operands(dx != nullptr, kAlso && also.add));
  kernel<<<static_cast<unsigned>(norm_chunks(N)), kRowsPerBlock * 32, bytes, st>>>(
      x, gamma, mean, rstd, dy, dx, also.p, also.add, N, static_cast<int>(C), norm_chunk_rows(N),
      scratch);
  CUDA_CHECK_LAUNCH();
  return true;
}

// The one-pass backward (Note [one-pass norm backward]) with kPacks packs of kV a lane, staged
// where the switch and the pack allow (Note [staged norm backward]), then the finish of the
// partials into dgamma and dbeta. sum_dx: also the dx partials where the staged kernel runs (Note
// [norm dx partials]); returns whether they were written.
template <typename T, typename P, int kV, int kPacks, bool kLN, bool kAlso>
bool launch_fused(const T* x, const P* gamma, const float* mean, const float* rstd, const T* dy,
                  T* dx, DxAlso<T> also, float* dgamma, float* dbeta, float* scratch, int64_t N,
                  int64_t C, cudaStream_t st, bool sum_dx) {
  const int64_t chunks = norm_chunks(N);
  bool staged = false, summed = false;
  if constexpr (kV == kPack<T>) {
    // bf16 rows only: f32 rows staged this way differed from the reference in dx (H200).
    if (norm_fast() && std::is_same_v<T, bf16>) {
      if constexpr (!kAlso) {
        summed = sum_dx && dx != nullptr &&
                 launch_staged<T, P, kPacks, kLN, kAlso, true>(x, gamma, mean, rstd, dy, dx, also,
                                                               scratch, N, C, st);
      }
      staged = summed || launch_staged<T, P, kPacks, kLN, kAlso, false>(
                             x, gamma, mean, rstd, dy, dx, also, scratch, N, C, st);
    }
  }
  if (!staged) {
    norm_backward_fused_kernel<T, P, kV, kPacks, kLN, kAlso>
        <<<static_cast<unsigned>(chunks), kRowsPerBlock * 32, 0, st>>>(
            x, gamma, mean, rstd, dy, dx, also.p, also.add, N, static_cast<int>(C),
            norm_chunk_rows(N), scratch);
    CUDA_CHECK_LAUNCH();
  }
  column_tree_finish<kLN ? 2 : 1>(scratch, chunks, C, dgamma, dbeta, st);
  return summed;
}

// Runs the one-pass backward if the shape is covered (see the note); false: not launched.
// *summed: whether the dx partials were written (sum_dx; Note [norm dx partials]).
template <typename T, typename P, bool kLN, bool kAlso>
bool try_fused_backward(const T* x, const P* gamma, const float* mean, const float* rstd,
                        const T* dy, T* dx, DxAlso<T> also, float* dgamma, float* dbeta,
                        float* scratch, int64_t N, int64_t C, cudaStream_t st, bool sum_dx,
                        bool* summed) {
  constexpr int kV = kPack<T>;
  auto run = [&](auto v, auto packs) {
    *summed = launch_fused<T, P, decltype(v)::value, decltype(packs)::value, kLN, kAlso>(
        x, gamma, mean, rstd, dy, dx, also, dgamma, dbeta, scratch, N, C, st, sum_dx);
    return true;
  };
  using Vec = std::integral_constant<int, kV>;
  using One = std::integral_constant<int, 1>;
  if (packed_backward<T, P>(x, dy, dx, gamma, C)) {
    return with_packs<4>(ceil_div<int64_t>(C / kV, 32), [&](auto packs) { run(Vec{}, packs); });
  }
  if (C > 32 * kFusedScalarElems) return false;
  return run(One{}, std::integral_constant<int, kFusedScalarElems>{});
}

// Returns whether the dx partials were written (sum_dx; Note [norm dx partials]).
template <typename T, typename P, bool kLN, bool kAlso = false>
bool launch_backward(const void* x, const void* gamma, const float* mean, const float* rstd,
                     const void* dy, void* dx, float* dgamma, float* dbeta, float* scratch,
                     int64_t N, int64_t C, void* stream, DxAlso<T> also = {}, bool sum_dx = false) {
  constexpr int kV = kPack<T>;
  const auto* xp = static_cast<const T*>(x);
  const auto* gp = static_cast<const P*>(gamma);
  const auto* dyp = static_cast<const T*>(dy);
  auto* dxp = static_cast<T*>(dx);
  auto st = static_cast<cudaStream_t>(stream);
  bool summed = false;
  if ((dgamma != nullptr || dbeta != nullptr) &&
      try_fused_backward<T, P, kLN, kAlso>(xp, gp, mean, rstd, dyp, dxp, also, dgamma, dbeta,
                                           scratch, N, C, st, sum_dx, &summed)) {
    return summed;
  }
  if (dx != nullptr) {
    const auto blocks = static_cast<unsigned>(ceil_div<int64_t>(N, kRowsPerBlock));
    const int c = static_cast<int>(C);
    const bool packed = packed_backward<T, P>(x, dy, dx, gamma, C);
    bool resident = false;  // Note [resident norm dx]; the loop kernel is the reference
    if constexpr (std::is_same_v<T, bf16>) {
      resident =
          packed && norm_fast() && with_packs<8>(ceil_div<int64_t>(C / kV, 32), [&](auto k) {
            norm_backward_dx_resident_kernel<T, P, decltype(k)::value, kLN, kAlso>
                <<<static_cast<unsigned>(ceil_div<int64_t>(N, kResidentRows)), kResidentRows * 32,
                   0, st>>>(xp, gp, mean, rstd, dyp, dxp, also.p, also.add, N, c);
          });
    }
    if (resident) {
    } else if (packed) {
      norm_backward_dx_kernel<T, P, kV, kLN, kAlso><<<blocks, kRowsPerBlock * 32, 0, st>>>(
          xp, gp, mean, rstd, dyp, dxp, also.p, also.add, N, c);
    } else {
      norm_backward_dx_kernel<T, P, 1, kLN, kAlso><<<blocks, kRowsPerBlock * 32, 0, st>>>(
          xp, gp, mean, rstd, dyp, dxp, also.p, also.add, N, c);
    }
    CUDA_CHECK_LAUNCH();
  }
  if constexpr (std::is_same_v<T, bf16>) {
    // Note [packed norm parameter partials]; the generic kernel stays the reference.
    if ((dgamma != nullptr || dbeta != nullptr) && norm_fast() && N > 0 && C % kV == 0 &&
        is_aligned(x, 16) && is_aligned(dy, 16)) {
      const int64_t chunks = column_chunks(N);
      const dim3 grid(static_cast<unsigned>(ceil_div<int64_t>(C / kV, kColTile)),
                      static_cast<unsigned>(chunks));
      norm_param_partials_kernel<T, kV, kLN><<<grid, dim3(kColTile, kColLanes), 0, st>>>(
          xp, dyp, mean, rstd, N, C, ceil_div<int64_t>(N, chunks), scratch);
      CUDA_CHECK_LAUNCH();
      column_tree_finish<kLN ? 2 : 1>(scratch, chunks, C, dgamma, dbeta, st);
      return false;
    }
  }
  column_sums<kLN ? 2 : 1>(NormParamTerm<T, kLN>{xp, dyp, mean, rstd, C}, N, C, scratch, dgamma,
                           dbeta, st);
  return false;
}

}  // namespace

// Either path's partials: the one-pass kernel's [K (+ 1 with the dx partials)][norm_chunks(N)][C]
// or the column sums'.
int64_t layernorm_backward_scratch_floats(int64_t N, int64_t C) {
  return std::max(column_scratch_floats(N, C, 2), 3 * norm_chunks(N) * C);
}

int64_t layernorm_dx_partial_chunks(int64_t N) { return norm_chunks(N); }

int64_t rmsnorm_backward_scratch_floats(int64_t N, int64_t C) {
  return std::max(column_scratch_floats(N, C, 1), norm_chunks(N) * C);
}

bool layernorm_backward(const void* x, const void* gamma, DType param, const float* mean,
                        const float* rstd, const void* dy, void* dx, float* dgamma, float* dbeta,
                        float* scratch, int64_t N, int64_t C, DType act, void* stream,
                        bool dx_partials) {
  check_norm_sizes("layernorm", N, C);
  if (N == 0 || C == 0) return false;
  bool summed = false;
  dispatch_act_param("layernorm", act, param, [&](auto t, auto p) {
    using T = decltype(t);
    summed = launch_backward<T, decltype(p), true>(x, gamma, mean, rstd, dy, dx, dgamma, dbeta,
                                                   scratch, N, C, stream, DxAlso<T>{}, dx_partials);
  });
  return summed;
}

namespace {

// The backward of the fused residual add and LayerNorm (kLN) or RMSNorm (Note [fused residual add
// and LayerNorm]): the norm's dx added into dh in place, the sum stored into (added into) `also`.
template <bool kLN>
void add_norm_backward(const char* op, const void* h, const void* gamma, DType param,
                       const float* mean, const float* rstd, const void* dy, void* dh, void* also,
                       bool also_add, float* dgamma, float* dbeta, float* scratch, int64_t N,
                       int64_t C, DType act, void* stream) {
  check_norm_sizes(op, N, C);
  if (N == 0 || C == 0) return;
  GTRON_CHECK(dh != nullptr && dh != also, op, " backward: dh must be its own buffer");
  dispatch_act_param(op, act, param, [&](auto t, auto p) {
    using T = decltype(t);
    using P = decltype(p);
    // Folded where the pack width allows (an unaligned `also` under 16-byte packs: a second pass).
    if (also != nullptr && (is_aligned(also, 16) || !packed_backward<T, P>(h, dy, dh, gamma, C))) {
      launch_backward<T, P, kLN, true>(h, gamma, mean, rstd, dy, dh, dgamma, dbeta, scratch, N, C,
                                       stream, DxAlso<T>{static_cast<T*>(also), also_add});
      return;
    }
    launch_backward<T, P, kLN>(h, gamma, mean, rstd, dy, dh, dgamma, dbeta, scratch, N, C, stream);
    if (also == nullptr) return;
    if (also_add) {
      accumulate(also, dh, N * C, act, stream);
    } else {
      CUDA_CHECK(cudaMemcpyAsync(also, dh, static_cast<size_t>(N * C) * sizeof(T),
                                 cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(stream)));
    }
  });
}

}  // namespace

void add_layernorm_backward(const void* h, const void* gamma, DType param, const float* mean,
                            const float* rstd, const void* dy, void* dh, void* also, bool also_add,
                            float* dgamma, float* dbeta, float* scratch, int64_t N, int64_t C,
                            DType act, void* stream) {
  add_norm_backward<true>("add_layernorm", h, gamma, param, mean, rstd, dy, dh, also, also_add,
                          dgamma, dbeta, scratch, N, C, act, stream);
}

void add_rmsnorm_backward(const void* h, const void* gamma, DType param, const float* rrms,
                          const void* dy, void* dh, void* also, bool also_add, float* dgamma,
                          float* scratch, int64_t N, int64_t C, DType act, void* stream) {
  add_norm_backward<false>("add_rmsnorm", h, gamma, param, nullptr, rrms, dy, dh, also, also_add,
                           dgamma, nullptr, scratch, N, C, act, stream);
}

void rmsnorm_backward(const void* x, const void* gamma, DType param, const float* rrms,
                      const void* dy, void* dx, float* dgamma, float* scratch, int64_t N, int64_t C,
                      DType act, void* stream) {
  check_norm_sizes("rmsnorm", N, C);
  if (N == 0 || C == 0) return;
  dispatch_act_param("rmsnorm", act, param, [&](auto t, auto p) {
    launch_backward<decltype(t), decltype(p), false>(x, gamma, nullptr, rrms, dy, dx, dgamma,
                                                     nullptr, scratch, N, C, stream);
  });
}

}  // namespace gtron::cuda

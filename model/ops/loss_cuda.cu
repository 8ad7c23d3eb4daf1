// Cross-entropy on CUDA (scale: scale_cuda.cu).
//
// Cross-entropy runs three kernels, all stream-ordered, none needing a host sync:
// 1. count (one block): counts unmasked rows into count[0] and traps on a bad target.
// 2. rows (one block per row): an online max / sum-of-exp over the first V columns in one read
//    (each thread keeps (m, s) and rescales s when m grows; the block then merges the pairs in a
//    fixed xor-butterfly tree), writing rmax and rlse. In the fused mode a second walk over the row
//    (an L2 hit) turns each logit into its probability once and accumulates the gradient.
// 3. finalize (one block): loss = Σ_rows (rlse − (logit[target] − rmax)) / count, in a fixed order.
// The backward kernels recompute p = exp(logit − rmax − rlse) from the statistics (logit_grad).
// The one-pass kernel (Note [one-pass cross-entropy], loss.h) does 2. and the in-place backward
// together when the loss's upstream gradient is known at forward time. Masked rows (kMaskedTarget)
// are skipped everywhere; the padded tail [V, Vp) is never read (the in-place gradients write zeros
// over it). The vocab-parallel CE (model/ops/vocab_parallel.cc) runs the same rows kernel over a
// rank's columns (writing the sum, not its log), reduces over TP, then the same finalize: at TP = 1
// every value is the single-GPU path's, bit for bit.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "model/cuda/kernel_util.cuh"
#include "model/cuda/mma_tile.cuh"
#include "model/ops/loss.h"

namespace gtron::cuda {

namespace {

constexpr int kRowThreads = 256;
constexpr int kOneBlock = 1024;

constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ void online_update(float& m, float& s, float x) {
  if (x > m) {
    s = s * expf(m - x) + 1.0f;  // m = −inf at start: s = 0·0 + 1
    m = x;
  } else {
    s += expf(x - m);
  }
}

// The online update for a pack of kV values: one rescale per pack (when its max is new), then
// one exp2 per value (the special-function unit alone; see fast_exp2).
template <int kV>
__device__ __forceinline__ void online_update_pack(float& m, float& s, const float (&v)[kV]) {
  float pm = v[0];
#pragma unroll
  for (int k = 1; k < kV; ++k) pm = fmaxf(pm, v[k]);
  if (pm > m) {
    s *= fast_exp2((m - pm) * kLog2e);  // m = −inf at start: s = 0·0
    m = pm;
  }
  const float ml = m * kLog2e;
#pragma unroll
  for (int k = 0; k < kV; ++k) s += fast_exp2(fmaf(v[k], kLog2e, -ml));
}

// Merges (om, os) into (m, s). Symmetric up to commutative additions, so both lanes of a
// butterfly pair end with the same bits.
__device__ __forceinline__ void merge(float& m, float& s, float om, float os) {
  const float M = fmaxf(m, om);
  if (M == -INFINITY) return;  // both sides empty
  s = s * expf(m - M) + os * expf(om - M);
  m = M;
}

__device__ __forceinline__ void warp_merge(float& m, float& s) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float om = __shfl_xor_sync(0xffffffffu, m, o);
    const float os = __shfl_xor_sync(0xffffffffu, s, o);
    merge(m, s, om, os);
  }
}

__global__ void count_kernel(const int32_t* __restrict__ targets, int64_t N, int64_t V,
                             int32_t* __restrict__ count) {
  int total = 0;
  for (int64_t base = 0; base < N; base += blockDim.x) {
    const int64_t i = base + threadIdx.x;
    int32_t t = kMaskedTarget;
    if (i < N) t = targets[i];
    if (t != kMaskedTarget && (t < 0 || t >= V)) {
      printf("cross_entropy: target %d at row %lld outside [0, %lld) and not masked\n", t,
             static_cast<long long>(i), static_cast<long long>(V));
      __trap();
    }
    total += __syncthreads_count(t != kMaskedTarget);
  }
  if (threadIdx.x == 0) count[0] = total;
}

// The gradient of one logit x: (softmax − onehot)·g with p = 2^(x·log2 e − ml),
// ml = (row max + lse)·log2 e. Every gradient kernel forms it this way, so they agree bit for bit.
__device__ __forceinline__ float logit_grad(float x, float ml, bool target, float g) {
  return (fast_exp2(fmaf(x, kLog2e, -ml)) - (target ? 1.0f : 0.0f)) * g;
}

// The row max m and Σ exp(logit − m) s over row[0, V), returned to every thread of the block (the
// rows and one-pass kernels share it, so their statistics agree bit for bit for one block size).
// `warp_m`, `warp_s`: 32 floats of shared memory each.
template <typename T, int kV>
__device__ __forceinline__ void row_stats(const T* row, int64_t V, float* warp_m, float* warp_s,
                                          float& m, float& s) {
  const int64_t vec_end = V / kV * kV;
  const int64_t step = static_cast<int64_t>(blockDim.x) * kV;
  m = -INFINITY;
  s = 0.0f;
  for (int64_t j = static_cast<int64_t>(threadIdx.x) * kV; j < vec_end; j += step) {
    float v[kV];
    load_floats<kV>(row + j, v);
    online_update_pack<kV>(m, s, v);
  }
  for (int64_t j = vec_end + threadIdx.x; j < V; j += blockDim.x)
    online_update(m, s, to_float(row[j]));
  warp_merge(m, s);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) {
    warp_m[warp] = m;
    warp_s[warp] = s;
  }
  __syncthreads();
  const bool has = lane < static_cast<int>(blockDim.x / 32);
  m = has ? warp_m[lane] : -INFINITY;
  s = has ? warp_s[lane] : 0.0f;
  warp_merge(m, s);  // every warp merges the same values: all threads agree
}

// One block per row. kGrad: also accumulate the gradient (the fused mode).
template <typename T, int kV, bool kGrad>
__global__ void rows_kernel(const T* __restrict__ logits, const int32_t* __restrict__ targets,
                            float* __restrict__ rmax, float* __restrict__ rlse,
                            const int32_t* __restrict__ count, T* __restrict__ dlogits,
                            const float* __restrict__ dloss, int64_t V, int64_t Vp,
                            bool write_sum) {
  __shared__ float warp_m[32], warp_s[32];
  const int64_t i = blockIdx.x;
  const int32_t tgt = targets[i];
  if (tgt == kMaskedTarget) return;  // the whole block leaves together
  const T* row = logits + i * Vp;
  const int64_t vec_end = V / kV * kV;
  const int64_t step = static_cast<int64_t>(blockDim.x) * kV;
  float m, s;
  row_stats<T, kV>(row, V, warp_m, warp_s, m, s);
  const float lse = logf(s);
  if (threadIdx.x == 0) {
    rmax[i] = m;
    rlse[i] = write_sum ? s : lse;  // write_sum: the vocab-parallel CE reduces s over TP first
  }
  if constexpr (kGrad) {
    const float g = dloss[0] / static_cast<float>(count[0]);
    const float ml = (m + lse) * kLog2e;
    T* drow = dlogits + i * Vp;
    for (int64_t j = static_cast<int64_t>(threadIdx.x) * kV; j < vec_end; j += step) {
      float v[kV];
      load_floats<kV>(row + j, v);
#pragma unroll
      for (int k = 0; k < kV; ++k) v[k] = logit_grad(v[k], ml, j + k == tgt, g);
      add_floats<kV>(drow + j, v);
    }
    for (int64_t j = vec_end + threadIdx.x; j < V; j += blockDim.x) {
      drow[j] = from_float<T>(to_float(drow[j]) + logit_grad(to_float(row[j]), ml, j == tgt, g));
    }
  }
}

template <typename T>
__global__ void finalize_kernel(const T* __restrict__ logits, const int32_t* __restrict__ targets,
                                const float* __restrict__ rmax, const float* __restrict__ rlse,
                                const int32_t* __restrict__ count, float* __restrict__ loss,
                                const float* __restrict__ tlogit, int64_t N, int64_t Vp) {
  __shared__ float smem[32];
  float part = 0.0f;
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
    const int32_t t = targets[i];
    if (t == kMaskedTarget) continue;
    // −log softmax[target] = log Σ exp(l − m) − (l[target] − m); tlogit: the target logits given
    const float lt = tlogit != nullptr ? tlogit[i] : to_float(logits[i * Vp + t]);
    part += rlse[i] - (lt - rmax[i]);
  }
  const float total = block_sum(part, smem);
  if (threadIdx.x == 0) {
    const int32_t n = count[0];
    loss[0] = n > 0 ? total / static_cast<float>(n) : 0.0f;
  }
}

// Row `src`'s gradient written into `dst`: (softmax − onehot)·g over [0, V) with
// p = 2^(x·log2 e − ml), zeros over the tail [V, Vp), zeros everywhere when `masked`; with kAdd
// added to what `dst` holds. `dst` may be `src` (each element is read, then written, by the same
// thread; hence no __restrict__), or `src` a shared-memory copy of the row.
template <typename T, int kV, bool kAdd = false>
__device__ __forceinline__ void write_row_grad(const T* src, T* dst, int64_t tgt, float ml, float g,
                                               bool masked, int64_t V, int64_t Vp) {
  const int64_t vec_end = V / kV * kV;
  for (int64_t j = static_cast<int64_t>(threadIdx.x) * kV; j < vec_end;
       j += static_cast<int64_t>(blockDim.x) * kV) {
    float v[kV];
    load_floats<kV>(src + j, v);
#pragma unroll
    for (int k = 0; k < kV; ++k) {
      v[k] = masked ? 0.0f : logit_grad(v[k], ml, j + k == tgt, g);
    }
    if constexpr (kAdd) {
      add_floats<kV>(dst + j, v);
    } else {
      store_floats<kV>(dst + j, v);
    }
  }
  for (int64_t j = vec_end + threadIdx.x; j < Vp; j += blockDim.x) {
    const float p = masked || j >= V ? 0.0f : logit_grad(to_float(src[j]), ml, j == tgt, g);
    dst[j] = from_float<T>(kAdd ? to_float(dst[j]) + p : p);
  }
}

// The out-of-place backward: dlogits row i += its gradient over [0, V); masked rows untouched.
template <typename T, int kV>
__global__ void backward_kernel(const T* __restrict__ logits, const int32_t* __restrict__ targets,
                                const float* __restrict__ rmax, const float* __restrict__ rlse,
                                const int32_t* __restrict__ count, const float* __restrict__ dloss,
                                T* __restrict__ dlogits, int64_t V, int64_t Vp, int64_t v0) {
  const int64_t i = blockIdx.x;
  if (targets[i] == kMaskedTarget) return;
  const int64_t tgt = targets[i] - v0;  // this rank's column of the target (vocab-parallel)
  const float g = dloss[0] / static_cast<float>(count[0]);
  const float ml = (rmax[i] + rlse[i]) * kLog2e;
  write_row_grad<T, kV, true>(logits + i * Vp, dlogits + i * Vp, tgt, ml, g, false, V, V);
}

// The in-place backward: row i of `logits` becomes its gradient (softmax − onehot)·dloss/count over
// [0, V), zeros over the tail [V, Vp) and over masked rows.
template <typename T, int kV>
__global__ void backward_inplace_kernel(T* logits, const int32_t* __restrict__ targets,
                                        const float* __restrict__ rmax,
                                        const float* __restrict__ rlse,
                                        const int32_t* __restrict__ count,
                                        const float* __restrict__ dloss, int64_t V, int64_t Vp,
                                        int64_t v0) {
  const int64_t i = blockIdx.x;
  const bool masked = targets[i] == kMaskedTarget;
  const int64_t tgt = targets[i] - v0;  // this rank's column of the target (vocab-parallel)
  T* row = logits + i * Vp;
  const float g = masked ? 0.0f : dloss[0] / static_cast<float>(count[0]);
  const float m = masked ? 0.0f : rmax[i];
  const float l = masked ? 0.0f : rlse[i];
  const float ml = (m + l) * kLog2e;  // p = 2^(x·log2 e − (m + lse)·log2 e)
  write_row_grad<T, kV>(row, row, tgt, ml, g, masked, V, Vp);
}

// The one-pass kernel: Note [one-pass cross-entropy] in loss.h.
template <typename T, int kV, bool kStaged>
__global__ void __launch_bounds__(kRowThreads)
    onepass_kernel(T* logits, const int32_t* __restrict__ targets, float* __restrict__ rmax,
                   float* __restrict__ rlse, float* __restrict__ tlogit,
                   const int32_t* __restrict__ count, const float* __restrict__ seed, float weight,
                   int64_t V, int64_t Vp) {
  extern __shared__ uint4 staged[];  // kStaged: the row, Vp elements of T
  __shared__ float warp_m[32], warp_s[32];
  const int64_t i = blockIdx.x;
  const int32_t tgt = targets[i];
  T* row = logits + i * Vp;
  if (tgt == kMaskedTarget) {  // the whole block leaves together
    write_row_grad<T, kV>(row, row, tgt, 0.0f, 0.0f, true, V, Vp);
    return;
  }
  const T* src = row;
  if constexpr (kStaged) {
    T* copy = reinterpret_cast<T*>(staged);
    for (int64_t j = static_cast<int64_t>(threadIdx.x) * kV; j < Vp;
         j += static_cast<int64_t>(blockDim.x) * kV) {
      cp_async16(copy + j, row + j, true);
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    src = copy;
  }
  // Before row_stats' barrier, after which other threads overwrite the row (unstaged).
  if (threadIdx.x == 0) tlogit[i] = to_float(src[tgt]);
  float m, s;
  row_stats<T, kV>(src, V, warp_m, warp_s, m, s);
  const float lse = logf(s);
  if (threadIdx.x == 0) {
    rmax[i] = m;
    rlse[i] = lse;
  }
  const float g = seed[0] * weight / static_cast<float>(count[0]);
  write_row_grad<T, kV>(src, row, tgt, (m + lse) * kLog2e, g, false, V, Vp);
}

// The promise check of the one-pass backward: dloss[0] (what arrived) against seed[0]·weight (what
// the forward assumed). Equal: every thread leaves. Else g[0, n) *= dloss / (seed·weight), or,
// `strict` (a gradient already summed elsewhere, which no rescale can reach), a trap.
template <typename T, int kV>
__global__ void onepass_check_kernel(T* g, int64_t n, const float* __restrict__ seed, float weight,
                                     const float* __restrict__ dloss, bool strict = false) {
  const float had = seed[0] * weight, want = dloss[0];
  if (want == had) return;
  if (strict || had == 0.0f || !isfinite(had)) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
      printf("cross_entropy: the one-pass gradient assumed an upstream gradient of %g, got %g\n",
             had, want);
    }
    __trap();
  }
  const float r = want / had;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x * kV;
  for (int64_t e = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kV; e < n;
       e += stride) {
    if (e + kV <= n) {
      float v[kV];
      load_floats<kV>(g + e, v);
#pragma unroll
      for (int k = 0; k < kV; ++k) v[k] *= r;
      store_floats<kV>(g + e, v);
    } else {
      for (int64_t x = e; x < n; ++x) g[x] = from_float<T>(to_float(g[x]) * r);
    }
  }
}

// Vocab-parallel pieces (model/ops/vocab_parallel.h). After the group max: this rank's sum of
// exponentials moves to the group max (exactly itself where the max is its own: exp(0) = 1), and
// sums[N + i] gets the target logit where this rank holds the target column (else 0, so the group
// sum is that logit exactly).
template <typename T>
__global__ void vp_rescale_kernel(const T* __restrict__ logits, const int32_t* __restrict__ targets,
                                  const float* __restrict__ lmax, const float* __restrict__ gmax,
                                  float* __restrict__ sums, int64_t N, int64_t Vl, int64_t valid,
                                  int64_t v0) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N) return;
  if (targets[i] == kMaskedTarget) {
    sums[i] = 0.0f;
    sums[N + i] = 0.0f;
    return;
  }
  const float m = lmax[i], M = gmax[i];
  sums[i] = m == M ? sums[i] : (m == -INFINITY ? 0.0f : sums[i] * expf(m - M));
  const int64_t t = targets[i] - v0;
  sums[N + i] = t >= 0 && t < valid ? to_float(logits[i * Vl + t]) : 0.0f;
}

__global__ void log_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = logf(x[i]);  // the rows kernel's logf(s), on the same s
}

// Vector path: rows start 16-byte aligned and every pointer is.
template <typename T>
bool rows_packed(int64_t Vp, const void* logits, const void* dlogits) {
  return Vp % kPack<T> == 0 && is_aligned(logits, 16) && is_aligned(dlogits, 16);
}

// The largest row (bytes) the one-pass kernel stages in shared memory: the opt-in per-block limit
// less room for its static shared memory.
int staged_row_limit() {
  static const int limit = [] {
    int dev = 0, optin = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    return optin - 1024;
  }();
  return limit;
}

template <typename Kernel>
bool allow_staged_rows(Kernel k) {
  CUDA_CHECK(
      cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, staged_row_limit()));
  return true;
}

template <typename T>
void launch_onepass(T* logits, const int32_t* targets, float* rmax, float* rlse, float* tlogit,
                    const int32_t* count, const float* seed, float weight, int64_t N, int64_t V,
                    int64_t Vp, cudaStream_t st) {
  constexpr int kV = kPack<T>;
  const auto grid = static_cast<unsigned>(N);
  const int64_t bytes = Vp * static_cast<int64_t>(sizeof(T));
  if (!rows_packed<T>(Vp, logits, logits)) {
    onepass_kernel<T, 1, false><<<grid, kRowThreads, 0, st>>>(logits, targets, rmax, rlse, tlogit,
                                                              count, seed, weight, V, Vp);
  } else if (bytes <= staged_row_limit()) {
    static const bool once = allow_staged_rows(onepass_kernel<T, kV, true>);
    (void)once;
    onepass_kernel<T, kV, true><<<grid, kRowThreads, static_cast<size_t>(bytes), st>>>(
        logits, targets, rmax, rlse, tlogit, count, seed, weight, V, Vp);
  } else {
    onepass_kernel<T, kV, false><<<grid, kRowThreads, 0, st>>>(logits, targets, rmax, rlse, tlogit,
                                                               count, seed, weight, V, Vp);
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void cross_entropy_onepass(void* logits, const int32_t* targets, float* rmax, float* rlse,
                           float* tlogit, int32_t* count, float* loss, const float* seed,
                           float weight, int64_t N, int64_t V, int64_t Vp, DType act,
                           void* stream) {
  GTRON_CHECK(V > 0 && V <= Vp, "cross_entropy: V = ", V, " outside (0, Vp = ", Vp, "]");
  GTRON_CHECK(act == DType::kBF16, "cross_entropy_onepass: bf16 logits only, got ",
              dtype_name(act));
  cross_entropy_count(targets, count, N, V, stream);
  cross_entropy_onepass_rows(logits, targets, rmax, rlse, tlogit, count, seed, weight, N, V, Vp,
                             act, stream);
  cross_entropy_onepass_finalize(targets, rmax, rlse, tlogit, count, loss, N, stream);
}

void cross_entropy_onepass_rows(void* logits, const int32_t* targets, float* rmax, float* rlse,
                                float* tlogit, const int32_t* count, const float* seed,
                                float weight, int64_t rows, int64_t V, int64_t Vp, DType act,
                                void* stream) {
  GTRON_CHECK(V > 0 && V <= Vp && act == DType::kBF16, "cross_entropy_onepass_rows: V = ", V,
              ", Vp = ", Vp, ", ", dtype_name(act), " (bf16 logits only)");
  if (rows == 0) return;
  launch_onepass<bf16>(static_cast<bf16*>(logits), targets, rmax, rlse, tlogit, count, seed, weight,
                       rows, V, Vp, static_cast<cudaStream_t>(stream));
}

void cross_entropy_onepass_finalize(const int32_t* targets, const float* rmax, const float* rlse,
                                    const float* tlogit, const int32_t* count, float* loss,
                                    int64_t N, void* stream) {
  // The target logits are given (tlogit): the logits already hold the gradient.
  finalize_kernel<bf16><<<1, kOneBlock, 0, static_cast<cudaStream_t>(stream)>>>(
      nullptr, targets, rmax, rlse, count, loss, tlogit, N, 0);
  CUDA_CHECK_LAUNCH();
}

void cross_entropy_promise_check(const float* seed, float weight, const float* dloss,
                                 void* stream) {
  onepass_check_kernel<bf16, 1>
      <<<1, 32, 0, static_cast<cudaStream_t>(stream)>>>(nullptr, 0, seed, weight, dloss, true);
  CUDA_CHECK_LAUNCH();
}

void cross_entropy_onepass_check(void* dlogits, int64_t n, const float* seed, float weight,
                                 const float* dloss, DType act, void* stream) {
  if (n == 0) return;
  dispatch_act("cross_entropy", act, [&](auto tag) {
    using T = decltype(tag);
    constexpr int kV = kPack<T>;
    auto* gp = static_cast<T*>(dlogits);
    auto st = static_cast<cudaStream_t>(stream);
    // Few blocks: in the normal case every thread only compares two scalars.
    constexpr int64_t kMaxBlocks = 264;
    if (is_aligned(dlogits, 16)) {
      const int64_t blocks = std::min(kMaxBlocks, ceil_div<int64_t>(ceil_div<int64_t>(n, kV), 256));
      onepass_check_kernel<T, kV>
          <<<static_cast<unsigned>(blocks), 256, 0, st>>>(gp, n, seed, weight, dloss);
    } else {
      const int64_t blocks = std::min(kMaxBlocks, ceil_div<int64_t>(n, 256));
      onepass_check_kernel<T, 1>
          <<<static_cast<unsigned>(blocks), 256, 0, st>>>(gp, n, seed, weight, dloss);
    }
    CUDA_CHECK_LAUNCH();
  });
}

void cross_entropy_forward(const void* logits, const int32_t* targets, float* rmax, float* rlse,
                           int32_t* count, float* loss, void* dlogits, const float* dloss,
                           int64_t N, int64_t V, int64_t Vp, DType act, void* stream) {
  GTRON_CHECK(V > 0 && V <= Vp, "cross_entropy: V = ", V, " outside (0, Vp = ", Vp, "]");
  GTRON_CHECK(dlogits == nullptr || dloss != nullptr, "cross_entropy: fused mode needs dloss");
  auto st = static_cast<cudaStream_t>(stream);
  count_kernel<<<1, kOneBlock, 0, st>>>(targets, N, V, count);
  CUDA_CHECK_LAUNCH();
  dispatch_act("cross_entropy", act, [&](auto tag) {
    using T = decltype(tag);
    constexpr int kV = kPack<T>;
    const auto* lp = static_cast<const T*>(logits);
    auto* dp = static_cast<T*>(dlogits);
    if (N > 0) {
      const bool packed = rows_packed<T>(Vp, logits, dlogits);
      const auto grid = static_cast<unsigned>(N);
      if (dlogits != nullptr && packed) {
        rows_kernel<T, kV, true>
            <<<grid, kRowThreads, 0, st>>>(lp, targets, rmax, rlse, count, dp, dloss, V, Vp, false);
      } else if (dlogits != nullptr) {
        rows_kernel<T, 1, true>
            <<<grid, kRowThreads, 0, st>>>(lp, targets, rmax, rlse, count, dp, dloss, V, Vp, false);
      } else if (packed) {
        rows_kernel<T, kV, false>
            <<<grid, kRowThreads, 0, st>>>(lp, targets, rmax, rlse, count, dp, dloss, V, Vp, false);
      } else {
        rows_kernel<T, 1, false>
            <<<grid, kRowThreads, 0, st>>>(lp, targets, rmax, rlse, count, dp, dloss, V, Vp, false);
      }
      CUDA_CHECK_LAUNCH();
    }
    finalize_kernel<T>
        <<<1, kOneBlock, 0, st>>>(lp, targets, rmax, rlse, count, loss, nullptr, N, Vp);
    CUDA_CHECK_LAUNCH();
  });
}

void cross_entropy_backward_inplace(void* logits, const int32_t* targets, const float* rmax,
                                    const float* rlse, const int32_t* count, const float* dloss,
                                    int64_t N, int64_t V, int64_t Vp, DType act, void* stream,
                                    int64_t v0) {
  if (N == 0) return;
  dispatch_act("cross_entropy", act, [&](auto tag) {
    using T = decltype(tag);
    constexpr int kV = kPack<T>;
    auto* lp = static_cast<T*>(logits);
    auto st = static_cast<cudaStream_t>(stream);
    const auto grid = static_cast<unsigned>(N);
    if (rows_packed<T>(Vp, logits, logits)) {
      backward_inplace_kernel<T, kV>
          <<<grid, kRowThreads, 0, st>>>(lp, targets, rmax, rlse, count, dloss, V, Vp, v0);
    } else {
      backward_inplace_kernel<T, 1>
          <<<grid, kRowThreads, 0, st>>>(lp, targets, rmax, rlse, count, dloss, V, Vp, v0);
    }
    CUDA_CHECK_LAUNCH();
  });
}

void cross_entropy_backward(const void* logits, const int32_t* targets, const float* rmax,
                            const float* rlse, const int32_t* count, const float* dloss,
                            void* dlogits, int64_t N, int64_t V, int64_t Vp, DType act,
                            void* stream, int64_t v0) {
  if (N == 0) return;
  dispatch_act("cross_entropy", act, [&](auto tag) {
    using T = decltype(tag);
    constexpr int kV = kPack<T>;
    const auto* lp = static_cast<const T*>(logits);
    auto* dp = static_cast<T*>(dlogits);
    auto st = static_cast<cudaStream_t>(stream);
    const auto grid = static_cast<unsigned>(N);
    if (rows_packed<T>(Vp, logits, dlogits)) {
      backward_kernel<T, kV>
          <<<grid, kRowThreads, 0, st>>>(lp, targets, rmax, rlse, count, dloss, dp, V, Vp, v0);
    } else {
      backward_kernel<T, 1>
          <<<grid, kRowThreads, 0, st>>>(lp, targets, rmax, rlse, count, dloss, dp, V, Vp, v0);
    }
    CUDA_CHECK_LAUNCH();
  });
}

void cross_entropy_count(const int32_t* targets, int32_t* count, int64_t N, int64_t V,
                         void* stream) {
  count_kernel<<<1, kOneBlock, 0, static_cast<cudaStream_t>(stream)>>>(targets, N, V, count);
  CUDA_CHECK_LAUNCH();
}

void cross_entropy_row_sums(const void* logits, const int32_t* targets, float* rmax, float* rsum,
                            int64_t N, int64_t V, int64_t Vp, DType act, void* stream) {
  if (N == 0) return;
  GTRON_CHECK(V >= 0 && V <= Vp, "cross_entropy_row_sums: V = ", V, " outside [0, Vp = ", Vp, "]");
  dispatch_act("cross_entropy", act, [&](auto tag) {
    using T = decltype(tag);
    constexpr int kV = kPack<T>;
    const auto* lp = static_cast<const T*>(logits);
    auto st = static_cast<cudaStream_t>(stream);
    const auto grid = static_cast<unsigned>(N);
    if (rows_packed<T>(Vp, logits, logits)) {
      rows_kernel<T, kV, false><<<grid, kRowThreads, 0, st>>>(lp, targets, rmax, rsum, nullptr,
                                                              nullptr, nullptr, V, Vp, true);
    } else {
      rows_kernel<T, 1, false><<<grid, kRowThreads, 0, st>>>(lp, targets, rmax, rsum, nullptr,
                                                             nullptr, nullptr, V, Vp, true);
    }
    CUDA_CHECK_LAUNCH();
  });
}

void vocab_parallel_rescale(const void* logits, const int32_t* targets, const float* lmax,
                            const float* gmax, float* sums, int64_t N, int64_t Vl, int64_t valid,
                            int64_t v0, DType act, void* stream) {
  if (N == 0) return;
  dispatch_act("vocab_parallel_cross_entropy", act, [&](auto tag) {
    using T = decltype(tag);
    const auto blocks = static_cast<unsigned>(ceil_div<int64_t>(N, 256));
    vp_rescale_kernel<T><<<blocks, 256, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const T*>(logits), targets, lmax, gmax, sums, N, Vl, valid, v0);
    CUDA_CHECK_LAUNCH();
  });
}

void vocab_parallel_finalize(const int32_t* targets, const float* gmax, const float* sums,
                             float* rlse, const int32_t* count, float* loss, int64_t N,
                             void* stream) {
  auto st = static_cast<cudaStream_t>(stream);
  if (N > 0) {
    log_kernel<<<static_cast<unsigned>(ceil_div<int64_t>(N, 256)), 256, 0, st>>>(sums, rlse, N);
    CUDA_CHECK_LAUNCH();
  }
  // The target logits are given (sums + N): the logits themselves are not read.
  finalize_kernel<float>
      <<<1, kOneBlock, 0, st>>>(nullptr, targets, gmax, rlse, count, loss, sums + N, N, 0);
  CUDA_CHECK_LAUNCH();
}

}  // namespace gtron::cuda

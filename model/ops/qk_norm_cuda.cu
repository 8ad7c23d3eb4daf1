// qk_rmsnorm on CUDA: one warp per (row, q or k head) for y and dx; the value heads are copied
// (forward) or their gradient added (backward) by an elementwise kernel. The gamma gradients are
// deterministic: fixed chunks of rows write per-chunk partials (rows and heads in order), then one
// pass sums the chunks in order.
//
// Note [packed q/k norm]
// Those kernels move one element per lane per load and the gamma-gradient pass runs N/64 blocks
// of one thread per column, each walking 64 rows × all heads in turn: on the H200, at the
// Qwen3-0.6B bench shape (N = 8192, 16 + 8 normed heads of 128, 28 layers) it took 14.2 ms of an
// 86 ms step, the forward 1.6 ms and the value copies 1.8 ms. They stay as the general path; when
// HS is 32·kPer (kPer = 1, 2, 4 or 8) and the tensors allow packs of kPer, the fast kernels run:
// - a lane owns kPer consecutive columns of a head and moves them as one pack (the forward: a
//   block a row, Note [q/k norm forward by rows]);
// - the backward computes dx and the gamma gradient in one pass: a fixed grid of warps (a function
//   of N and the head counts only) takes tasks w, w + warps, … in order, each lane adding its
//   columns' dy·x̂ into registers (q and k heads apart); a block adds its 8 warps in order into one
//   partial, and a finish kernel adds the partials in block order (in 32 fixed strided groups,
//   then the groups in order): deterministic, in another order than the general path's;
// - the value heads are copied or added in 16-byte packs.
// The fused backward's grid is at most 1024 blocks of 8 warps (kMaxGradBlocks): warps enough to
// keep the loads in flight that the bandwidth needs, partials few enough for a short finish. Its
// blocks are held to 32 registers a thread for HS <= 128 (kPer <= 4; ptxas spills nothing there),
// so 8 blocks fit an SM and the 1024 fill the H200's 132·8 = 1056 slots in one wave; at the 38
// registers ptxas chose unbounded (6 blocks a SM, 792 slots) the last 232 blocks would run as a
// second wave on a mostly idle GPU. The finish reads 1024·2·HS partials from L2 with 32 groups a
// column, 32 loads a thread.
#include <algorithm>
#include <initializer_list>
#include <type_traits>

#include "model/cuda/kernel_util.cuh"
#include "model/ops/qk_norm.h"
#include "model/ops/rope.h"
#include "model/ops/rope_math.cuh"

namespace gtron::cuda {

namespace {

constexpr int kWarps = 8;  // warps per block of the per-head kernels
constexpr int kChunkRows = 64;

template <typename T, typename P>
__global__ void forward_kernel(const T* __restrict__ x, const P* __restrict__ gq,
                               const P* __restrict__ gk, T* __restrict__ y,
                               float* __restrict__ rrms, int64_t N, int NH, int NKV, int64_t HS,
                               float eps) {
  const int normed = NH + NKV;
  const int64_t task = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (task >= N * normed) return;
  const int lane = threadIdx.x % 32;
  const int64_t i = task / normed;
  const int h = static_cast<int>(task % normed);
  const int64_t o = i * (NH + 2 * NKV) * HS + h * HS;
  const P* g = h < NH ? gq : gk;
  float ss = 0;
  for (int64_t c = lane; c < HS; c += 32) {
    const float v = to_float(x[o + c]);
    ss += v * v;
  }
  ss = warp_sum(ss);
  const float r = 1.0f / sqrtf(ss / static_cast<float>(HS) + eps);
  for (int64_t c = lane; c < HS; c += 32) {
    y[o + c] = from_float<T>(to_float(x[o + c]) * r * to_float(g[c]));
  }
  if (lane == 0) rrms[task] = r;
}

// The value heads: y = x (forward) or dx += dy (backward), over N rows of 2·NKV·HS columns.
template <typename T, bool kAccumulate>
__global__ void value_kernel(const T* __restrict__ src, T* __restrict__ dst, int64_t N, int64_t W,
                             int64_t first) {
  const int64_t cols = W - first;
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= N * cols) return;
  const int64_t k = (e / cols) * W + first + e % cols;
  if constexpr (kAccumulate) {
    dst[k] = from_float<T>(to_float(dst[k]) + to_float(src[k]));
  } else {
    dst[k] = src[k];
  }
}

template <typename T, typename P>
__global__ void dx_kernel(const T* __restrict__ x, const P* __restrict__ gq,
                          const P* __restrict__ gk, const float* __restrict__ rrms,
                          const T* __restrict__ dy, T* __restrict__ dx, int64_t N, int NH, int NKV,
                          int64_t HS, bool overwrite) {
  const int normed = NH + NKV;
  const int64_t task = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (task >= N * normed) return;
  const int lane = threadIdx.x % 32;
  const int64_t i = task / normed;
  const int h = static_cast<int>(task % normed);
  const int64_t o = i * (NH + 2 * NKV) * HS + h * HS;
  const P* g = h < NH ? gq : gk;
  const float r = rrms[task];
  float sum = 0;
  for (int64_t c = lane; c < HS; c += 32) {
    sum += to_float(dy[o + c]) * to_float(g[c]) * (to_float(x[o + c]) * r);
  }
  const float mean = warp_sum(sum) / static_cast<float>(HS);
  for (int64_t c = lane; c < HS; c += 32) {
    const float xh = to_float(x[o + c]) * r;
    const float d = r * (to_float(dy[o + c]) * to_float(g[c]) - xh * mean);
    dx[o + c] = from_float<T>(overwrite ? d : to_float(dx[o + c]) + d);
  }
}

// Block = one chunk of kChunkRows rows; thread c sums column c over the chunk's rows and heads,
// in order: partial[chunk][0][c] for the query heads, [1][c] for the key heads.
template <typename T>
__global__ void dgamma_partial_kernel(const T* __restrict__ x, const float* __restrict__ rrms,
                                      const T* __restrict__ dy, float* __restrict__ partial,
                                      int64_t N, int NH, int NKV, int64_t HS) {
  const int64_t c = threadIdx.x;
  if (c >= HS) return;
  const int normed = NH + NKV;
  const int64_t W = (NH + 2 * NKV) * HS;
  const int64_t lo = static_cast<int64_t>(blockIdx.x) * kChunkRows;
  const int64_t hi = lo + kChunkRows < N ? lo + kChunkRows : N;
  float aq = 0, ak = 0;
  for (int64_t i = lo; i < hi; ++i) {
    for (int h = 0; h < normed; ++h) {
      const int64_t k = i * W + h * HS + c;
      const float v = to_float(dy[k]) * (to_float(x[k]) * rrms[i * normed + h]);
      if (h < NH) {
        aq += v;
      } else {
        ak += v;
      }
    }
  }
  partial[(blockIdx.x * 2 + 0) * HS + c] = aq;
  partial[(blockIdx.x * 2 + 1) * HS + c] = ak;
}

__global__ void dgamma_finish_kernel(const float* __restrict__ partial, float* __restrict__ dgq,
                                     float* __restrict__ dgk, int64_t chunks, int64_t HS) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= HS) return;
  float aq = 0, ak = 0;
  for (int64_t j = 0; j < chunks; ++j) {
    aq += partial[(j * 2 + 0) * HS + c];
    ak += partial[(j * 2 + 1) * HS + c];
  }
  if (dgq != nullptr) dgq[c] += aq;
  if (dgk != nullptr) dgk[c] += ak;
}

unsigned head_blocks(int64_t N, int NH, int NKV) {
  return static_cast<unsigned>(ceil_div<int64_t>(N * (NH + NKV), kWarps));
}

// Note [packed q/k norm]: the fast kernels.
constexpr int kMaxLanePer = 8;        // columns a lane owns (HS = 32·kPer <= 256)
constexpr int kMaxGradBlocks = 1024;  // blocks of the fused backward (8192 warps)
constexpr int kFinishGroups = 32;     // strided groups of the partials' finish

// Note [RoPE in the q/k norm] (model/ops/qk_norm.h): with kRope, the row's q and k heads leave
// rotated. A head's HS = 32·kPer columns split into halves of 16 lanes, so lane l's columns pair
// with lane l ^ 16's: a shuffle brings the partner's values, each lane keeps its own half of the
// pair. The values are rounded to T first, as the norm's stored output that RoPE would read.
//
// Note [q/k norm forward by rows]
// A block takes one row: its threads form the row's HS/2 angles once into shared memory (every
// head of the row rotates by the same ones), its warps take the normed heads w, w + 8, … two at a
// time (both heads' loads in flight before either's sum), and with kValues the block copies the
// row's value heads in 16-byte packs. One warp per (row, head), each forming its own angles, ran
// the Qwen3-0.6B bench shape's norms at about a third of the H100's bandwidth: 2.33 ms a step,
// and 0.36 more for the value copies; this kernel does both in 1.72 ms (H100, 28 layers; with it
// the Qwen3 shape went from 1.122x to 1.150x torch.compile's tokens/s). A head's sum, scale and
// rotation are the same arithmetic as before, per lane and in the same order.
template <typename T, typename P, int kPer, bool kRope>
__device__ __forceinline__ void norm_head(const P* __restrict__ g_ptr, T* __restrict__ yr,
                                          float (&v)[kPer], int lane, float eps, const float* s_sn,
                                          const float* s_cs, float* rr) {
  constexpr int HS = 32 * kPer;
  float g[kPer];
  load_floats<kPer>(g_ptr + lane * kPer, g);
  float ss = 0;
#pragma unroll
  for (int k = 0; k < kPer; ++k) ss += v[k] * v[k];
  ss = warp_sum(ss);
  const float r = 1.0f / sqrtf(ss / static_cast<float>(HS) + eps);
#pragma unroll
  for (int k = 0; k < kPer; ++k) v[k] = v[k] * r * g[k];
  if constexpr (kRope) {
    const bool low = lane < 16;  // this lane holds the pair's first column
    float p[kPer];
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      v[k] = to_float(from_float<T>(v[k]));
      p[k] = __shfl_xor_sync(0xffffffffu, v[k], 16);
    }
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int c = (lane % 16) * kPer + k;
      float lo, hi;
      rope_apply<1>(s_sn[c], s_cs[c], low ? v[k] : p[k], low ? p[k] : v[k], &lo, &hi);
      v[k] = low ? lo : hi;
    }
  }
  store_floats<kPer>(yr + lane * kPer, v);
  *rr = r;
}

template <typename T, typename P, int kPer, bool kRope, bool kValues>
__global__ void __launch_bounds__(kWarps * 32)
    forward_rows_kernel(const T* __restrict__ x, const P* __restrict__ gq, const P* __restrict__ gk,
                        T* __restrict__ y, float* __restrict__ rrms, int NH, int NKV, float eps,
                        QkRope rope) {
  constexpr int HS = 32 * kPer;
  __shared__ float s_sn[HS / 2], s_cs[HS / 2];
  const int64_t i = blockIdx.x;
  const int normed = NH + NKV;
  const int64_t W = static_cast<int64_t>(NH + 2 * NKV) * HS;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const T* xr = x + i * W;
  T* yr = y + i * W;
  if constexpr (kRope) {
    const float pos = static_cast<float>(rope.pos0 + i % rope.Tlen);
    for (int c = threadIdx.x; c < HS / 2; c += kWarps * 32) {
      rope_angle(pos, rope.inv_freq[c], &s_sn[c], &s_cs[c]);
    }
    __syncthreads();
  }
  for (int h = warp; h < normed; h += 2 * kWarps) {
    const int h2 = h + kWarps;
    const bool two = h2 < normed;
    float v[kPer], v2[kPer];
    load_floats<kPer>(xr + h * HS + lane * kPer, v);
    if (two) load_floats<kPer>(xr + h2 * HS + lane * kPer, v2);
    float r;
    norm_head<T, P, kPer, kRope>(h < NH ? gq : gk, yr + h * HS, v, lane, eps, s_sn, s_cs, &r);
    if (lane == 0) rrms[i * normed + h] = r;
    if (two) {
      norm_head<T, P, kPer, kRope>(h2 < NH ? gq : gk, yr + h2 * HS, v2, lane, eps, s_sn, s_cs, &r);
      if (lane == 0) rrms[i * normed + h2] = r;
    }
  }
  if constexpr (kValues) {
    constexpr int kV = kPack<T>;
    const int64_t first = static_cast<int64_t>(normed) * HS;
    for (int64_t c = first + threadIdx.x * kV; c < W; c += kWarps * 32 * kV) {
      float v[kV];
      load_floats<kV>(xr + c, v);
      store_floats<kV>(yr + c, v);
    }
  }
}

// dx += the norm's input gradient (dx may be null) and, with `partial`, the block's gamma
// gradient sums partial[block][0 (q) | 1 (k)][HS].
template <typename T, typename P, int kPer>
__global__ void __launch_bounds__(kWarps * 32, kPer <= 4 ? 8 : 4)
    backward_packed_kernel(const T* __restrict__ x, const P* __restrict__ gq,
                           const P* __restrict__ gk, const float* __restrict__ rrms,
                           const T* __restrict__ dy, T* __restrict__ dx,
                           float* __restrict__ partial, int64_t N, int NH, int NKV,
                           bool overwrite) {
  constexpr int HS = 32 * kPer;
  __shared__ float sh[kWarps][2][HS];
  const int normed = NH + NKV;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t tasks = N * normed;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kWarps;
  float aq[kPer] = {}, ak[kPer] = {};
  for (int64_t task = static_cast<int64_t>(blockIdx.x) * kWarps + warp; task < tasks;
       task += stride) {
    const int64_t i = task / normed;
    const int h = static_cast<int>(task % normed);
    const int64_t o = i * (NH + 2 * NKV) * HS + h * HS + lane * kPer;
    float xv[kPer], dv[kPer], g[kPer];
    load_floats<kPer>(x + o, xv);
    load_floats<kPer>(dy + o, dv);
    load_floats<kPer>((h < NH ? gq : gk) + lane * kPer, g);
    const float r = rrms[task];
    float sum = 0;
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      xv[k] *= r;  // x̂
      sum += dv[k] * g[k] * xv[k];
    }
    const float mean = warp_sum(sum) / static_cast<float>(HS);
    if (dx != nullptr) {
      float d[kPer];
#pragma unroll
      for (int k = 0; k < kPer; ++k) d[k] = r * (dv[k] * g[k] - xv[k] * mean);
      if (overwrite) {
        store_floats<kPer>(dx + o, d);
      } else {
        add_floats<kPer>(dx + o, d);
      }
    }
    // Selected per element (adding 0 to the other): a pointer to either array would put both in
    // local memory.
    const bool is_q = h < NH;
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const float v = dv[k] * xv[k];
      aq[k] += is_q ? v : 0.0f;
      ak[k] += is_q ? 0.0f : v;
    }
  }
  if (partial == nullptr) return;  // uniform over the grid: no barrier is skipped by some only
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    sh[warp][0][lane * kPer + k] = aq[k];
    sh[warp][1][lane * kPer + k] = ak[k];
  }
  __syncthreads();
  for (int c = threadIdx.x; c < 2 * HS; c += kWarps * 32) {
    float t = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) t += sh[w][c / HS][c % HS];
    partial[static_cast<int64_t>(blockIdx.x) * 2 * HS + c] = t;
  }
}

// dgq[c] += Σ_b partial[b][0][c], dgk likewise, over `blocks` partials: a block of 32 columns ×
// kFinishGroups groups; group j adds blocks j, j + groups, … in order (8 loads issued ahead of
// their adds), then the groups are added in order.
__global__ void finish_packed_kernel(const float* __restrict__ partial, float* __restrict__ dgq,
                                     float* __restrict__ dgk, int blocks, int HS) {
  __shared__ float sh[kFinishGroups][32];
  const int col = threadIdx.x % 32, grp = threadIdx.x / 32;
  const int c = blockIdx.x * 32 + col;  // of 2·HS: q columns, then k columns
  float t = 0;
  if (c < 2 * HS) {
#pragma unroll 8
    for (int b = grp; b < blocks; b += kFinishGroups)
      t += partial[static_cast<int64_t>(b) * 2 * HS + c];
  }
  sh[grp][col] = t;
  __syncthreads();
  if (grp != 0 || c >= 2 * HS) return;
  float sum = 0;
#pragma unroll
  for (int g = 0; g < kFinishGroups; ++g) sum += sh[g][col];
  float* dst = c < HS ? dgq : dgk;
  if (dst != nullptr) dst[c % HS] += sum;
}

// The value heads in 16-byte packs: y = x or dx += dy over the last W − first columns of each row.
template <typename T, bool kAccumulate>
__global__ void value_packed_kernel(const T* __restrict__ src, T* __restrict__ dst, int64_t N,
                                    int64_t W, int64_t first) {
  constexpr int kV = kPack<T>;
  const int64_t packs = (W - first) / kV;
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= N * packs) return;
  const int64_t k = (e / packs) * W + first + (e % packs) * kV;
  float v[kV];
  load_floats<kV>(src + k, v);
  if constexpr (kAccumulate) {
    add_floats<kV>(dst + k, v);
  } else {
    store_floats<kV>(dst + k, v);
  }
}

// The columns a lane owns on the fast path, or 0 when the general kernels run.
template <typename T, typename P>
int lane_columns(int64_t HS, std::initializer_list<const void*> act_ptrs,
                 std::initializer_list<const void*> param_ptrs) {
  if (HS % 32 != 0 || HS / 32 > kMaxLanePer || (HS / 32 & (HS / 32 - 1)) != 0) return 0;
  const int per = static_cast<int>(HS / 32);
  for (const void* p : act_ptrs)
    if (p != nullptr && !is_aligned(p, per * sizeof(T))) return 0;
  for (const void* p : param_ptrs)
    if (p != nullptr && !is_aligned(p, per * sizeof(P))) return 0;
  return per;
}

template <typename T, typename P, typename Fn>
void with_lane_columns(int per, Fn&& fn) {
  switch (per) {
    case 1:
      fn(std::integral_constant<int, 1>{});
      break;
    case 2:
      fn(std::integral_constant<int, 2>{});
      break;
    case 4:
      fn(std::integral_constant<int, 4>{});
      break;
    default:
      fn(std::integral_constant<int, 8>{});
      break;
  }
}

// The value heads' copy (forward) or gradient add (backward), packed where the layout allows.
template <typename T, bool kAccumulate>
void launch_values(const T* src, T* dst, int64_t N, int64_t W, int64_t first, cudaStream_t s) {
  constexpr int kV = kPack<T>;
  if ((W - first) % kV == 0 && W % kV == 0 && is_aligned(src, 16) && is_aligned(dst, 16)) {
    const int64_t n = N * ((W - first) / kV);
    value_packed_kernel<T, kAccumulate>
        <<<static_cast<unsigned>(ceil_div<int64_t>(n, 256)), 256, 0, s>>>(src, dst, N, W, first);
  } else {
    const int64_t n = N * (W - first);
    value_kernel<T, kAccumulate>
        <<<static_cast<unsigned>(ceil_div<int64_t>(n, 256)), 256, 0, s>>>(src, dst, N, W, first);
  }
  CUDA_CHECK_LAUNCH();
}

// The value heads' gradient: dx = dy (overwrite) or dx += dy.
template <typename T>
void values_backward(const void* dy, void* dx, int64_t N, int64_t W, int64_t first, bool overwrite,
                     cudaStream_t s) {
  if (overwrite) {
    launch_values<T, false>(static_cast<const T*>(dy), static_cast<T*>(dx), N, W, first, s);
  } else {
    launch_values<T, true>(static_cast<const T*>(dy), static_cast<T*>(dx), N, W, first, s);
  }
}

unsigned grad_blocks(int64_t N, int NH, int NKV) {
  return static_cast<unsigned>(
      std::min<int64_t>(ceil_div<int64_t>(N * (NH + NKV), kWarps), kMaxGradBlocks));
}

}  // namespace

void qk_rmsnorm_forward(const void* x, const void* gq, const void* gk, DType param, void* y,
                        float* rrms, int64_t N, int NH, int NKV, int64_t HS, double eps, DType act,
                        void* stream, const QkRope* rope) {
  GTRON_CHECK(N >= 0 && NH > 0 && NKV > 0 && HS > 0 && HS <= 1024, "qk_rmsnorm: N ", N, ", NH ", NH,
              ", NKV ", NKV, ", HS ", HS);
  GTRON_CHECK(rope == nullptr || (rope->inv_freq != nullptr && rope->Tlen > 0 &&
                                  N % rope->Tlen == 0 && rope->pos0 >= 0 && HS % 2 == 0),
              "qk_rmsnorm with RoPE: N ", N, " rows of Tlen ", rope ? rope->Tlen : 0, ", HS ", HS);
  if (N == 0) return;
  GTRON_CHECK(N < (int64_t{1} << 31), "qk_rmsnorm: ", N, " rows, more than a grid holds");
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int64_t W = (NH + 2 * NKV) * HS, first = (NH + NKV) * HS;
  dispatch_act_param("qk_rmsnorm", act, param, [&](auto t, auto p) {
    using T = decltype(t);
    using P = decltype(p);
    const T* xt = static_cast<const T*>(x);
    const P *gqt = static_cast<const P*>(gq), *gkt = static_cast<const P*>(gk);
    T* yt = static_cast<T*>(y);
    const int per = lane_columns<T, P>(HS, {x, y}, {gq, gk});
    const QkRope r = rope != nullptr ? *rope : QkRope{};
    // The rows kernel copies the value heads itself where they move in 16-byte packs.
    constexpr int kV = kPack<T>;
    const bool values = per > 0 && W % kV == 0 && is_aligned(x, 16) && is_aligned(y, 16);
    if (per > 0) {
      with_lane_columns<T, P>(per, [&](auto k) {
        constexpr int kPer = decltype(k)::value;
        auto kernel = forward_rows_kernel<T, P, kPer, false, false>;
        if (rope != nullptr) {
          kernel = values ? forward_rows_kernel<T, P, kPer, true, true>
                          : forward_rows_kernel<T, P, kPer, true, false>;
        } else if (values) {
          kernel = forward_rows_kernel<T, P, kPer, false, true>;
        }
        kernel<<<static_cast<unsigned>(N), kWarps * 32, 0, s>>>(xt, gqt, gkt, yt, rrms, NH, NKV,
                                                                static_cast<float>(eps), r);
      });
    } else {
      forward_kernel<T, P><<<head_blocks(N, NH, NKV), kWarps * 32, 0, s>>>(
          xt, gqt, gkt, yt, rrms, N, NH, NKV, HS, static_cast<float>(eps));
    }
    CUDA_CHECK_LAUNCH();
    if (!values) launch_values<T, false>(xt, yt, N, W, first, s);
    // The general kernels have no fused rotation: RoPE's own pass over the q and k heads.
    if (rope != nullptr && per == 0) {
      rope_forward_inplace(y, rope->inv_freq, N / rope->Tlen, rope->Tlen, NH, NKV, HS, rope->pos0,
                           act, stream);
    }
  });
}

int64_t qk_rmsnorm_backward_scratch_floats(int64_t N, int NH, int NKV, int64_t HS) {
  return std::max<int64_t>(ceil_div<int64_t>(N, kChunkRows), grad_blocks(N, NH, NKV)) * 2 * HS;
}

void qk_rmsnorm_backward(const void* x, const void* gq, const void* gk, DType param,
                         const float* rrms, const void* dy, void* dx, float* dgq, float* dgk,
                         float* scratch, int64_t N, int NH, int NKV, int64_t HS, DType act,
                         void* stream, bool dx_overwrite) {
  GTRON_CHECK(N >= 0 && NH > 0 && NKV > 0 && HS > 0 && HS <= 1024, "qk_rmsnorm backward: N ", N,
              ", NH ", NH, ", NKV ", NKV, ", HS ", HS);
  GTRON_CHECK((dgq == nullptr && dgk == nullptr) || scratch != nullptr,
              "qk_rmsnorm backward: gamma gradients need scratch");
  if (N == 0 || (dx == nullptr && dgq == nullptr && dgk == nullptr)) return;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int64_t W = (NH + 2 * NKV) * HS, first = (NH + NKV) * HS;
  dispatch_act_param("qk_rmsnorm backward", act, param, [&](auto t, auto p) {
    using T = decltype(t);
    using P = decltype(p);
    const bool dg = dgq != nullptr || dgk != nullptr;
    const int per = lane_columns<T, P>(HS, {x, dy, dx}, {gq, gk});
    if (per > 0) {
      const unsigned blocks = grad_blocks(N, NH, NKV);
      with_lane_columns<T, P>(per, [&](auto k) {
        backward_packed_kernel<T, P, decltype(k)::value><<<blocks, kWarps * 32, 0, s>>>(
            static_cast<const T*>(x), static_cast<const P*>(gq), static_cast<const P*>(gk), rrms,
            static_cast<const T*>(dy), static_cast<T*>(dx), dg ? scratch : nullptr, N, NH, NKV,
            dx_overwrite);
      });
      CUDA_CHECK_LAUNCH();
      if (dx != nullptr) values_backward<T>(dy, dx, N, W, first, dx_overwrite, s);
      if (dg) {
        finish_packed_kernel<<<static_cast<unsigned>(ceil_div<int64_t>(2 * HS, 32)),
                               kFinishGroups * 32, 0, s>>>(
            scratch, dgq, dgk, static_cast<int>(blocks), static_cast<int>(HS));
        CUDA_CHECK_LAUNCH();
      }
      return;
    }
    if (dx != nullptr) {
      dx_kernel<T, P><<<head_blocks(N, NH, NKV), kWarps * 32, 0, s>>>(
          static_cast<const T*>(x), static_cast<const P*>(gq), static_cast<const P*>(gk), rrms,
          static_cast<const T*>(dy), static_cast<T*>(dx), N, NH, NKV, HS, dx_overwrite);
      CUDA_CHECK_LAUNCH();
      values_backward<T>(dy, dx, N, W, first, dx_overwrite, s);
    }
    if (dgq == nullptr && dgk == nullptr) return;
    const int64_t chunks = ceil_div<int64_t>(N, kChunkRows);
    const unsigned threads = static_cast<unsigned>(ceil_div<int64_t>(HS, 32) * 32);
    dgamma_partial_kernel<T><<<static_cast<unsigned>(chunks), threads, 0, s>>>(
        static_cast<const T*>(x), rrms, static_cast<const T*>(dy), scratch, N, NH, NKV, HS);
    CUDA_CHECK_LAUNCH();
    dgamma_finish_kernel<<<static_cast<unsigned>(ceil_div<int64_t>(HS, 256)), 256, 0, s>>>(
        scratch, dgq, dgk, chunks, HS);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace gtron::cuda

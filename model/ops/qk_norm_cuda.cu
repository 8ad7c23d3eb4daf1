// qk_rmsnorm on CUDA: one warp per (row, q or k head) for y and dx; the value heads are copied
// (forward) or their gradient added (backward) by an elementwise kernel. The gamma gradients are
// deterministic: fixed chunks of rows write per-chunk partials (rows and heads in order), then one
// pass sums the chunks in order.
#include "model/cuda/kernel_util.cuh"
#include "model/ops/qk_norm.h"

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
                          int64_t HS) {
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
    dx[o + c] = from_float<T>(to_float(dx[o + c]) + d);
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

}  // namespace

void qk_rmsnorm_forward(const void* x, const void* gq, const void* gk, DType param, void* y,
                        float* rrms, int64_t N, int NH, int NKV, int64_t HS, double eps, DType act,
                        void* stream) {
  GTRON_CHECK(N >= 0 && NH > 0 && NKV > 0 && HS > 0 && HS <= 1024, "qk_rmsnorm: N ", N, ", NH ", NH,
              ", NKV ", NKV, ", HS ", HS);
  if (N == 0) return;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int64_t W = (NH + 2 * NKV) * HS, first = (NH + NKV) * HS;
  dispatch_act_param("qk_rmsnorm", act, param, [&](auto t, auto p) {
    using T = decltype(t);
    using P = decltype(p);
    forward_kernel<T, P><<<head_blocks(N, NH, NKV), kWarps * 32, 0, s>>>(
        static_cast<const T*>(x), static_cast<const P*>(gq), static_cast<const P*>(gk),
        static_cast<T*>(y), rrms, N, NH, NKV, HS, static_cast<float>(eps));
    CUDA_CHECK_LAUNCH();
    const int64_t n = N * (W - first);
    value_kernel<T, false><<<static_cast<unsigned>(ceil_div<int64_t>(n, 256)), 256, 0, s>>>(
        static_cast<const T*>(x), static_cast<T*>(y), N, W, first);
    CUDA_CHECK_LAUNCH();
  });
}

int64_t qk_rmsnorm_backward_scratch_floats(int64_t N, int NH, int NKV, int64_t HS) {
  (void)NH;
  (void)NKV;
  return ceil_div<int64_t>(N, kChunkRows) * 2 * HS;
}

void qk_rmsnorm_backward(const void* x, const void* gq, const void* gk, DType param,
                         const float* rrms, const void* dy, void* dx, float* dgq, float* dgk,
                         float* scratch, int64_t N, int NH, int NKV, int64_t HS, DType act,
                         void* stream) {
  GTRON_CHECK(N >= 0 && NH > 0 && NKV > 0 && HS > 0 && HS <= 1024, "qk_rmsnorm backward: N ", N,
              ", NH ", NH, ", NKV ", NKV, ", HS ", HS);
  GTRON_CHECK((dgq == nullptr && dgk == nullptr) || scratch != nullptr,
              "qk_rmsnorm backward: gamma gradients need scratch");
  if (N == 0) return;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int64_t W = (NH + 2 * NKV) * HS, first = (NH + NKV) * HS;
  dispatch_act_param("qk_rmsnorm backward", act, param, [&](auto t, auto p) {
    using T = decltype(t);
    using P = decltype(p);
    if (dx != nullptr) {
      dx_kernel<T, P><<<head_blocks(N, NH, NKV), kWarps * 32, 0, s>>>(
          static_cast<const T*>(x), static_cast<const P*>(gq), static_cast<const P*>(gk), rrms,
          static_cast<const T*>(dy), static_cast<T*>(dx), N, NH, NKV, HS);
      CUDA_CHECK_LAUNCH();
      const int64_t n = N * (W - first);
      value_kernel<T, true><<<static_cast<unsigned>(ceil_div<int64_t>(n, 256)), 256, 0, s>>>(
          static_cast<const T*>(dy), static_cast<T*>(dx), N, W, first);
      CUDA_CHECK_LAUNCH();
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

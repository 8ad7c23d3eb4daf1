// The decoder's device-indexed kernels (model/decode_cuda.h): one thread per element for the row
// copies; one block per row for the argmax, each thread scanning a stride of the row in order and
// the (value, index) pairs reduced with ties going to the smaller index, so the result is the
// first maximum whatever the reduction tree.
#include "model/cuda/kernel_util.cuh"
#include "model/decode_cuda.h"

namespace gtron::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kArgmaxThreads = 1024;
constexpr int kArgmaxLoads = 8;

// Row copies between x [B, W, C] and store [B, cap, C]; `save` picks the direction.
template <typename T>
__global__ void store_rows_kernel(const T* __restrict__ src, T* __restrict__ dst,
                                  const int32_t* __restrict__ start_count, int64_t B, int64_t W,
                                  int64_t cap, int64_t C, bool save) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= B * W * C) return;
  const int64_t b = e / (W * C), i = (e / C) % W, c = e % C;
  const bool real = i < start_count[B + b];
  const int64_t row = (b * cap + start_count[b] + i) * C + c;
  if (save) {
    if (real) dst[row] = src[e];
  } else if (real) {
    dst[e] = src[row];
  } else {
    dst[e] = from_float<T>(0.0f);
  }
}

template <typename T>
__global__ void gather_last_kernel(const T* __restrict__ x, T* __restrict__ y,
                                   const int32_t* __restrict__ start_count, int64_t B, int64_t W,
                                   int64_t C) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= B * C) return;
  const int64_t b = e / C, c = e % C;
  const int64_t n = start_count[B + b];
  const int64_t i = n > 0 ? n - 1 : 0;
  y[e] = x[(b * W + i) * C + c];
}

// The better of two (value, index) candidates: the larger value, the smaller index on a tie.
__device__ __forceinline__ void keep_best(float& v, int& i, float ov, int oi) {
  if (ov > v || (ov == v && oi < i)) {
    v = ov;
    i = oi;
  }
}

template <typename T>
__global__ void argmax_kernel(const T* __restrict__ logits, int32_t* __restrict__ ids, int64_t V,
                              int64_t ld) {
  __shared__ float vals[32];
  __shared__ int idxs[32];
  const T* row = logits + static_cast<int64_t>(blockIdx.x) * ld;
  float best = -INFINITY;
  int at = static_cast<int>(V);  // loses every tie against a real index
  // kArgmaxLoads loads in flight per thread, then compared in index order; strictly greater
  // keeps a thread's first of equal values.
  const int64_t stride = static_cast<int64_t>(blockDim.x);
  for (int64_t base = threadIdx.x; base < V; base += stride * kArgmaxLoads) {
    float x[kArgmaxLoads];
#pragma unroll
    for (int u = 0; u < kArgmaxLoads; ++u) {
      const int64_t v = base + u * stride;
      x[u] = v < V ? to_float(row[v]) : -INFINITY;
    }
#pragma unroll
    for (int u = 0; u < kArgmaxLoads; ++u) {
      if (x[u] > best) {
        best = x[u];
        at = static_cast<int>(base + u * stride);
      }
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    keep_best(best, at, __shfl_xor_sync(0xffffffffu, best, o), __shfl_xor_sync(0xffffffffu, at, o));
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) {
    vals[warp] = best;
    idxs[warp] = at;
  }
  __syncthreads();
  if (warp != 0) return;
  best = lane < static_cast<int>(blockDim.x / 32) ? vals[lane] : -INFINITY;
  at = lane < static_cast<int>(blockDim.x / 32) ? idxs[lane] : static_cast<int>(V);
  for (int o = 16; o > 0; o >>= 1) {
    keep_best(best, at, __shfl_xor_sync(0xffffffffu, best, o), __shfl_xor_sync(0xffffffffu, at, o));
  }
  // A row of only -inf (or NaN) keeps no index: take 0, where max_element would start.
  if (lane == 0) ids[blockIdx.x] = at < V ? at : 0;
}

unsigned blocks_for(int64_t n) { return static_cast<unsigned>(ceil_div<int64_t>(n, kThreads)); }

void store_rows(const void* src, void* dst, const int32_t* start_count, int64_t B, int64_t W,
                int64_t cap, int64_t C, DType act, void* stream, bool save) {
  const int64_t n = B * W * C;
  if (n == 0) return;
  dispatch_act("decoder store rows", act, [&](auto tag) {
    using T = decltype(tag);
    store_rows_kernel<T><<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const T*>(src), static_cast<T*>(dst), start_count, B, W, cap, C, save);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

void save_store_rows(const void* x, void* store, const int32_t* start_count, int64_t B, int64_t W,
                     int64_t cap, int64_t C, DType act, void* stream) {
  store_rows(x, store, start_count, B, W, cap, C, act, stream, true);
}

void load_store_rows(const void* store, void* x, const int32_t* start_count, int64_t B, int64_t W,
                     int64_t cap, int64_t C, DType act, void* stream) {
  store_rows(store, x, start_count, B, W, cap, C, act, stream, false);
}

void gather_last_slots(const void* x, void* y, const int32_t* start_count, int64_t B, int64_t W,
                       int64_t C, DType act, void* stream) {
  if (B * C == 0) return;
  dispatch_act("gather_last_slots", act, [&](auto tag) {
    using T = decltype(tag);
    gather_last_kernel<T><<<blocks_for(B * C), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const T*>(x), static_cast<T*>(y), start_count, B, W, C);
    CUDA_CHECK_LAUNCH();
  });
}

void argmax_rows(const void* logits, int32_t* ids, int64_t N, int64_t V, int64_t ld, DType act,
                 void* stream) {
  if (N == 0) return;
  GTRON_CHECK(V >= 1 && V <= ld && N <= 0x7fffffff, "argmax_rows: ", N, " rows of ", V,
              " logits (leading dimension ", ld, ")");
  dispatch_act("argmax_rows", act, [&](auto tag) {
    using T = decltype(tag);
    argmax_kernel<T>
        <<<static_cast<unsigned>(N), kArgmaxThreads, 0, static_cast<cudaStream_t>(stream)>>>(
            static_cast<const T*>(logits), ids, V, ld);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace gtron::cuda

namespace gtron::cuda {

namespace {

constexpr int kSmallRows = 8;                // rows one warp accumulates (one warp per row in LN)
constexpr int kSmallWarps = 8;               // output columns per block
constexpr int64_t kSmallShared = 48 * 1024;  // bytes of staged x
constexpr int kMaxChunks = 24;               // float4s of a weight row per lane: K <= 3072

__device__ __forceinline__ float gelu_tanh(float x) {
  const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);  // as model/ops/gelu_cuda.cu
  return 0.5f * x * (1.0f + tanhf(u));
}

// Row `row` of xs [M, K4] (float4s) normalized in place by one warp, in norm_forward_kernel's
// order (model/ops/norm_cuda.cu with 4-float packs): mean, then the centered squares.
__device__ void layernorm_row(float4* xs, int row, int K4, const float* __restrict__ gamma,
                              const float* __restrict__ beta, float eps, int lane) {
  float4* xr = xs + row * K4;
  const float C = static_cast<float>(4 * K4);
  float sum = 0.0f;
  for (int c = lane; c < K4; c += 32) {
    const float4 v = xr[c];
    sum += v.x;
    sum += v.y;
    sum += v.z;
    sum += v.w;
  }
  const float m = warp_sum(sum) / C;
  float sq = 0.0f;
  for (int c = lane; c < K4; c += 32) {
    const float4 v = xr[c];
    sq += (v.x - m) * (v.x - m);
    sq += (v.y - m) * (v.y - m);
    sq += (v.z - m) * (v.z - m);
    sq += (v.w - m) * (v.w - m);
  }
  const float r = 1.0f / sqrtf(warp_sum(sq) / C + eps);
  const auto* g4 = reinterpret_cast<const float4*>(gamma);
  const auto* b4 = reinterpret_cast<const float4*>(beta);
  for (int c = lane; c < K4; c += 32) {
    const float4 v = xr[c], g = g4[c], b = b4[c];
    float4 o;
    o.x = (v.x - m) * r * g.x;
    o.y = (v.y - m) * r * g.y;
    o.z = (v.z - m) * r * g.z;
    o.w = (v.w - m) * r * g.w;
    o.x += b.x;
    o.y += b.y;
    o.z += b.z;
    o.w += b.w;
    xr[c] = o;
  }
}

template <int kChunks>
__global__ void small_linear_kernel(SmallLinearArgs a) {
  extern __shared__ float4 xs[];  // [M, K / 4]
  const int M = static_cast<int>(a.M), K4 = static_cast<int>(a.K / 4);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kSmallWarps + warp;
  const bool live = j < a.N;
  // The weight row first: every load in flight before the block waits on its staging.
  float4 wv[kChunks];
  const auto* wr = reinterpret_cast<const float4*>(a.w + (live ? j : 0) * a.K);
#pragma unroll
  for (int t = 0; t < kChunks; ++t) {
    const int k = lane + 32 * t;
    wv[t] = live && k < K4 ? __ldg(wr + k) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  const auto* x4 = reinterpret_cast<const float4*>(a.x);
  for (int e = threadIdx.x; e < M * K4; e += blockDim.x) xs[e] = x4[e];
  __syncthreads();
  if (a.ln_gamma != nullptr) {
    if (warp < M) layernorm_row(xs, warp, K4, a.ln_gamma, a.ln_beta, a.ln_eps, lane);
    __syncthreads();
  }
  if (!live) return;
  float acc[kSmallRows];
#pragma unroll
  for (int m = 0; m < kSmallRows; ++m) acc[m] = 0.0f;
#pragma unroll
  for (int t = 0; t < kChunks; ++t) {
    const int k = lane + 32 * t;
    if (k < K4) {
#pragma unroll
      for (int m = 0; m < kSmallRows; ++m) {
        if (m < M) {
          const float4 xv = xs[m * K4 + k];
          acc[m] += wv[t].x * xv.x + wv[t].y * xv.y + wv[t].z * xv.z + wv[t].w * xv.w;
        }
      }
    }
  }
  float mine = 0.0f;  // lane m keeps row m's sum
#pragma unroll
  for (int m = 0; m < kSmallRows; ++m) {
    if (m < M) {  // M is the same for the whole block: the shuffles see full warps
      const float s = warp_sum(acc[m]);
      if (m == lane) mine = s;
    }
  }
  if (lane >= M) return;
  float v = mine + (a.bias != nullptr ? a.bias[j] : 0.0f);
  if (a.gelu) v = gelu_tanh(v);
  if (a.res != nullptr) v += a.res[lane * a.N + j];
  a.y[lane * a.N + j] = v;
}

}  // namespace

bool small_linear_supported(int64_t M, int64_t K) {
  return M >= 1 && M <= kSmallRows && K >= 4 && K % 4 == 0 && K <= 4 * 32 * kMaxChunks &&
         M * K * static_cast<int64_t>(sizeof(float)) <= kSmallShared;
}

void small_linear(const SmallLinearArgs& a, void* stream) {
  GTRON_CHECK(small_linear_supported(a.M, a.K) && is_aligned(a.x, 16) && is_aligned(a.w, 16) &&
                  (a.ln_gamma == nullptr || (a.ln_beta != nullptr && is_aligned(a.ln_gamma, 16) &&
                                             is_aligned(a.ln_beta, 16))),
              "small_linear: ", a.M, " rows of ", a.K, " (or unaligned operands)");
  if (a.N == 0) return;
  const auto blocks = static_cast<unsigned>(ceil_div<int64_t>(a.N, kSmallWarps));
  const size_t smem = static_cast<size_t>(a.M * a.K) * sizeof(float);
  auto st = static_cast<cudaStream_t>(stream);
  if (a.K <= 4 * 32 * 8) {
    small_linear_kernel<8><<<blocks, kSmallWarps * 32, smem, st>>>(a);
  } else {
    small_linear_kernel<kMaxChunks><<<blocks, kSmallWarps * 32, smem, st>>>(a);
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace gtron::cuda

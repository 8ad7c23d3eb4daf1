// The decoder's device-indexed kernels (model/decode_cuda.h): one thread per element for the row
// copies; one block per row for the argmax, each thread scanning a stride of the row in order and
// the (value, index) pairs reduced with ties going to the smaller index, so the result is the
// first maximum whatever the reduction tree.
#include "model/cuda/kernel_util.cuh"
#include "model/decode_cuda.h"

namespace gtron::cuda {

namespace {

constexpr int kThreads = 256;

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
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const float x = to_float(row[v]);
    if (x > best) {  // strictly: a thread's own later equal values keep its first
      best = x;
      at = static_cast<int>(v);
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
    argmax_kernel<T><<<static_cast<unsigned>(N), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const T*>(logits), ids, V, ld);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace gtron::cuda

namespace gtron::cuda {

namespace {

constexpr int kSmallRows = 8;                // rows one warp accumulates in registers
constexpr int kSmallWarps = 8;               // output columns per block
constexpr int64_t kSmallShared = 48 * 1024;  // bytes of staged x

__device__ __forceinline__ float gelu_tanh(float x) {
  const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);  // as model/ops/gelu_cuda.cu
  return 0.5f * x * (1.0f + tanhf(u));
}

__global__ void small_linear_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                    const float* __restrict__ bias, const float* __restrict__ res,
                                    float* __restrict__ y, int M, int K, int64_t N, bool gelu) {
  extern __shared__ float4 xs[];  // [M, K / 4]
  const int K4 = K / 4;
  const auto* x4 = reinterpret_cast<const float4*>(x);
  for (int e = threadIdx.x; e < M * K4; e += blockDim.x) xs[e] = x4[e];
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kSmallWarps + warp;
  if (j >= N) return;
  const auto* wr = reinterpret_cast<const float4*>(w + j * K);
  float acc[kSmallRows];
#pragma unroll
  for (int m = 0; m < kSmallRows; ++m) acc[m] = 0.0f;
#pragma unroll 4
  for (int k = lane; k < K4; k += 32) {
    const float4 wv = __ldg(wr + k);
#pragma unroll
    for (int m = 0; m < kSmallRows; ++m) {
      if (m < M) {
        const float4 xv = xs[m * K4 + k];
        acc[m] += wv.x * xv.x + wv.y * xv.y + wv.z * xv.z + wv.w * xv.w;
      }
    }
  }
  float mine = 0.0f;  // lane m keeps row m's sum
#pragma unroll
  for (int m = 0; m < kSmallRows; ++m) {
    const float s = warp_sum(acc[m]);
    if (m == lane) mine = s;
  }
  if (lane >= M) return;
  float v = mine + (bias != nullptr ? bias[j] : 0.0f);
  if (gelu) v = gelu_tanh(v);
  if (res != nullptr) v += res[lane * N + j];
  y[lane * N + j] = v;
}

}  // namespace

bool small_linear_supported(int64_t M, int64_t K) {
  return M >= 1 && M <= kSmallRows && K >= 4 && K % 4 == 0 &&
         M * K * static_cast<int64_t>(sizeof(float)) <= kSmallShared;
}

void small_linear(const float* x, const float* w, const float* bias, const float* res, float* y,
                  int64_t M, int64_t K, int64_t N, bool gelu, void* stream) {
  GTRON_CHECK(small_linear_supported(M, K) && is_aligned(x, 16) && is_aligned(w, 16),
              "small_linear: ", M, " rows of ", K, " (or unaligned operands)");
  if (N == 0) return;
  const auto blocks = static_cast<unsigned>(ceil_div<int64_t>(N, kSmallWarps));
  const size_t smem = static_cast<size_t>(M * K) * sizeof(float);
  small_linear_kernel<<<blocks, kSmallWarps * 32, smem, static_cast<cudaStream_t>(stream)>>>(
      x, w, bias, res, y, static_cast<int>(M), static_cast<int>(K), N, gelu);
  CUDA_CHECK_LAUNCH();
}

}  // namespace gtron::cuda

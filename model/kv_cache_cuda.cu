// Cached attention on CUDA (generation). Two kernels on one stream: the keys and values of the
// window's real slots go into the caches (one thread per element), then one block per (row, head,
// slot) forms the slot's scores against its prefix of the cache in shared memory, softmaxes them
// (fp32, block max and sum in a fixed order) and sums the values. A decoding step has few slots,
// so this plain form is enough for now; prefills of long prompts would want the tiled flash
// kernel of model/ops/attention_cuda.cu once it takes a key length above the query length.
#include <cmath>

#include "model/cuda/kernel_util.cuh"
#include "model/kv_cache_cuda.h"

namespace gtron::cuda {

namespace {

constexpr int kThreads = 128;

template <typename T>
__global__ void write_cache_kernel(const T* __restrict__ qkv, T* __restrict__ kc,
                                   T* __restrict__ vc, const int32_t* __restrict__ start_count,
                                   int64_t B, int64_t W, int64_t Tc, int64_t NH, int64_t HS) {
  const int64_t C = NH * HS;
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= B * W * C) return;
  const int64_t b = e / (W * C), i = (e / C) % W, c = e % C;
  if (i >= start_count[B + b]) return;
  const int64_t h = c / HS, d = c % HS, pos = start_count[b] + i;
  const int64_t dst = ((b * NH + h) * Tc + pos) * HS + d;
  const T* row = qkv + (b * W + i) * 3 * C;
  kc[dst] = row[C + c];
  vc[dst] = row[2 * C + c];
}

__device__ float block_max(float v, float* smem) {
  v = warp_max(v);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  const float w = lane < static_cast<int>(blockDim.x / 32) ? smem[lane] : -INFINITY;
  return warp_max(w);
}

// grid (B·NH, W); shared: scores [Tc], q [HS], reduction [32].
template <typename T>
__global__ void attend_kernel(const T* __restrict__ qkv, const T* __restrict__ kc,
                              const T* __restrict__ vc, T* __restrict__ out,
                              const int32_t* __restrict__ start_count, int64_t B, int64_t W,
                              int64_t Tc, int64_t NH, int64_t HS, float scale) {
  extern __shared__ float smem[];
  float* scores = smem;
  float* q = smem + Tc;
  float* red = q + HS;
  const int64_t bh = blockIdx.x, i = blockIdx.y;
  const int64_t b = bh / NH, h = bh % NH, C = NH * HS;
  const int64_t n = start_count[B + b];
  T* o = out + (b * W + i) * C + h * HS;
  if (n == 0) {
    for (int64_t d = threadIdx.x; d < HS; d += blockDim.x) o[d] = from_float<T>(0.0f);
    return;
  }
  const int64_t last = start_count[b] + (i < n - 1 ? i : n - 1);
  const T* K = kc + bh * Tc * HS;
  const T* V = vc + bh * Tc * HS;
  for (int64_t d = threadIdx.x; d < HS; d += blockDim.x) {
    q[d] = to_float(qkv[(b * W + i) * 3 * C + h * HS + d]);
  }
  __syncthreads();
  float mx = -INFINITY;
  for (int64_t s = threadIdx.x; s <= last; s += blockDim.x) {
    float dot = 0;
    for (int64_t d = 0; d < HS; ++d) dot += q[d] * to_float(K[s * HS + d]);
    scores[s] = dot * scale;
    mx = fmaxf(mx, scores[s]);
  }
  mx = block_max(mx, red);
  float sum = 0;
  for (int64_t s = threadIdx.x; s <= last; s += blockDim.x) {
    scores[s] = expf(scores[s] - mx);
    sum += scores[s];
  }
  sum = block_sum(sum, red);  // its barriers also publish every score
  const float inv = 1.0f / sum;
  for (int64_t d = threadIdx.x; d < HS; d += blockDim.x) {
    float acc = 0;
    for (int64_t s = 0; s <= last; ++s) acc += scores[s] * to_float(V[s * HS + d]);
    o[d] = from_float<T>(acc * inv);
  }
}

}  // namespace

void cached_attention_forward(const void* qkv, void* kc, void* vc, void* out,
                              const int32_t* start_count, int64_t B, int64_t W, int64_t Tc,
                              int64_t NH, int64_t HS, DType act, void* stream) {
  const int64_t n = B * W * NH * HS;
  if (n == 0) return;
  const size_t smem = static_cast<size_t>(Tc + HS + 32) * sizeof(float);
  GTRON_CHECK(smem <= 48 * 1024, "cached_attention (CUDA): ", Tc,
              " cached positions need more shared memory than a block gets (48 KiB)");
  GTRON_CHECK(W <= 65535, "cached_attention (CUDA): a window of ", W, " slots");
  dispatch_act("cached_attention", act, [&](auto tag) {
    using T = decltype(tag);
    auto st = static_cast<cudaStream_t>(stream);
    const auto* q = static_cast<const T*>(qkv);
    auto* k = static_cast<T*>(kc);
    auto* v = static_cast<T*>(vc);
    const auto blocks = static_cast<unsigned>(ceil_div<int64_t>(n, kThreads));
    write_cache_kernel<T><<<blocks, kThreads, 0, st>>>(q, k, v, start_count, B, W, Tc, NH, HS);
    CUDA_CHECK_LAUNCH();
    const dim3 grid(static_cast<unsigned>(B * NH), static_cast<unsigned>(W));
    const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
    attend_kernel<T><<<grid, kThreads, smem, st>>>(q, k, v, static_cast<T*>(out), start_count, B, W,
                                                   Tc, NH, HS, scale);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace gtron::cuda

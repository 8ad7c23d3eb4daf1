// The MoE router on CUDA (model/ops/moe_router.h): affinities, the top-k choice with its gates,
// the balance loss and their backwards, in fp32 (Note [fp32 routing on CUDA]). A row of E
// experts is one warp's (E <= kMaxExperts = 16 values a lane); reductions over a row use the
// xor butterfly, reductions over the rows one block with a fixed thread partition and a fixed
// tree, so every result repeats bit for bit. No float atomics.
#include "model/cuda/kernel_util.cuh"
#include "model/ops/moe_router.h"

namespace gtron::cuda {

namespace {

constexpr int kRowsPerBlock = 8;  // warps of a 256-thread block, one row each
constexpr int kPerLane = kMaxExperts / 32;
constexpr int kColumnThreads = 256;

unsigned row_blocks(int64_t N) {
  return static_cast<unsigned>(ceil_div<int64_t>(N, kRowsPerBlock));
}

__device__ __forceinline__ int64_t warp_row() {
  return static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
}

template <typename Tz>
__global__ void scores_forward_kernel(const Tz* __restrict__ z, float* __restrict__ s, int64_t N,
                                      int E, bool sigmoid) {
  const int64_t n = warp_row();
  const int lane = threadIdx.x % 32;
  if (n >= N) return;  // the whole warp leaves together
  const Tz* zr = z + n * E;
  float* sr = s + n * E;
  if (sigmoid) {
    for (int e = lane; e < E; e += 32) sr[e] = 1.0f / (1.0f + expf(-to_float(zr[e])));
    return;
  }
  float mx = -INFINITY;
  for (int e = lane; e < E; e += 32) mx = fmaxf(mx, to_float(zr[e]));
  mx = warp_max(mx);
  float sum = 0;
  for (int e = lane; e < E; e += 32) {
    const float v = expf(to_float(zr[e]) - mx);
    sr[e] = v;
    sum += v;
  }
  sum = warp_sum(sum);
  for (int e = lane; e < E; e += 32) sr[e] = sr[e] / sum;
}

template <typename Tz, bool kOverwrite>
__global__ void scores_backward_kernel(const float* __restrict__ s, const float* __restrict__ ds,
                                       Tz* __restrict__ dz, int64_t N, int E, bool sigmoid) {
  const int64_t n = warp_row();
  const int lane = threadIdx.x % 32;
  if (n >= N) return;
  const float* sr = s + n * E;
  const float* dr = ds + n * E;
  Tz* out = dz + n * E;
  float dot = 0;
  if (!sigmoid) {
    for (int e = lane; e < E; e += 32) dot += dr[e] * sr[e];
    dot = warp_sum(dot);
  }
  for (int e = lane; e < E; e += 32) {
    const float v = sigmoid ? dr[e] * sr[e] * (1.0f - sr[e]) : sr[e] * (dr[e] - dot);
    out[e] = from_float<Tz>(kOverwrite ? v : to_float(out[e]) + v);
  }
}

// The better of two candidates under (value descending, index ascending); index −1 is none.
__device__ __forceinline__ void better(float& v, int& e, float ov, int oe) {
  if (oe < 0) return;
  if (e < 0 || ov > v || (ov == v && oe < e)) {
    v = ov;
    e = oe;
  }
}

// Note [router determinism]: k rounds, each the warp's best expert not yet taken. Lane l holds
// experts l, l + 32, ...; `taken` is its bitmask over them.
__global__ void topk_forward_kernel(const float* __restrict__ s, const float* __restrict__ bias,
                                    int32_t* __restrict__ ids, float* __restrict__ gates, int64_t N,
                                    int E, int k, bool normalize) {
  const int64_t n = warp_row();
  const int lane = threadIdx.x % 32;
  if (n >= N) return;
  const float* sr = s + n * E;
  float v[kPerLane];
  uint32_t taken = 0;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    v[i] = 0;
    if (e < E) {
      v[i] = bias != nullptr ? sr[e] + bias[e] : sr[e];
    } else {
      taken |= 1u << i;
    }
  }
  int32_t* id = ids + n * k;
  float* g = gates + n * k;
  for (int j = 0; j < k; ++j) {
    float best_v = 0;
    int best = -1;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      if (!((taken >> i) & 1u)) better(best_v, best, v[i], lane + 32 * i);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, best_v, o);
      const int oe = __shfl_xor_sync(0xffffffffu, best, o);
      better(best_v, best, ov, oe);
    }
    if (best % 32 == lane) taken |= 1u << (best / 32);
    if (lane == 0) {
      id[j] = best;
      g[j] = sr[best];
    }
  }
  if (normalize && lane == 0) {  // the CPU's order: the sum in slot order, then each divided
    float sum = 0;
    for (int j = 0; j < k; ++j) sum += g[j];
    for (int j = 0; j < k; ++j) g[j] = g[j] / sum;
  }
}

// One thread a row; the chosen experts of a row are distinct, so its writes never collide.
__global__ void topk_backward_kernel(const float* __restrict__ s, const int32_t* __restrict__ ids,
                                     const float* __restrict__ gates,
                                     const float* __restrict__ dgates, float* __restrict__ ds,
                                     int64_t N, int E, int k, bool normalize) {
  const int64_t n = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= N) return;
  const float* sr = s + n * E;
  const int32_t* id = ids + n * k;
  const float* g = gates + n * k;
  const float* dg = dgates + n * k;
  float* out = ds + n * E;
  if (!normalize) {
    for (int j = 0; j < k; ++j) out[id[j]] += dg[j];
    return;
  }
  float sum = 0, dot = 0;
  for (int j = 0; j < k; ++j) {
    sum += sr[id[j]];
    dot += dg[j] * g[j];
  }
  for (int j = 0; j < k; ++j) out[id[j]] += (dg[j] - dot) / sum;
}

// rinv[n] = 1 / Σ_e s[n, e] (the sigmoid router's row normalization of the balance loss).
__global__ void row_inverse_kernel(const float* __restrict__ s, float* __restrict__ rinv, int64_t N,
                                   int E) {
  const int64_t n = warp_row();
  const int lane = threadIdx.x % 32;
  if (n >= N) return;
  float sum = 0;
  for (int e = lane; e < E; e += 32) sum += s[n * E + e];
  sum = warp_sum(sum);
  if (lane == 0) rinv[n] = 1.0f / sum;
}

// Block e: expert e's slot count and P_e (its column of p summed over the rows), then
// coef[e] = scale · f_e / N and part[e] = coef[e] · P_e.
__global__ void aux_column_kernel(const float* __restrict__ s, const int32_t* __restrict__ ids,
                                  const float* __restrict__ rinv, float* __restrict__ coef,
                                  float* __restrict__ part, int64_t N, int E, int k, float scale) {
  __shared__ float red[32];
  __shared__ int counts[kColumnThreads / 32];
  const int e = blockIdx.x;
  int count = 0;
  for (int64_t i = threadIdx.x; i < N * k; i += blockDim.x) count += ids[i] == e;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) count += __shfl_xor_sync(0xffffffffu, count, o);
  if (threadIdx.x % 32 == 0) counts[threadIdx.x / 32] = count;
  float p = 0;
  for (int64_t n = threadIdx.x; n < N; n += blockDim.x) {
    p += rinv != nullptr ? s[n * E + e] * rinv[n] : s[n * E + e];
  }
  p = block_sum(p, red);  // its barriers also publish counts[]
  if (threadIdx.x == 0) {
    int total = 0;
    for (int w = 0; w < kColumnThreads / 32; ++w) total += counts[w];
    const float f = static_cast<float>(total) / static_cast<float>(N * k);
    coef[e] = scale * f / static_cast<float>(N);
    part[e] = coef[e] * p;
  }
}

// loss[0] = Σ_e part[e] in expert order (one thread: E is small).
__global__ void aux_total_kernel(const float* __restrict__ part, float* __restrict__ loss, int E) {
  float total = 0;
  for (int e = 0; e < E; ++e) total += part[e];
  loss[0] = total;
}

__global__ void aux_backward_kernel(const float* __restrict__ s, const float* __restrict__ coef,
                                    const float* __restrict__ dloss, float* __restrict__ ds,
                                    int64_t N, int E, bool normalize_rows) {
  const int64_t n = warp_row();
  const int lane = threadIdx.x % 32;
  if (n >= N) return;
  const float dl = dloss[0];
  const float* sr = s + n * E;
  float* out = ds + n * E;
  if (!normalize_rows) {
    for (int e = lane; e < E; e += 32) out[e] += dl * coef[e];
    return;
  }
  // p = s / S: ds_j += dl · (c_j − Σ_e c_e·p_e) / S (the CPU's formula).
  float sum = 0, dot = 0;
  for (int e = lane; e < E; e += 32) {
    sum += sr[e];
    dot += coef[e] * sr[e];
  }
  sum = warp_sum(sum);
  dot = warp_sum(dot) / sum;
  for (int e = lane; e < E; e += 32) out[e] += dl * (coef[e] - dot) / sum;
}

void check_experts(const char* op, int64_t N, int64_t E) {
  GTRON_CHECK(N >= 0 && E > 0 && E <= kMaxExperts, op, ": N = ", N, ", E = ", E,
              " (CUDA takes 1 to ", kMaxExperts, " experts)");
}

}  // namespace

void router_scores_forward(const void* z, float* s, int64_t N, int64_t E, MoeRouterKind kind,
                           DType act, void* stream) {
  check_experts("router_scores", N, E);
  if (N == 0) return;
  dispatch_act("router_scores", act, [&](auto tag) {
    using T = decltype(tag);
    scores_forward_kernel<T>
        <<<row_blocks(N), 32 * kRowsPerBlock, 0, static_cast<cudaStream_t>(stream)>>>(
            static_cast<const T*>(z), s, N, static_cast<int>(E), kind == MoeRouterKind::kSigmoid);
    CUDA_CHECK_LAUNCH();
  });
}

void router_scores_backward(const float* s, const float* ds, void* dz, int64_t N, int64_t E,
                            MoeRouterKind kind, DType act, void* stream, bool overwrite) {
  check_experts("router_scores", N, E);
  if (N == 0) return;
  const bool sigmoid = kind == MoeRouterKind::kSigmoid;
  auto st = static_cast<cudaStream_t>(stream);
  dispatch_act("router_scores", act, [&](auto tag) {
    using T = decltype(tag);
    auto* out = static_cast<T*>(dz);
    const int e = static_cast<int>(E);
    if (overwrite) {
      scores_backward_kernel<T, true>
          <<<row_blocks(N), 32 * kRowsPerBlock, 0, st>>>(s, ds, out, N, e, sigmoid);
    } else {
      scores_backward_kernel<T, false>
          <<<row_blocks(N), 32 * kRowsPerBlock, 0, st>>>(s, ds, out, N, e, sigmoid);
    }
    CUDA_CHECK_LAUNCH();
  });
}

void topk_gates_forward(const float* s, const float* bias, int32_t* ids, float* gates, int64_t N,
                        int64_t E, int k, bool normalize, void* stream) {
  check_experts("topk_gates", N, E);
  GTRON_CHECK(k >= 1 && k <= E, "topk_gates: k = ", k, " of E = ", E, " experts");
  if (N == 0) return;
  topk_forward_kernel<<<row_blocks(N), 32 * kRowsPerBlock, 0, static_cast<cudaStream_t>(stream)>>>(
      s, bias, ids, gates, N, static_cast<int>(E), k, normalize);
  CUDA_CHECK_LAUNCH();
}

void topk_gates_backward(const float* s, const int32_t* ids, const float* gates,
                         const float* dgates, float* ds, int64_t N, int64_t E, int k,
                         bool normalize, void* stream) {
  check_experts("topk_gates", N, E);
  if (N == 0) return;
  const unsigned blocks = static_cast<unsigned>(ceil_div<int64_t>(N, 256));
  topk_backward_kernel<<<blocks, 256, 0, static_cast<cudaStream_t>(stream)>>>(
      s, ids, gates, dgates, ds, N, static_cast<int>(E), k, normalize);
  CUDA_CHECK_LAUNCH();
}

int64_t moe_aux_loss_scratch_floats(int64_t N, int64_t E) { return N + E; }

void moe_aux_loss_forward(const float* s, const int32_t* ids, float* loss, float* coef,
                          float* scratch, int64_t N, int64_t E, int k, double weight,
                          bool normalize_rows, void* stream) {
  check_experts("moe_aux_loss", N, E);
  GTRON_CHECK(N > 0 && k >= 1, "moe_aux_loss: N = ", N, ", k = ", k);
  auto st = static_cast<cudaStream_t>(stream);
  float* rinv = normalize_rows ? scratch : nullptr;
  float* part = scratch + N;
  if (normalize_rows) {
    row_inverse_kernel<<<row_blocks(N), 32 * kRowsPerBlock, 0, st>>>(s, rinv, N,
                                                                     static_cast<int>(E));
    CUDA_CHECK_LAUNCH();
  }
  // The CPU's scale: weight · E formed in double, then rounded once.
  const float scale = static_cast<float>(weight * static_cast<double>(E));
  aux_column_kernel<<<static_cast<unsigned>(E), kColumnThreads, 0, st>>>(
      s, ids, rinv, coef, part, N, static_cast<int>(E), k, scale);
  CUDA_CHECK_LAUNCH();
  aux_total_kernel<<<1, 1, 0, st>>>(part, loss, static_cast<int>(E));
  CUDA_CHECK_LAUNCH();
}

void moe_aux_loss_backward(const float* s, const float* coef, const float* dloss, float* ds,
                           int64_t N, int64_t E, bool normalize_rows, void* stream) {
  check_experts("moe_aux_loss", N, E);
  if (N == 0) return;
  aux_backward_kernel<<<row_blocks(N), 32 * kRowsPerBlock, 0, static_cast<cudaStream_t>(stream)>>>(
      s, coef, dloss, ds, N, static_cast<int>(E), normalize_rows);
  CUDA_CHECK_LAUNCH();
}

}  // namespace gtron::cuda

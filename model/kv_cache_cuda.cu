// Cached attention on CUDA (generation): two kernels on one stream, the split-key pass and its
// combine (Note [split-key decode attention]).
//
// Note [split-key decode attention]
// A decoding step has few queries (B·NH·W of them, 12 for GPT-2 at batch 1) and up to Tc keys
// each: one block per query would leave most of the GPU idle and walk the keys serially. So the
// keys are cut into splits of kKeysPerSplit, and grid (B·NH, W, S) with S = ceil(Tc /
// kKeysPerSplit) gives each (query, split) its own block: it forms the split's scores (a warp
// per key, lanes over the head dimension, xor-butterfly sums), their max m, the sum l of
// exp(score - m) and the unnormalized value sum a[d] = Σ exp(score - m)·v[d], and writes (m, l,
// a) to scratch. A split past the query's last key exits at once (the grid is fixed by Tc, so a
// captured graph serves every step). The combine kernel, one block per query, rescales the live
// splits to their common max in split order: out = Σ_s a_s·e^{m_s-M} / Σ_s l_s·e^{m_s-M}. Every
// sum runs in a fixed order, so reruns are bit-identical. The window's own keys and values are
// read straight from qkv (slot p - start of position p), so no kernel has to write them into the
// cache first; the combine kernel does that, after every split has run (a later window or layer
// reads them from there). Grouped-query attention (the llama family) changes only where a query
// head finds its key/value head (h / (NH / NKV)); the first query head of each group writes it.
#include <algorithm>
#include <cmath>

#include "model/cuda/kernel_util.cuh"
#include "model/kv_cache_cuda.h"

namespace gtron::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kKeysPerSplit = 32;  // at most kThreads: one thread per score in the softmax
constexpr int kKeysPerWarp = kKeysPerSplit / (kThreads / 32);

int64_t splits_of(int64_t Tc) { return ceil_div<int64_t>(Tc, kKeysPerSplit); }

__device__ float block_max(float v, float* smem) {
  v = warp_max(v);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  const float w = lane < static_cast<int>(blockDim.x / 32) ? smem[lane] : -INFINITY;
  return warp_max(w);
}

// The last cached position slot i of row b attends to, or -1 for a row sitting out.
__device__ int64_t last_key(const int32_t* start_count, int64_t B, int64_t b, int64_t i) {
  const int64_t n = start_count[B + b];
  if (n == 0) return -1;
  return start_count[b] + (i < n - 1 ? i : n - 1);
}

// grid (B·NH, W, S); shared: q [HS], scores [kKeysPerSplit], reduction [32], value sums
// [max(threads, HS)]. Writes (m, l, a[HS]) of its split at partial[((bh·W + i)·S + split)·(HS +
// 2)].
template <typename T>
__global__ void attend_split_kernel(const T* __restrict__ qkv, const T* __restrict__ kc,
                                    const T* __restrict__ vc, float* __restrict__ partial,
                                    const int32_t* __restrict__ start_count, int64_t B, int64_t W,
                                    int64_t Tc, int64_t NH, int64_t NKV, int64_t HS, float scale) {
  extern __shared__ float smem[];
  float* q = smem;
  float* scores = q + HS;
  float* red = scores + kKeysPerSplit;
  const int64_t bh = blockIdx.x, i = blockIdx.y, split = blockIdx.z, S = gridDim.z;
  const int64_t b = bh / NH, h = bh % NH, width = (NH + 2 * NKV) * HS;
  const int64_t g = h / (NH / NKV), bg = b * NKV + g;  // the key/value head query head h reads
  const int64_t last = last_key(start_count, B, b, i);
  const int64_t k0 = split * kKeysPerSplit;
  if (k0 > last) return;  // the combine reads only live splits
  const int64_t nk = (last - k0 + 1 < kKeysPerSplit) ? last - k0 + 1 : kKeysPerSplit;
  // Key or value (part 1 or 2) of position p: the window's own positions from qkv (the combine
  // kernel writes them into the cache afterwards), earlier ones from the cache.
  const int64_t s0 = start_count[b];
  auto row_of = [&](int64_t p, int part) -> const T* {
    if (p >= s0) return qkv + (b * W + (p - s0)) * width + (NH + (part - 1) * NKV + g) * HS;
    return (part == 1 ? kc : vc) + (bg * Tc + p) * HS;
  };
  for (int64_t d = threadIdx.x; d < HS; d += blockDim.x) {
    q[d] = to_float(qkv[(b * W + i) * width + h * HS + d]);
  }
  __syncthreads();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  // Warp w scores keys w, w + warps, ...: the loads of all its keys are issued together (the
  // split is latency-bound), each key's dot product summed over lanes by the butterfly.
  float dot[kKeysPerWarp];
#pragma unroll
  for (int u = 0; u < kKeysPerWarp; ++u) dot[u] = 0.0f;
  for (int64_t d = lane; d < HS; d += 32) {
    const float qd = q[d];
#pragma unroll
    for (int u = 0; u < kKeysPerWarp; ++u) {
      const int64_t j = warp + u * warps;
      if (j < nk) dot[u] += qd * to_float(row_of(k0 + j, 1)[d]);
    }
  }
#pragma unroll
  for (int u = 0; u < kKeysPerWarp; ++u) {
    const int64_t j = warp + u * warps;
    const float sum = warp_sum(dot[u]);
    if (lane == 0 && j < nk) scores[j] = sum * scale;
  }
  __syncthreads();
  const int t = threadIdx.x;
  const float mx = block_max(t < nk ? scores[t] : -INFINITY, red);
  const float e = t < nk ? expf(scores[t] - mx) : 0.0f;
  if (t < nk) scores[t] = e;          // each thread rewrites only the score it read
  const float l = block_sum(e, red);  // its barriers also publish every score
  float* part = partial + ((bh * W + i) * S + split) * (HS + 2);
  // Value sums: `groups` threads per dimension, group g summing keys g, g + groups, ... (their
  // loads in flight together), then the groups' sums added in group order.
  const int64_t threads = blockDim.x;
  const int64_t groups = HS < threads ? threads / HS : 1;
  float* sums = red + 32;  // [groups, HS]
  const int64_t grp = threadIdx.x / HS;
  if (grp < groups) {
    for (int64_t d = threadIdx.x % HS; d < HS; d += threads) {
      float acc = 0;
#pragma unroll 8
      for (int64_t j = grp; j < nk; j += groups) acc += scores[j] * to_float(row_of(k0 + j, 2)[d]);
      sums[grp * HS + d] = acc;
    }
  }
  __syncthreads();
  for (int64_t d = threadIdx.x; d < HS; d += blockDim.x) {
    float acc = 0;
    for (int64_t k = 0; k < groups; ++k) acc += sums[k * HS + d];
    part[2 + d] = acc;
  }
  if (threadIdx.x == 0) {
    part[0] = mx;
    part[1] = l;
  }
}

// grid (B·NH, W), shared [3S]: writes slot i's key and value head into the caches (a real slot;
// the first query head of each key/value head writes it), and out = the live splits' value sums
// rescaled to their common max, in split order.
template <typename T>
__global__ void attend_combine_kernel(const float* __restrict__ partial, const T* __restrict__ qkv,
                                      T* __restrict__ kc, T* __restrict__ vc, T* __restrict__ out,
                                      const int32_t* __restrict__ start_count, int64_t B, int64_t W,
                                      int64_t Tc, int64_t NH, int64_t NKV, int64_t HS, int64_t S) {
  const int64_t bh = blockIdx.x, i = blockIdx.y;
  const int64_t b = bh / NH, h = bh % NH, width = (NH + 2 * NKV) * HS, group = NH / NKV;
  const int64_t g = h / group;
  T* o = out + (b * W + i) * NH * HS + h * HS;
  const int64_t last = last_key(start_count, B, b, i);
  if (last < 0) {
    for (int64_t d = threadIdx.x; d < HS; d += blockDim.x) o[d] = from_float<T>(0.0f);
    return;
  }
  if (i < start_count[B + b] && h % group == 0) {
    const T* row = qkv + (b * W + i) * width + (NH + g) * HS;
    const int64_t dst = ((b * NKV + g) * Tc + start_count[b] + i) * HS;
    for (int64_t d = threadIdx.x; d < HS; d += blockDim.x) {
      kc[dst + d] = row[d];
      vc[dst + d] = row[NKV * HS + d];
    }
  }
  // The splits' maxima and sums staged in shared memory (one load each, all in flight), then
  // their weights e^{m_s - M}.
  extern __shared__ float stage[];  // m [S], l [S], e [S]
  float* ms = stage;
  float* ls = stage + S;
  float* es = stage + 2 * S;
  const int64_t live = last / kKeysPerSplit + 1;
  const float* part = partial + (bh * W + i) * S * (HS + 2);
  for (int64_t s = threadIdx.x; s < live; s += blockDim.x) {
    ms[s] = part[s * (HS + 2)];
    ls[s] = part[s * (HS + 2) + 1];
  }
  __syncthreads();
  float M = -INFINITY;
  for (int64_t s = 0; s < live; ++s) M = fmaxf(M, ms[s]);
  for (int64_t s = threadIdx.x; s < live; s += blockDim.x) es[s] = expf(ms[s] - M);
  __syncthreads();
  float L = 0;
  for (int64_t s = 0; s < live; ++s) L += ls[s] * es[s];
  const float inv = 1.0f / L;
  for (int64_t d = threadIdx.x; d < HS; d += blockDim.x) {
    float acc = 0;
#pragma unroll 8
    for (int64_t s = 0; s < live; ++s) acc += part[s * (HS + 2) + 2 + d] * es[s];
    o[d] = from_float<T>(acc * inv);
  }
}

}  // namespace

int64_t cached_attention_scratch_floats(int64_t B, int64_t W, int64_t Tc, int64_t NH, int64_t HS) {
  return B * NH * W * splits_of(Tc) * (HS + 2);
}

void cached_attention_forward(const void* qkv, void* kc, void* vc, void* out,
                              const int32_t* start_count, float* scratch, int64_t B, int64_t W,
                              int64_t Tc, int64_t NH, int64_t NKV, int64_t HS, DType act,
                              void* stream) {
  const int64_t n = B * W * NH * HS;
  if (n == 0) return;
  GTRON_CHECK(NKV > 0 && NH % NKV == 0, "cached_attention (CUDA): ", NH, " query heads over ", NKV,
              " key/value heads");
  const int64_t S = splits_of(Tc);
  // Split: q [HS], scores, reduction [32], the value groups' sums [max(threads, HS)].
  const size_t smem =
      static_cast<size_t>(HS + kKeysPerSplit + 32 + std::max<int64_t>(kThreads, HS)) *
      sizeof(float);
  const size_t combine_smem = static_cast<size_t>(3 * S) * sizeof(float);
  GTRON_CHECK(smem <= 48 * 1024 && combine_smem <= 48 * 1024, "cached_attention (CUDA): head size ",
              HS, " over ", Tc, " cached positions needs too much shared memory");
  GTRON_CHECK(W <= 65535 && S <= 65535, "cached_attention (CUDA): a window of ", W, " slots over ",
              Tc, " cached positions");
  dispatch_act("cached_attention", act, [&](auto tag) {
    using T = decltype(tag);
    auto st = static_cast<cudaStream_t>(stream);
    const auto* q = static_cast<const T*>(qkv);
    auto* k = static_cast<T*>(kc);
    auto* v = static_cast<T*>(vc);
    const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
    const dim3 grid(static_cast<unsigned>(B * NH), static_cast<unsigned>(W),
                    static_cast<unsigned>(S));
    attend_split_kernel<T>
        <<<grid, kThreads, smem, st>>>(q, k, v, scratch, start_count, B, W, Tc, NH, NKV, HS, scale);
    CUDA_CHECK_LAUNCH();
    const dim3 combine(static_cast<unsigned>(B * NH), static_cast<unsigned>(W));
    attend_combine_kernel<T><<<combine, kThreads, combine_smem, st>>>(
        scratch, q, k, v, static_cast<T*>(out), start_count, B, W, Tc, NH, NKV, HS, S);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace gtron::cuda

// Kernels behind trainer/optimizer_cuda.h: chunked Σ g², its fixed-order finalize with the clip
// factor, the chunked AdamW update (with its bf16 shadow stores), and the on-device loss sums.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "model/cuda/check.h"
#include "model/ops/fp8_blocks.cuh"
#include "model/packed_master.h"
#include "trainer/optimizer_cuda.h"

namespace gtron::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kFinalThreads = 1024;
constexpr int kGroupThreads = 32;  // one thread per group; a handful of groups

// Sum over the block in a fixed tree (deterministic for a fixed block size); the result is valid
// in thread 0. REQUIRES: blockDim.x == kN, a power of two; smem holds kN doubles.
template <int kN>
__device__ double block_sum_fixed(double v, double* smem) {
  smem[threadIdx.x] = v;
  __syncthreads();
#pragma unroll
  for (int s = kN / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) smem[threadIdx.x] += smem[threadIdx.x + s];
    __syncthreads();
  }
  return smem[0];
}

__global__ void sumsq_kernel(const OptimChunk* chunks, double* partials) {
  __shared__ double smem[kThreads];
  const OptimChunk c = chunks[blockIdx.x];
  double s = 0;
  for (int i = threadIdx.x; i < c.n; i += kThreads) {
    const double g = c.g[i];
    s += g * g;
  }
  const double total = block_sum_fixed<kThreads>(s, smem);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

__global__ void finalize_kernel(const double* partials, int64_t n, double clip, float* norm_out,
                                float* scale_out) {
  __shared__ double smem[kFinalThreads];
  double s = 0;
  for (int64_t i = threadIdx.x; i < n; i += kFinalThreads) s += partials[i];
  const double total = block_sum_fixed<kFinalThreads>(s, smem);
  if (threadIdx.x == 0) {
    const double norm = sqrt(total);
    norm_out[0] = static_cast<float>(norm);
    // clip_scale(): 1 unless clip > 0 and norm > clip (a NaN norm compares false: 1).
    scale_out[0] = (clip > 0 && norm > clip) ? static_cast<float>(clip / (norm + 1e-6)) : 1.f;
  }
}

__global__ void group_sum_kernel(const double* partials, const int32_t* offsets, int64_t k,
                                 double* out) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= k) return;
  double s = 0;
  for (int32_t i = offsets[j]; i < offsets[j + 1]; ++i) s += partials[i];
  out[j] = s;
}

// One element of the update (Note [fused shadow refresh]): the vector and scalar loops share it.
__device__ __forceinline__ float adamw_element(float w, float g, float& m, float& v,
                                               const AdamWConstants& k, float gs, float wd) {
  const float gi = g * gs;
  m = k.b1 * m + (1.f - k.b1) * gi;
  v = k.b2 * v + (1.f - k.b2) * gi * gi;
  const float update = (m * k.c1) / (sqrtf(v * k.c2) + k.eps) + wd * w;
  return w - k.lr * update;
}

struct alignas(8) Bf16x4 {
  __nv_bfloat162 lo, hi;
};

__device__ __forceinline__ bool vector_chunk(const OptimChunk& c) {
  const auto bits = reinterpret_cast<uintptr_t>(c.w) | reinterpret_cast<uintptr_t>(c.g) |
                    reinterpret_cast<uintptr_t>(c.m) | reinterpret_cast<uintptr_t>(c.v);
  return bits % 16 == 0 && reinterpret_cast<uintptr_t>(c.w_bf16) % 8 == 0;
}

// Note [packed masters]: one element of a packed chunk, its fp32 value rebuilt from the shadow h
// and the low half l, updated as adamw_element does, and stored back into both halves.
__device__ __forceinline__ void adamw_packed_element(uint16_t& h, uint16_t& l, float g, float& m,
                                                     float& v, const AdamWConstants& k, float gs,
                                                     float wd) {
  const float w = adamw_element(__uint_as_float(packed::unpack(h, l)), g, m, v, k, gs, wd);
  const uint32_t b = __float_as_uint(w);
  h = packed::high_of(b);
  l = packed::low_of(b);
}

__device__ __forceinline__ bool packed_vector_chunk(const OptimChunk& c) {
  const auto bits = reinterpret_cast<uintptr_t>(c.g) | reinterpret_cast<uintptr_t>(c.m) |
                    reinterpret_cast<uintptr_t>(c.v);
  const auto bits8 = reinterpret_cast<uintptr_t>(c.w_bf16) | reinterpret_cast<uintptr_t>(c.w_lo);
  return bits % 16 == 0 && bits8 % 8 == 0;
}

// The update of a packed chunk: 8 bytes of shadow and 8 of low halves a thread when aligned.
__device__ void adamw_packed(const OptimChunk& c, const AdamWConstants& k, float gs, float wd) {
  int done = 0;
  if (packed_vector_chunk(c)) {  // uniform over the block
    const int n4 = c.n / 4;
    const auto* g4 = reinterpret_cast<const float4*>(c.g);
    auto* m4 = reinterpret_cast<float4*>(c.m);
    auto* v4 = reinterpret_cast<float4*>(c.v);
    auto* hi4 = reinterpret_cast<ushort4*>(c.w_bf16);
    auto* lo4 = reinterpret_cast<ushort4*>(c.w_lo);
    for (int i = threadIdx.x; i < n4; i += kThreads) {
      float4 m = m4[i], v = v4[i];
      const float4 g = g4[i];
      ushort4 h = hi4[i], l = lo4[i];
      adamw_packed_element(h.x, l.x, g.x, m.x, v.x, k, gs, wd);
      adamw_packed_element(h.y, l.y, g.y, m.y, v.y, k, gs, wd);
      adamw_packed_element(h.z, l.z, g.z, m.z, v.z, k, gs, wd);
      adamw_packed_element(h.w, l.w, g.w, m.w, v.w, k, gs, wd);
      m4[i] = m;
      v4[i] = v;
      hi4[i] = h;
      lo4[i] = l;
    }
    done = n4 * 4;
  }
  for (int i = done + threadIdx.x; i < c.n; i += kThreads) {
    float m = c.m[i], v = c.v[i];
    adamw_packed_element(c.w_bf16[i], c.w_lo[i], c.g[i], m, v, k, gs, wd);
    c.m[i] = m;
    c.v[i] = v;
  }
}

__global__ void adamw_kernel(const OptimChunk* chunks, AdamWConstants k, const float* scale) {
  const OptimChunk c = chunks[blockIdx.x];
  const float gs = scale[0];
  const float wd = c.decay ? k.wd : 0.f;
  if (c.w_lo != nullptr) {
    adamw_packed(c, k, gs, wd);
    return;
  }
  auto* w16 = reinterpret_cast<__nv_bfloat16*>(c.w_bf16);
  int done = 0;
  if (vector_chunk(c)) {  // uniform over the block
    const int n4 = c.n / 4;
    auto* w4 = reinterpret_cast<float4*>(c.w);
    const auto* g4 = reinterpret_cast<const float4*>(c.g);
    auto* m4 = reinterpret_cast<float4*>(c.m);
    auto* v4 = reinterpret_cast<float4*>(c.v);
    for (int i = threadIdx.x; i < n4; i += kThreads) {
      float4 w = w4[i], m = m4[i], v = v4[i];
      const float4 g = g4[i];
      w.x = adamw_element(w.x, g.x, m.x, v.x, k, gs, wd);
      w.y = adamw_element(w.y, g.y, m.y, v.y, k, gs, wd);
      w.z = adamw_element(w.z, g.z, m.z, v.z, k, gs, wd);
      w.w = adamw_element(w.w, g.w, m.w, v.w, k, gs, wd);
      m4[i] = m;
      v4[i] = v;
      w4[i] = w;
      if (w16 != nullptr) {
        reinterpret_cast<Bf16x4*>(w16)[i] =
            Bf16x4{__floats2bfloat162_rn(w.x, w.y), __floats2bfloat162_rn(w.z, w.w)};
      }
    }
    done = n4 * 4;
  }
  for (int i = done + threadIdx.x; i < c.n; i += kThreads) {
    float m = c.m[i], v = c.v[i];
    const float w = adamw_element(c.w[i], c.g[i], m, v, k, gs, wd);
    c.m[i] = m;
    c.v[i] = v;
    c.w[i] = w;
    if (w16 != nullptr) w16[i] = __float2bfloat16_rn(w);
  }
}

// Note [fp8 codes from the update]: block blockIdx.x of the launch: its weight (a binary search
// over first_block), the update of its values as BlockPlace lays them out (float4 of w, g, m, v a
// row of 4; adamw_element as adamw_kernel), then code_block over the new values.
__global__ void __launch_bounds__(kBlockThreads, 2)
    adamw_blocks_kernel(const OptimBlocks* __restrict__ ws, int64_t num_weights, AdamWConstants k,
                        const float* scale) {
  const int64_t blk = blockIdx.x;
  int64_t lo = 0, hi = num_weights - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (ws[mid].first_block <= blk) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const OptimBlocks W = ws[lo];
  const int64_t tiles_k = (W.K + kBlockTile - 1) / kBlockTile;
  const int64_t local = blk - W.first_block, by = local / tiles_k, bx = local % tiles_k;
  const BlockPlace b(W.N, W.K, by, bx);
  const float gs = scale[0];
  const float wd = W.decay ? k.wd : 0.f;
  float vals[8][4];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    vals[j][0] = vals[j][1] = vals[j][2] = vals[j][3] = 0.0f;
    if (b.count(j) == 0) continue;  // K % 4 == 0: a lane holds 4 values of a row or none
    const int64_t i = b.at + j * W.K;
    float4 w = *reinterpret_cast<const float4*>(W.w + i);
    float4 m = *reinterpret_cast<const float4*>(W.m + i);
    float4 v = *reinterpret_cast<const float4*>(W.v + i);
    const float4 g = *reinterpret_cast<const float4*>(W.g + i);
    w.x = adamw_element(w.x, g.x, m.x, v.x, k, gs, wd);
    w.y = adamw_element(w.y, g.y, m.y, v.y, k, gs, wd);
    w.z = adamw_element(w.z, g.z, m.z, v.z, k, gs, wd);
    w.w = adamw_element(w.w, g.w, m.w, v.w, k, gs, wd);
    *reinterpret_cast<float4*>(W.m + i) = m;
    *reinterpret_cast<float4*>(W.v + i) = v;
    *reinterpret_cast<float4*>(W.w + i) = w;
    vals[j][0] = w.x, vals[j][1] = w.y, vals[j][2] = w.z, vals[j][3] = w.w;
  }
  code_block<true>(vals, b, by, bx, W.q, W.s, W.qt, W.st, W.qt_vec != 0);
}

__global__ void accumulate_kernel(ScalarList list, float factor, float* dst) {
  const int i = threadIdx.x;
  if (i < list.n) dst[i] += factor * list.src[i][0];
}

}  // namespace

void grad_sumsq_partials(const OptimChunk* chunks, int64_t num_chunks, double* partials,
                         void* stream) {
  GTRON_CHECK(num_chunks >= 0 && num_chunks < (int64_t{1} << 31),
              "grad_sumsq_partials: ", num_chunks, " chunks");
  if (num_chunks == 0) return;
  sumsq_kernel<<<static_cast<unsigned>(num_chunks), kThreads, 0,
                 static_cast<cudaStream_t>(stream)>>>(chunks, partials);
  CUDA_CHECK_LAUNCH();
}

void grad_norm_finalize(const double* partials, int64_t num_partials, double clip, float* norm_out,
                        float* scale_out, void* stream) {
  GTRON_CHECK(num_partials >= 0 && norm_out != nullptr && scale_out != nullptr,
              "grad_norm_finalize: bad arguments");
  finalize_kernel<<<1, kFinalThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      partials, num_partials, clip, norm_out, scale_out);
  CUDA_CHECK_LAUNCH();
}

void sum_partial_groups(const double* partials, const int32_t* offsets, int64_t k, double* out,
                        void* stream) {
  GTRON_CHECK(
      k >= 0 && k < (int64_t{1} << 31) && (k == 0 || (offsets != nullptr && out != nullptr)),
      "sum_partial_groups: ", k, " groups");
  if (k == 0) return;
  const auto blocks = static_cast<unsigned>(ceil_div<int64_t>(k, kGroupThreads));
  group_sum_kernel<<<blocks, kGroupThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      partials, offsets, k, out);
  CUDA_CHECK_LAUNCH();
}

void adamw_chunks(const OptimChunk* chunks, int64_t num_chunks, const AdamWConstants& k,
                  const float* scale, void* stream) {
  GTRON_CHECK(num_chunks >= 0 && num_chunks < (int64_t{1} << 31) && scale != nullptr,
              "adamw_chunks: ", num_chunks, " chunks");
  if (num_chunks == 0) return;
  adamw_kernel<<<static_cast<unsigned>(num_chunks), kThreads, 0,
                 static_cast<cudaStream_t>(stream)>>>(chunks, k, scale);
  CUDA_CHECK_LAUNCH();
}

bool adamw_blocks_layout_ok(const OptimBlocks& b) {
  const auto a16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return b.N > 0 && b.K > 0 && b.K % 4 == 0 && a16(b.w) && a16(b.g) && a16(b.m) && a16(b.v);
}

bool adamw_blocks_ok(const OptimBlocks& b) {
  return adamw_blocks_layout_ok(b) && b.q != nullptr && b.s != nullptr && b.qt != nullptr &&
         b.st != nullptr && reinterpret_cast<uintptr_t>(b.q) % 4 == 0;
}

int64_t adamw_blocks_of(int64_t N, int64_t K) {
  return ceil_div<int64_t>(N, kBlockTile) * ceil_div<int64_t>(K, kBlockTile);
}

void adamw_blocks(const OptimBlocks* weights, int64_t num_weights, int64_t num_blocks,
                  const AdamWConstants& k, const float* scale, void* stream) {
  GTRON_CHECK(num_weights >= 0 && num_blocks >= 0 && num_blocks < (int64_t{1} << 31),
              "adamw_blocks: ", num_weights, " weights, ", num_blocks, " blocks");
  if (num_weights == 0 || num_blocks == 0) return;
  adamw_blocks_kernel<<<static_cast<unsigned>(num_blocks), kBlockThreads, 0,
                        static_cast<cudaStream_t>(stream)>>>(weights, num_weights, k, scale);
  CUDA_CHECK_LAUNCH();
}

void accumulate_scalars(const ScalarList& list, float factor, float* dst, void* stream) {
  GTRON_CHECK(list.n >= 0 && list.n <= kMaxScalars, "accumulate_scalars: ", list.n,
              " scalars (at most ", kMaxScalars, ")");
  if (list.n == 0) return;
  accumulate_kernel<<<1, 32, 0, static_cast<cudaStream_t>(stream)>>>(list, factor, dst);
  CUDA_CHECK_LAUNCH();
}

}  // namespace gtron::cuda

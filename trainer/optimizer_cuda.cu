// Kernels behind trainer/optimizer_cuda.h: chunked Σ g², its fixed-order finalize with the clip
// factor, the chunked AdamW update (with its bf16 shadow stores), and the on-device loss sums.
//
// Note [fast optimizer kernels]
// Σ g² and AdamW stream every byte once (AdamW: 16 bytes read and 12 written per element, plus
// 2 of shadow), so their speed is how well they keep HBM busy. The fast kernels (the default;
// GTRON_ADAMW_FAST=0 launches the ones before them, for A/B measurements) keep every value's bits:
// - AdamW updates each element with the instructions adamw_kernel gets from adamw_element, pinned
//   as inline PTX (adamw_element_ptx): the same C++ compiled into another kernel may fuse the
//   other product of v's update into its fma (seen: fma(gi, (1-b2)·gi, b2·v) instead of
//   fma(b2, v, gi·((1-b2)·gi))), which rounds differently. The plain mul/sub pair that ptxas may
//   still fuse is the same pair in both kernels. What changes is how the bytes move: each thread
//   issues the float4 loads of kU groups (kThreads float4s apart) of every operand before any
//   math, so each operand is read in runs kU times longer, and the register bound (resident
//   blocks per SM) sets how many bytes an SM has in flight; loads and stores are global-space
//   (the table's pointers are otherwise generic) with the streaming (evict-first) hint, since no
//   byte is touched twice. A block may take kChunks consecutive chunks, their table entries
//   staged in shared memory at once, so a block waits for one table load, not one per chunk.
// - Σ g² keeps the old summation order exactly: thread t still adds g[t], g[t + kThreads], ...
//   in that order into one double (the same fma), only loading kB of them ahead; the block's tree
//   adds the same pairs, its last five levels by warp shuffles (lane t adds lane t + s, as
//   smem[t] += smem[t + s] did), so the partials are bit-identical; a block may sum kChunks
//   chunks, one after the other, each into its own partial.
// The variant tables below hold the candidates tests/trainer/bench_adamw compares; the defaults
// are kAdamWFastVariant and kSumsqFastVariant (trainer/optimizer_cuda.h).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>

#include "model/cuda/check.h"
#include "trainer/optimizer_cuda.h"

namespace gtron::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kFinalThreads = 1024;

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

// block_sum_fixed's tree, its levels below 32 in warp 0 by shuffles (Note [fast optimizer
// kernels]): the same pairs are added, so the same bits. REQUIRES: blockDim.x == kN >= 64.
template <int kN>
__device__ double block_sum_fixed_shfl(double v, double* smem) {
  smem[threadIdx.x] = v;
  __syncthreads();
#pragma unroll
  for (int s = kN / 2; s >= 32; s >>= 1) {
    if (threadIdx.x < s) smem[threadIdx.x] += smem[threadIdx.x + s];
    __syncthreads();
  }
  double r = threadIdx.x < 32 ? smem[threadIdx.x] : 0.0;
  if (threadIdx.x < 32) {
#pragma unroll
    for (int s = 16; s > 0; s >>= 1) r += __shfl_down_sync(0xffffffffu, r, s);
  }
  return r;
}

// Chunks [blockIdx.x·kChunks, +kChunks) of the table (fewer in the last block), staged in shared
// memory: one global-load latency per block for all of them. Returns their number.
template <int kChunks>
__device__ int stage_chunks(const OptimChunk* chunks, unsigned num_chunks, OptimChunk* staged) {
  const unsigned first = blockIdx.x * kChunks;
  const int count = static_cast<int>(min(static_cast<unsigned>(kChunks), num_chunks - first));
  if (static_cast<int>(threadIdx.x) < count) staged[threadIdx.x] = chunks[first + threadIdx.x];
  __syncthreads();
  return count;
}

// Shared memory for kChunks table entries (OptimChunk's member initializers rule out a
// __shared__ array of it).
template <int kChunks>
struct alignas(16) StagedChunks {
  unsigned char bytes[kChunks * sizeof(OptimChunk)];
  __device__ OptimChunk* get() { return reinterpret_cast<OptimChunk*>(bytes); }
};

// sumsq_kernel's sums with kB loads in flight per thread, over kChunks chunks a block (Note [fast
// optimizer kernels]).
template <int kB, int kChunks>
__global__ void __launch_bounds__(kThreads)
    sumsq_fast_kernel(const OptimChunk* chunks, unsigned num_chunks, double* partials) {
  __shared__ double smem[kThreads];
  __shared__ StagedChunks<kChunks> staged;
  const int count = stage_chunks<kChunks>(chunks, num_chunks, staged.get());
  for (int j = 0; j < count; ++j) {
    const float* g = staged.get()[j].g;
    const int n = staged.get()[j].n;
    double s = 0;
    for (int i0 = threadIdx.x; i0 < n; i0 += kB * kThreads) {
      float x[kB];
#pragma unroll
      for (int u = 0; u < kB; ++u)
        if (i0 + u * kThreads < n) x[u] = __ldcs(g + i0 + u * kThreads);
#pragma unroll
      for (int u = 0; u < kB; ++u) {
        if (i0 + u * kThreads < n) {
          const double d = x[u];
          s = __fma_rn(d, d, s);  // sumsq_kernel's s += g * g, as the compiler fuses it there
        }
      }
    }
    const double total = block_sum_fixed_shfl<kThreads>(s, smem);
    if (threadIdx.x == 0) partials[blockIdx.x * kChunks + j] = total;
  }
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

__global__ void split_sum_kernel(const double* partials, int64_t split, int64_t n, double* out) {
  const int64_t lo = threadIdx.x == 0 ? 0 : split, hi = threadIdx.x == 0 ? split : n;
  double s = 0;
  for (int64_t i = lo; i < hi; ++i) s += partials[i];
  out[threadIdx.x] = s;
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

__global__ void adamw_kernel(const OptimChunk* chunks, AdamWConstants k, const float* scale) {
  const OptimChunk c = chunks[blockIdx.x];
  const float gs = scale[0];
  const float wd = c.decay ? k.wd : 0.f;
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

// adamw_element pinned down as PTX (Note [fast optimizer kernels]): the instructions the compiler
// makes of adamw_element in adamw_kernel, in its order. Left to the compiler, the same C++ in
// another kernel may fuse the other product of v's update into its fma (a different rounding).
struct PinnedConstants {
  float b1, one_minus_b1, b2, one_minus_b2, c1, c2, eps, lr;
};

__device__ __forceinline__ float adamw_element_ptx(float w, float g, float& m, float& v,
                                                   const PinnedConstants& k, float gs, float wd) {
  asm("{\n\t"
      ".reg .f32 gi, t0, t1, t2, t3, t4;\n\t"
      "mul.f32 gi, %4, %3;\n\t"          // gi = g * scale
      "mul.f32 t0, %6, gi;\n\t"          // (1 - b1) * gi
      "mul.f32 t1, %8, gi;\n\t"          // (1 - b2) * gi
      "mul.f32 t1, gi, t1;\n\t"          // gi * ((1 - b2) * gi)
      "fma.rn.f32 %1, %5, %1, t0;\n\t"   // m = b1 * m + t0
      "mul.f32 t0, %9, %1;\n\t"          // m * c1
      "fma.rn.f32 %2, %7, %2, t1;\n\t"   // v = b2 * v + t1
      "mul.f32 t2, %10, %2;\n\t"         // v * c2
      "sqrt.rn.f32 t2, t2;\n\t"          // sqrt(v * c2)
      "add.f32 t2, %11, t2;\n\t"         // + eps
      "div.rn.f32 t3, t0, t2;\n\t"       // (m * c1) / (sqrt(v * c2) + eps)
      "fma.rn.f32 t4, %12, %0, t3;\n\t"  // update = wd * w + t3
      "mul.f32 t4, %13, t4;\n\t"         // lr * update
      "sub.f32 %0, %0, t4;\n\t"          // w - lr * update
      "}"
      : "+f"(w), "+f"(m), "+f"(v)
      : "f"(g), "f"(gs), "f"(k.b1), "f"(k.one_minus_b1), "f"(k.b2), "f"(k.one_minus_b2), "f"(k.c1),
        "f"(k.c2), "f"(k.eps), "f"(wd), "f"(k.lr));
  return w;
}

// Global-space loads and stores, streaming (evict-first) or with the default cache policy.
template <bool kStream>
__device__ __forceinline__ float4 load4(const float4* p) {
  if constexpr (kStream) {
    return __ldcs(p);
  } else {
    return __ldca(p);
  }
}

template <bool kStream, typename T>
__device__ __forceinline__ void store(T* p, T v) {
  if constexpr (kStream) {
    __stcs(p, v);
  } else {
    __stwb(p, v);
  }
}

// The bf16 shadow of four updated values as one 8-byte store.
template <bool kStream>
__device__ __forceinline__ void store_shadow4(uint2* p, const float4& w) {
  const __nv_bfloat162 lo = __floats2bfloat162_rn(w.x, w.y), hi = __floats2bfloat162_rn(w.z, w.w);
  uint2 bits;
  memcpy(&bits.x, &lo, sizeof(bits.x));
  memcpy(&bits.y, &hi, sizeof(bits.y));
  store<kStream>(p, bits);
}

// adamw_kernel's update of one chunk with the loads of kU float4 groups per operand in flight
// before any math (Note [fast optimizer kernels]).
template <int kU, bool kStream>
__device__ __forceinline__ void adamw_fast_chunk(const OptimChunk& c, const PinnedConstants& k,
                                                 float gs, float wd) {
  int done = 0;
  if (vector_chunk(c)) {  // uniform over the block
    const int n4 = c.n / 4;
    auto* w4 = reinterpret_cast<float4*>(c.w);
    const auto* g4 = reinterpret_cast<const float4*>(c.g);
    auto* m4 = reinterpret_cast<float4*>(c.m);
    auto* v4 = reinterpret_cast<float4*>(c.v);
    auto* s4 = reinterpret_cast<uint2*>(c.w_bf16);
    for (int i0 = threadIdx.x; i0 < n4; i0 += kU * kThreads) {
      float4 w[kU], g[kU], m[kU], v[kU];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int i = i0 + u * kThreads;
        if (i < n4) {
          w[u] = load4<kStream>(w4 + i);
          g[u] = load4<kStream>(g4 + i);
          m[u] = load4<kStream>(m4 + i);
          v[u] = load4<kStream>(v4 + i);
        }
      }
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int i = i0 + u * kThreads;
        if (i >= n4) continue;
        w[u].x = adamw_element_ptx(w[u].x, g[u].x, m[u].x, v[u].x, k, gs, wd);
        w[u].y = adamw_element_ptx(w[u].y, g[u].y, m[u].y, v[u].y, k, gs, wd);
        w[u].z = adamw_element_ptx(w[u].z, g[u].z, m[u].z, v[u].z, k, gs, wd);
        w[u].w = adamw_element_ptx(w[u].w, g[u].w, m[u].w, v[u].w, k, gs, wd);
        store<kStream>(m4 + i, m[u]);
        store<kStream>(v4 + i, v[u]);
        store<kStream>(w4 + i, w[u]);
        if (s4 != nullptr) store_shadow4<kStream>(s4 + i, w[u]);
      }
    }
    done = n4 * 4;
  }
  auto* w16 = reinterpret_cast<__nv_bfloat16*>(c.w_bf16);
  for (int i = done + threadIdx.x; i < c.n; i += kThreads) {  // unaligned chunks, tails
    float m = c.m[i], v = c.v[i];
    const float w = adamw_element_ptx(c.w[i], c.g[i], m, v, k, gs, wd);
    c.m[i] = m;
    c.v[i] = v;
    c.w[i] = w;
    if (w16 != nullptr) w16[i] = __float2bfloat16_rn(w);
  }
}

// kChunks chunks a block; kMinBlocks resident blocks per SM bound the registers.
template <int kU, bool kStream, int kMinBlocks, int kChunks>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    adamw_fast_kernel(const OptimChunk* chunks, unsigned num_chunks, AdamWConstants ak,
                      const float* scale) {
  if constexpr (kChunks == 1) {  // the entry straight from the table: fewer registers
    const OptimChunk c = chunks[blockIdx.x];
    const float gs = scale[0];
    const float wd = c.decay ? ak.wd : 0.f;
    const PinnedConstants k{ak.b1, 1.f - ak.b1, ak.b2, 1.f - ak.b2, ak.c1, ak.c2, ak.eps, ak.lr};
    adamw_fast_chunk<kU, kStream>(c, k, gs, wd);
  } else {
    __shared__ StagedChunks<kChunks> staged;
    const int count = stage_chunks<kChunks>(chunks, num_chunks, staged.get());
    const float gs = scale[0];
    const PinnedConstants k{ak.b1, 1.f - ak.b1, ak.b2, 1.f - ak.b2, ak.c1, ak.c2, ak.eps, ak.lr};
    for (int j = 0; j < count; ++j) {
      const OptimChunk c = staged.get()[j];
      adamw_fast_chunk<kU, kStream>(c, k, gs, c.decay ? ak.wd : 0.f);
    }
  }
}

__global__ void accumulate_kernel(ScalarList list, float factor, float* dst) {
  const int i = threadIdx.x;
  if (i < list.n) dst[i] += factor * list.src[i][0];
}

// The variant tables (Note [fast optimizer kernels]); entry 0 is the kernel before the fast ones.
template <int kB, int kChunks>
void launch_sumsq_fast(const OptimChunk* chunks, unsigned n, double* partials, cudaStream_t s) {
  sumsq_fast_kernel<kB, kChunks>
      <<<(n + kChunks - 1) / kChunks, kThreads, 0, s>>>(chunks, n, partials);
}

void launch_sumsq(const OptimChunk* chunks, unsigned n, double* partials, cudaStream_t s) {
  sumsq_kernel<<<n, kThreads, 0, s>>>(chunks, partials);
}

struct SumsqVariant {
  const char* name;
  void (*launch)(const OptimChunk*, unsigned, double*, cudaStream_t);
};

// Named by loads ahead per thread and chunks per block.
constexpr SumsqVariant kSumsq[] = {
    {"legacy", launch_sumsq},
    {"ahead8_c1", launch_sumsq_fast<8, 1>},
    {"ahead16_c1", launch_sumsq_fast<16, 1>},
    {"ahead16_c4", launch_sumsq_fast<16, 4>},
    {"ahead16_c8", launch_sumsq_fast<16, 8>},
};
static_assert(sizeof(kSumsq) / sizeof(kSumsq[0]) == kSumsqVariants, "kSumsqVariants");

template <int kU, bool kStream, int kMinBlocks, int kChunks>
void launch_adamw_fast(const OptimChunk* chunks, unsigned n, const AdamWConstants& k,
                       const float* scale, cudaStream_t s) {
  adamw_fast_kernel<kU, kStream, kMinBlocks, kChunks>
      <<<(n + kChunks - 1) / kChunks, kThreads, 0, s>>>(chunks, n, k, scale);
}

void launch_adamw(const OptimChunk* chunks, unsigned n, const AdamWConstants& k, const float* scale,
                  cudaStream_t s) {
  adamw_kernel<<<n, kThreads, 0, s>>>(chunks, k, scale);
}

struct AdamWVariant {
  const char* name;
  void (*launch)(const OptimChunk*, unsigned, const AdamWConstants&, const float*, cudaStream_t);
};

// Named by float4 groups in flight per operand, cache hint, resident blocks per SM (the register
// bound: 6 blocks is the old kernel's occupancy) and chunks per block.
constexpr AdamWVariant kAdamW[] = {
    {"legacy", launch_adamw},
    {"x1_stream_b6_c1", launch_adamw_fast<1, true, 6, 1>},
    {"x2_stream_b4_c1", launch_adamw_fast<2, true, 4, 1>},
    {"x2_stream_b5_c1", launch_adamw_fast<2, true, 5, 1>},
    {"x4_stream_b2_c1", launch_adamw_fast<4, true, 2, 1>},
    {"x4_stream_b3_c1", launch_adamw_fast<4, true, 3, 1>},
    {"x8_stream_b1_c1", launch_adamw_fast<8, true, 1, 1>},
    {"x2_plain_b5_c1", launch_adamw_fast<2, false, 5, 1>},
    {"x4_plain_b3_c1", launch_adamw_fast<4, false, 3, 1>},
    {"x2_stream_b3_c4", launch_adamw_fast<2, true, 3, 4>},
    {"x2_stream_b4_c4", launch_adamw_fast<2, true, 4, 4>},
    {"x4_stream_b2_c4", launch_adamw_fast<4, true, 2, 4>},
};
static_assert(sizeof(kAdamW) / sizeof(kAdamW[0]) == kAdamWVariants, "kAdamWVariants");

}  // namespace

void grad_sumsq_partials(const OptimChunk* chunks, int64_t num_chunks, double* partials,
                         void* stream) {
  grad_sumsq_partials_variant(optimizer_variants().sumsq, chunks, num_chunks, partials, stream);
}

void grad_sumsq_partials_variant(int variant, const OptimChunk* chunks, int64_t num_chunks,
                                 double* partials, void* stream) {
  GTRON_CHECK(num_chunks >= 0 && num_chunks < (int64_t{1} << 31),
              "grad_sumsq_partials: ", num_chunks, " chunks");
  GTRON_CHECK(0 <= variant && variant < kSumsqVariants, "grad_sumsq_partials: variant ", variant);
  if (num_chunks == 0) return;
  kSumsq[variant].launch(chunks, static_cast<unsigned>(num_chunks), partials,
                         static_cast<cudaStream_t>(stream));
  CUDA_CHECK_LAUNCH();
}

const char* sumsq_variant_name(int variant) {
  GTRON_CHECK(0 <= variant && variant < kSumsqVariants, "sumsq_variant_name: ", variant);
  return kSumsq[variant].name;
}

void grad_norm_finalize(const double* partials, int64_t num_partials, double clip, float* norm_out,
                        float* scale_out, void* stream) {
  GTRON_CHECK(num_partials >= 0 && norm_out != nullptr && scale_out != nullptr,
              "grad_norm_finalize: bad arguments");
  finalize_kernel<<<1, kFinalThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      partials, num_partials, clip, norm_out, scale_out);
  CUDA_CHECK_LAUNCH();
}

void sum_partials_split(const double* partials, int64_t split, int64_t n, double* out,
                        void* stream) {
  GTRON_CHECK(0 <= split && split <= n && out != nullptr, "sum_partials_split: split ", split,
              " of ", n);
  split_sum_kernel<<<1, 2, 0, static_cast<cudaStream_t>(stream)>>>(partials, split, n, out);
  CUDA_CHECK_LAUNCH();
}

void adamw_chunks(const OptimChunk* chunks, int64_t num_chunks, const AdamWConstants& k,
                  const float* scale, void* stream) {
  adamw_chunks_variant(optimizer_variants().adamw, chunks, num_chunks, k, scale, stream);
}

void adamw_chunks_variant(int variant, const OptimChunk* chunks, int64_t num_chunks,
                          const AdamWConstants& k, const float* scale, void* stream) {
  GTRON_CHECK(num_chunks >= 0 && num_chunks < (int64_t{1} << 31) && scale != nullptr,
              "adamw_chunks: ", num_chunks, " chunks");
  GTRON_CHECK(0 <= variant && variant < kAdamWVariants, "adamw_chunks: variant ", variant);
  if (num_chunks == 0) return;
  kAdamW[variant].launch(chunks, static_cast<unsigned>(num_chunks), k, scale,
                         static_cast<cudaStream_t>(stream));
  CUDA_CHECK_LAUNCH();
}

const char* adamw_variant_name(int variant) {
  GTRON_CHECK(0 <= variant && variant < kAdamWVariants, "adamw_variant_name: ", variant);
  return kAdamW[variant].name;
}

OptimizerVariants optimizer_variants() {
  static const OptimizerVariants chosen = [] {
    const char* e = std::getenv("GTRON_ADAMW_FAST");
    const std::string v = e != nullptr ? e : "";
    if (v == "0") return OptimizerVariants{0, 0};
    OptimizerVariants out{kSumsqFastVariant, kAdamWFastVariant};
    if (v.empty() || v == "1") return out;
    std::string names;  // for the message
    std::stringstream list(v);
    for (std::string name; std::getline(list, name, ',');) {
      bool known = false;
      for (int i = 0; i < kAdamWVariants; ++i) {
        if (name != kAdamW[i].name) continue;
        out.adamw = i;
        known = true;
      }
      for (int i = 0; i < kSumsqVariants; ++i) {
        if (name != kSumsq[i].name) continue;
        out.sumsq = i;
        known = true;
      }
      if (!known) {
        for (const AdamWVariant& a : kAdamW) names += std::string(" ") + a.name;
        for (const SumsqVariant& q : kSumsq) names += std::string(" ") + q.name;
        throw UserError(
            str_cat("GTRON_ADAMW_FAST is '", v, "'; expected 0 (the old kernels), ",
                    "1 or unset (the fast ones), or variant names joined by ',' from:", names));
      }
    }
    return out;
  }();
  return chosen;
}

void accumulate_scalars(const ScalarList& list, float factor, float* dst, void* stream) {
  GTRON_CHECK(list.n >= 0 && list.n <= kMaxScalars, "accumulate_scalars: ", list.n,
              " scalars (at most ", kMaxScalars, ")");
  if (list.n == 0) return;
  accumulate_kernel<<<1, 32, 0, static_cast<cudaStream_t>(stream)>>>(list, factor, dst);
  CUDA_CHECK_LAUNCH();
}

}  // namespace gtron::cuda

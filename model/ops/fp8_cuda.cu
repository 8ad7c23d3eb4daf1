// The CUDA FP8 quantizers (Note [fp8 recipe], [fp8 layouts] in fp8.h): the same codes and scales
// as the CPU reference (fp8_cpu.cc) bit for bit, through the tile arithmetic of fp8_tile.cuh (Note
// [fp8 tile arithmetic]). A tile with a non-finite value gets a NaN scale and NaN codes (0x7f), as
// on the CPU.
//
// Note [fp8 quantizer bandwidth]
// Each quantizer reads its input once and writes each code once: a tile waits in registers or
// shared memory while its amax is reduced, and is never read twice. Bytes an element (codes 1,
// scales 4/128 a tiling) and the time at 3 TB/s (an H100 streams 3.0-3.3), Llama-3.2-1B shapes:
//   rows       bf16 x: 2 read, 1 + 1/32 written.   [8192, 2048]: 51 MB, 17 us.
//   cols       the same, the codes transposed.      [8192, 8192]: 203 MB, 68 us (was 252).
//   rows_cols  2 read, 2 + 1/16 written.            [8192, 16384]: 545 MB, 182 us (was 322);
//                                                   [8192, 3072]: 102 MB, 34 us.
//   blocks     fp32 w: 4 read, 2 written (q, qt).   [2048, 3072]: 38 MB, 13 us (was 55);
//                                                   [16384, 2048]: 201 MB, 67 us;
//                                                   [2048, 8192]: 101 MB, 34 us.
// A training step at 8192 tokens (16 layers; 64 calls of each of rows_cols, cols, blocks) then
// moves 12.5 + 5.7 + 5.8 GB: about 4.2 + 1.9 + 2.0 ms, against 8.9 + 8.2 + 6.8 ms measured before.
// Reaching that takes ~25 KB in flight an SM (3.3 TB/s times ~1 us of loaded latency, over 132
// SMs), and few enough instructions: at 3 TB/s an SM (128 lanes a clock, 1.75 GHz) has ~39 issue
// slots an element in rows_cols, 30 in rows and cols, 59 in blocks. The kernels:
// - rows: a half-warp a 1x128 tile (a 16-byte load of 8 bf16 a lane: the producers' layout), two
//   rows a half in flight before either is coded; rows on grid x and k-tiles on y (no division).
// - cols and rows_cols: a 128x128 tile a CTA of 256, staged in shared memory by 8 16-byte loads a
//   thread issued together; the chunks are swizzled so that the column reads (a bf16x2 word, one
//   column pair, a thread and row) meet no bank conflict; 8 lanes a pair reduce its two amaxes as
//   bf16x2 and store 16 codes of each column with one 16-byte store (8 lanes fill a 128-byte line
//   of qt). rows_cols codes the row tiles from the registers it loaded.
// - blocks: a 128x128 block a CTA of 512, 32 values a thread (8 16-byte loads in flight), so even
//   the 384 blocks of [2048, 3072] keep 2 CTAs (128 KB in flight) on every SM most of the time; q
//   is stored from registers (a warp a 128-byte row), qt through shared memory (swizzled words, two
//   4x4 byte transposes a thread, 8-byte stores, 16 lanes a 128-byte line).
// Instructions an element, from the PTX of the fast paths (register moves and the abs folded into
// max not counted): rows ~10, cols ~7, rows_cols ~14, blocks ~14; the old kernels took 42, 26 and
// 23 (an ldexpf an element among them), and blocks read its input twice. Shared memory: the column
// pass reads 4 bytes a pair of elements.
// ptxas (CUDA 13, sm_90), no spills: rows 32 registers (8 CTAs of 256 an SM), cols 40 (6 CTAs, 192
// KB of shared memory), rows_cols 64 (4 CTAs), blocks 64 (2 CTAs of 512); the launch bounds say so.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "model/cuda/kernel_util.cuh"
#include "model/ops/fp8.h"
#include "model/ops/fp8_blocks.cuh"
#include "model/ops/fp8_tile.cuh"

namespace gtron::cuda {

namespace {

constexpr int kTile = static_cast<int>(fp8::kTile);
static_assert(kTile == kBlockTile, "fp8_blocks.cuh's block is the recipe's tile");

__device__ __forceinline__ uint32_t bits_of(bf16 v) { return __bfloat16_as_ushort(v); }

// 8 bf16 of a row from column c as a bf16x2 uint4 (zeros past K). kVec: one 16-byte load
// (REQUIRES: c % 8 == 0, K % 8 == 0, the row 16-byte aligned); else element by element.
template <bool kVec>
__device__ __forceinline__ uint4 load8(const bf16* __restrict__ row, int64_t c, int64_t K) {
  if constexpr (kVec) {
    return c < K ? *reinterpret_cast<const uint4*>(row + c) : make_uint4(0, 0, 0, 0);
  } else {
    uint32_t h[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) h[i] = c + i < K ? bits_of(row[c + i]) : 0u;
    return make_uint4(h[0] | h[1] << 16, h[2] | h[3] << 16, h[4] | h[5] << 16, h[6] | h[7] << 16);
  }
}

// quantize_rows: a half-warp a 1x128 tile along K, lane l holding its elements [8l, 8l + 8)
// (half_tile_scale's layout). A CTA of kRowsThreads takes k-tile blockIdx.y of kRowsPerHalf · 16
// rows; each half kRowsPerHalf rows 16 apart, all loaded before any is coded. kVec: K % 8 == 0,
// x 16-byte and q 8-byte aligned; else element by element.
constexpr int kRowsThreads = 256;
constexpr int kRowsPerHalf = 2;
constexpr int kRowsPerCta = kRowsPerHalf * kRowsThreads / 16;

template <bool kVec>
__global__ void __launch_bounds__(kRowsThreads)
    quantize_rows_kernel(const bf16* __restrict__ x, int64_t R, int64_t K, uint8_t* __restrict__ q,
                         float* __restrict__ s) {
  const int l = threadIdx.x & 15;
  const int64_t k = static_cast<int64_t>(blockIdx.y) * kTile + 8 * l;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kRowsPerCta + threadIdx.x / 16;
  uint4 w[kRowsPerHalf];
#pragma unroll
  for (int i = 0; i < kRowsPerHalf; ++i) {
    const int64_t r = r0 + 16 * i;
    w[i] = r < R ? load8<kVec>(x + r * K, k, K) : make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (int i = 0; i < kRowsPerHalf; ++i) {
    const int64_t r = r0 + 16 * i;
    if (r >= R) break;  // the whole half-warp leaves together
    float v[8];
    unpack8(w[i], v);
    const E4M3Scale t = half_tile_scale(v);
    const uint2 codes = t.encode8(v);
    uint8_t* dst = q + r * K + k;
    if constexpr (kVec) {
      if (k < K) *reinterpret_cast<uint2*>(dst) = codes;
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j)
        if (k + j < K) dst[j] = static_cast<uint8_t>((j < 4 ? codes.x : codes.y) >> (8 * (j % 4)));
    }
    if (l == 0) s[blockIdx.y * R + r] = t.scale();
  }
}

// quantize_cols (kRows false) and quantize_rows_cols (true): a 128 (rows) x 128 (columns) tile of
// x[R, K] a CTA of 256 threads: thread t loads 16-byte chunk t % 16 of rows t / 16 + 16i (i < 8),
// all 8 loads in flight, and code_tile_rows_cols (fp8_tile.cuh) codes the tile's columns (and
// rows) from those registers through shared memory. kVec: K % 8 == 0 and x 16-byte aligned
// (always so with kRows); else element-wise loads (K % 4 == 0 keeps column pairs whole).
constexpr int kColsThreads = 256;

template <bool kRows, bool kVec>
__global__ void __launch_bounds__(kColsThreads, kRows ? 4 : 6)
    quantize_cols_kernel(const bf16* __restrict__ x, int64_t R, int64_t K, uint8_t* __restrict__ q,
                         float* __restrict__ s, uint8_t* __restrict__ qt, float* __restrict__ st) {
  __shared__ uint4 tile[kTile][kTile / 8];
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int t = threadIdx.x, chunk = t % 16, row0 = t / 16;
  uint4 w[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) w[i] = load8<kVec>(x + (r0 + row0 + 16 * i) * K, c0 + 8 * chunk, K);
  code_tile_rows_cols<kRows>(tile, w, r0, c0, R, K, q, s, qt, st);
}

// quantize_blocks: one 128x128 block of w[N, K] a CTA of 512 threads, held in registers and coded
// by code_block (fp8_blocks.cuh, which AdamW's fused update shares; 8 loads a thread in flight).
// kVec: K % 4 == 0, w aligned to 4 values and q to 4 bytes; else element by element. qt_vec:
// N % 8 == 0, qt 8-byte aligned; else byte stores.

// The n (0-4) values at w[i, i + n) as floats, zeros after them (the pointer is formed only for
// n > 0: a row past the matrix is never addressed).
template <typename T, bool kVec>
__device__ __forceinline__ void load4(const T* __restrict__ w, int64_t i, int n, float (&v)[4]) {
  v[0] = v[1] = v[2] = v[3] = 0.0f;
  if (n == 0) return;
  if constexpr (kVec && std::is_same_v<T, float>) {
    const float4 f = *reinterpret_cast<const float4*>(w + i);
    v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
  } else if constexpr (kVec) {
    const uint2 h = *reinterpret_cast<const uint2*>(w + i);
    v[0] = bf16_lo(h.x), v[1] = bf16_hi(h.x), v[2] = bf16_lo(h.y), v[3] = bf16_hi(h.y);
  } else {
#pragma unroll
    for (int m = 0; m < 4; ++m)
      if (m < n) v[m] = to_float(w[i + m]);
  }
}

template <typename T, bool kVec>
__global__ void __launch_bounds__(kBlockThreads, 2)
    quantize_blocks_kernel(const T* __restrict__ w, int64_t N, int64_t K, uint8_t* __restrict__ q,
                           float* __restrict__ s, uint8_t* __restrict__ qt, float* __restrict__ st,
                           bool qt_vec) {
  const BlockPlace b(N, K, blockIdx.y, blockIdx.x);
  float v[8][4];
#pragma unroll
  for (int j = 0; j < 8; ++j) load4<T, kVec>(w, b.at + j * K, b.count(j), v[j]);
  code_block<kVec>(v, b, blockIdx.y, blockIdx.x, q, s, qt, st, qt_vec);
}

template <typename T>
__global__ void dequantize_blocks_kernel(const uint8_t* __restrict__ q, const float* __restrict__ s,
                                         int64_t N, int64_t K, int64_t ld, T* __restrict__ out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N * K) return;
  const int64_t n = i / K, k = i % K;
  const __half_raw h = __nv_cvt_fp8_to_halfraw(q[i], __NV_E4M3);
  out[i] = from_float<T>(__half2float(__half(h)) * s[(n / kTile) * ld + k / kTile]);
}

// y[r, c] += bias[c]: one block a row (grid-stride), bf16 y.
template <typename B>
__global__ void add_bias_kernel(bf16* __restrict__ y, const B* __restrict__ bias, int64_t N,
                                int64_t C) {
  const int Ci = static_cast<int>(C);
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    bf16* row = y + n * C;
    for (int c = threadIdx.x; c < Ci; c += blockDim.x)
      row[c] = __float2bfloat16_rn(__bfloat162float(row[c]) + to_float(bias[c]));
  }
}

// quantize_cols_kernel<kRows> over x[R, K]. REQUIRES: R % 128 == 0, K % 4 == 0 (checked by the
// callers); with kRows, K % 128 == 0 and x 16-byte aligned.
template <bool kRows>
void launch_cols(const void* x, int64_t R, int64_t K, uint8_t* q, float* s, uint8_t* qt, float* st,
                 void* stream) {
  GTRON_CHECK(R / fp8::kTile <= 65535, "fp8 column quantizer: R = ", R,
              "; at most 65535 tiles of 128");
  GTRON_CHECK(is_aligned(qt, 16) && (!kRows || is_aligned(q, 8)), "fp8 column quantizer: codes at ",
              static_cast<const void*>(q), " / ", static_cast<const void*>(qt),
              "; qt must be 16-byte and q 8-byte aligned");
  const dim3 grid(static_cast<unsigned>(fp8::tiles(K)), static_cast<unsigned>(R / fp8::kTile));
  cudaStream_t cs = static_cast<cudaStream_t>(stream);
  const auto* xp = static_cast<const bf16*>(x);
  if (kRows || (K % 8 == 0 && is_aligned(x, 16))) {
    quantize_cols_kernel<kRows, true><<<grid, kColsThreads, 0, cs>>>(xp, R, K, q, s, qt, st);
  } else {
    quantize_cols_kernel<false, false><<<grid, kColsThreads, 0, cs>>>(xp, R, K, q, s, qt, st);
  }
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_blocks(const T* w, int64_t N, int64_t K, uint8_t* q, float* s, uint8_t* qt, float* st,
                   cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(fp8::tiles(K)), static_cast<unsigned>(fp8::tiles(N)));
  const bool vec = K % 4 == 0 && is_aligned(w, 4 * sizeof(T)) && is_aligned(q, 4);
  const bool qt_vec = N % 8 == 0 && is_aligned(qt, 8);
  if (vec) {
    quantize_blocks_kernel<T, true>
        <<<grid, kBlockThreads, 0, stream>>>(w, N, K, q, s, qt, st, qt_vec);
  } else {
    quantize_blocks_kernel<T, false>
        <<<grid, kBlockThreads, 0, stream>>>(w, N, K, q, s, qt, st, qt_vec);
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void fp8_add_bias(void* y, const void* bias, DType bias_dtype, int64_t N, int64_t C, void* stream) {
  GTRON_CHECK(bias_dtype == DType::kF32 || bias_dtype == DType::kBF16,
              "fp8_add_bias: ", dtype_name(bias_dtype), " bias; expected f32 or bf16");
  if (N == 0 || C == 0) return;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(N, int64_t{1} << 30));
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  if (bias_dtype == DType::kF32) {
    add_bias_kernel<float>
        <<<blocks, 256, 0, st>>>(static_cast<bf16*>(y), static_cast<const float*>(bias), N, C);
  } else {
    add_bias_kernel<bf16>
        <<<blocks, 256, 0, st>>>(static_cast<bf16*>(y), static_cast<const bf16*>(bias), N, C);
  }
  CUDA_CHECK_LAUNCH();
}

void fp8_dequantize_blocks(const uint8_t* q, const float* s, int64_t N, int64_t K, void* out,
                           DType out_dtype, void* stream) {
  GTRON_CHECK(out_dtype == DType::kF32 || out_dtype == DType::kBF16,
              "fp8_dequantize_blocks: ", dtype_name(out_dtype), " output; expected f32 or bf16");
  if (N * K == 0) return;
  const unsigned blocks = static_cast<unsigned>(ceil_div<int64_t>(N * K, 256));
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  const int64_t ld = fp8::block_scale_ld(K);
  if (out_dtype == DType::kF32) {
    dequantize_blocks_kernel<float>
        <<<blocks, 256, 0, st>>>(q, s, N, K, ld, static_cast<float*>(out));
  } else {
    dequantize_blocks_kernel<bf16><<<blocks, 256, 0, st>>>(q, s, N, K, ld, static_cast<bf16*>(out));
  }
  CUDA_CHECK_LAUNCH();
}

void fp8_quantize_rows(const void* x, int64_t R, int64_t K, uint8_t* q, float* s, void* stream) {
  if (R == 0 || K == 0) return;
  GTRON_CHECK(fp8::tiles(K) <= 65535, "fp8_quantize_rows: K = ", K, "; at most 65535 tiles of 128");
  const dim3 grid(static_cast<unsigned>(ceil_div<int64_t>(R, kRowsPerCta)),
                  static_cast<unsigned>(fp8::tiles(K)));
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  const auto* xp = static_cast<const bf16*>(x);
  if (K % 8 == 0 && is_aligned(x, 16) && is_aligned(q, 8)) {
    quantize_rows_kernel<true><<<grid, kRowsThreads, 0, st>>>(xp, R, K, q, s);
  } else {
    quantize_rows_kernel<false><<<grid, kRowsThreads, 0, st>>>(xp, R, K, q, s);
  }
  CUDA_CHECK_LAUNCH();
}

void fp8_quantize_cols(const void* x, int64_t R, int64_t K, uint8_t* qt, float* st, void* stream) {
  GTRON_CHECK(R % fp8::kTile == 0 && K % 4 == 0, "fp8_quantize_cols: R = ", R, ", K = ", K,
              "; R a multiple of 128 and K of 4");
  if (R == 0 || K == 0) return;
  launch_cols<false>(x, R, K, nullptr, nullptr, qt, st, stream);
}

void fp8_quantize_rows_cols(const void* x, int64_t R, int64_t K, uint8_t* q, float* s, uint8_t* qt,
                            float* st, void* stream) {
  GTRON_CHECK(R % fp8::kTile == 0 && K % fp8::kTile == 0, "fp8_quantize_rows_cols: R = ", R,
              ", K = ", K, "; both multiples of 128");
  if (R == 0 || K == 0) return;
  if (!is_aligned(x, 16)) {  // the two passes (the same codes) rather than a slow staging path
    fp8_quantize_rows(x, R, K, q, s, stream);
    fp8_quantize_cols(x, R, K, qt, st, stream);
    return;
  }
  launch_cols<true>(x, R, K, q, s, qt, st, stream);
}

void fp8_quantize_blocks(const void* w, DType w_dtype, int64_t N, int64_t K, uint8_t* q, float* s,
                         uint8_t* qt, float* st, void* stream) {
  GTRON_CHECK(w_dtype == DType::kF32 || w_dtype == DType::kBF16,
              "fp8_quantize_blocks: ", dtype_name(w_dtype), " weights; expected f32 or bf16");
  if (N == 0 || K == 0) return;
  GTRON_CHECK(fp8::tiles(N) <= 65535, "fp8_quantize_blocks: N = ", N,
              "; at most 65535 blocks of 128");
  cudaStream_t cs = static_cast<cudaStream_t>(stream);
  if (w_dtype == DType::kF32) {
    launch_blocks(static_cast<const float*>(w), N, K, q, s, qt, st, cs);
  } else {
    launch_blocks(static_cast<const bf16*>(w), N, K, q, s, qt, st, cs);
  }
}

}  // namespace gtron::cuda

// The CUDA FP8 quantizers (Note [fp8 recipe], [fp8 layouts] in fp8.h): the same codes and scales
// as the CPU reference (fp8_cpu.cc) bit for bit: power-of-two scales make the scaling exact, and
// cvt.rn.satfinite rounds like encode_e4m3 (the tile arithmetic: fp8_tile.cuh).
//
// Each is one pass over its input (bf16 activations and gradients; the weight in fp32 or bf16):
// amax of the tile, its scale, then the codes. A tile with a non-finite value gets a NaN scale and
// NaN codes (0x7f), as on the CPU.
#include <algorithm>
#include <cmath>

#include "model/cuda/kernel_util.cuh"
#include "model/ops/fp8.h"
#include "model/ops/fp8_tile.cuh"

namespace gtron::cuda {

namespace {

constexpr int kTile = static_cast<int>(fp8::kTile);

__device__ __forceinline__ float load(const bf16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ float load(const float* p) { return *p; }

// One warp a 1x128 tile along K: lane l holds elements [4l, 4l + 4) of it.
__global__ void quantize_rows_kernel(const bf16* __restrict__ x, int64_t R, int64_t K,
                                     uint8_t* __restrict__ q, float* __restrict__ s) {
  const int lane = threadIdx.x & 31;
  const int64_t tiles_k = (K + kTile - 1) / kTile;
  const int64_t tile = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (tile >= R * tiles_k) return;
  const int64_t r = tile / tiles_k, kb = tile % tiles_k;
  const int64_t k0 = kb * kTile + 4 * lane;
  float v[4];
  float amax = 0.0f;
  bool bad = false;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[i] = k0 + i < K ? load(x + r * K + k0 + i) : 0.0f;
    bad |= !isfinite(v[i]);
    amax = fmaxf(amax, fabsf(v[i]));
  }
  bad = __any_sync(0xffffffffu, bad);
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const int e = bad ? 0 : e4m3_scale_exponent(amax);
#pragma unroll
  for (int i = 0; i < 4; ++i)
    if (k0 + i < K) q[r * K + k0 + i] = e4m3_encode(v[i], e, bad);
  if (lane == 0) s[kb * R + r] = e4m3_scale(e, bad);
}

// A 128 (rows) x 64 (columns) tile of x[R, K] per block of 256 threads: each column's 128 values
// are one tile of xᵀ; written transposed, qt[K, R], scales st[R / 128, K].
constexpr int kColsPerBlock = 64;

__global__ void quantize_cols_kernel(const bf16* __restrict__ x, int64_t R, int64_t K,
                                     uint8_t* __restrict__ qt, float* __restrict__ st) {
  __shared__ float tile[kTile][kColsPerBlock + 1];
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kColsPerBlock;
  for (int i = threadIdx.x; i < kTile * kColsPerBlock; i += blockDim.x) {
    const int r = i / kColsPerBlock, c = i % kColsPerBlock;
    tile[r][c] = c0 + c < K ? load(x + (r0 + r) * K + c0 + c) : 0.0f;
  }
  __syncthreads();
  // Four threads a column (adjacent lanes), 32 rows each.
  const int c = threadIdx.x / 4, part = threadIdx.x % 4;
  float amax = 0.0f;
  bool bad = false;
  for (int r = part * 32; r < part * 32 + 32; ++r) {
    bad |= !isfinite(tile[r][c]);
    amax = fmaxf(amax, fabsf(tile[r][c]));
  }
  for (int o = 1; o < 4; o <<= 1) {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    bad |= __shfl_xor_sync(0xffffffffu, static_cast<int>(bad), o) != 0;
  }
  if (c0 + c >= K) return;
  const int e = bad ? 0 : e4m3_scale_exponent(amax);
  alignas(16) uint8_t codes[32];  // read back as uint4: 16-byte aligned even in local memory
#pragma unroll
  for (int i = 0; i < 32; ++i) codes[i] = e4m3_encode(tile[part * 32 + i][c], e, bad);
  uint4* dst = reinterpret_cast<uint4*>(qt + (c0 + c) * R + r0 + part * 32);
  dst[0] = *reinterpret_cast<const uint4*>(codes);
  dst[1] = *reinterpret_cast<const uint4*>(codes + 16);
  if (part == 0) st[(r0 / kTile) * K + c0 + c] = e4m3_scale(e, bad);
}

// One 128x128 tile of x[R, K] per block of 256 threads, read once: its 128 row tiles (1x128
// along K) as quantize_rows_kernel codes them, and its 128 column tiles (128x1 along R) as
// quantize_cols_kernel does, written transposed.
__global__ void quantize_rows_cols_kernel(const bf16* __restrict__ x, int64_t R, int64_t K,
                                          uint8_t* __restrict__ q, float* __restrict__ s,
                                          uint8_t* __restrict__ qt, float* __restrict__ st) {
  __shared__ bf16 tile[kTile][kTile + 8];  // +8: a row starts 16 bytes off the last one's bank
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  // 16-byte loads: a row of the tile is 16 chunks of 8 values.
  for (int i = threadIdx.x; i < kTile * 16; i += blockDim.x) {
    const int r = i / 16, c = (i % 16) * 8;
    *reinterpret_cast<uint4*>(&tile[r][c]) =
        *reinterpret_cast<const uint4*>(x + (r0 + r) * K + c0 + c);
  }
  __syncthreads();
  // Row tiles: warp w takes rows w, w + 8, ...; lane l holds elements [4l, 4l + 4).
  for (int r = warp; r < kTile; r += 8) {
    float v[4];
    float amax = 0.0f;
    bool bad = false;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[i] = __bfloat162float(tile[r][4 * lane + i]);
      bad |= !isfinite(v[i]);
      amax = fmaxf(amax, fabsf(v[i]));
    }
    bad = __any_sync(0xffffffffu, bad);
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const int e = bad ? 0 : e4m3_scale_exponent(amax);
    uint32_t packed = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i)
      packed |= static_cast<uint32_t>(e4m3_encode(v[i], e, bad)) << (8 * i);
    *reinterpret_cast<uint32_t*>(q + (r0 + r) * K + c0 + 4 * lane) = packed;
    if (lane == 0) s[blockIdx.x * R + r0 + r] = e4m3_scale(e, bad);
  }
  // Column tiles: two adjacent threads a column, 64 rows each.
  const int c = threadIdx.x / 2, part = threadIdx.x % 2;
  float amax = 0.0f;
  bool bad = false;
  for (int r = part * 64; r < part * 64 + 64; ++r) {
    const float v = __bfloat162float(tile[r][c]);
    bad |= !isfinite(v);
    amax = fmaxf(amax, fabsf(v));
  }
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
  bad |= __shfl_xor_sync(0xffffffffu, static_cast<int>(bad), 1) != 0;
  const int e = bad ? 0 : e4m3_scale_exponent(amax);
  uint8_t* dst = qt + (c0 + c) * R + r0 + part * 64;
#pragma unroll
  for (int chunk = 0; chunk < 4; ++chunk) {
    alignas(16) uint8_t codes[16];  // read back as a uint4
#pragma unroll
    for (int i = 0; i < 16; ++i)
      codes[i] = e4m3_encode(__bfloat162float(tile[part * 64 + chunk * 16 + i][c]), e, bad);
    reinterpret_cast<uint4*>(dst)[chunk] = *reinterpret_cast<const uint4*>(codes);
  }
  if (part == 0) st[(r0 / kTile) * K + c0 + c] = e4m3_scale(e, bad);
}

// One 128x128 block of w[N, K] per block of 256 threads: codes as stored (q) and transposed (qt),
// with the block's scale in both scale layouts; the padding of each scale row is zeroed.
template <typename T>
__global__ void quantize_blocks_kernel(const T* __restrict__ w, int64_t N, int64_t K,
                                       uint8_t* __restrict__ q, float* __restrict__ s,
                                       uint8_t* __restrict__ qt, float* __restrict__ st) {
  __shared__ uint8_t codes[kTile][kTile + 4];
  __shared__ float warp_max[8];
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int64_t k0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int rows = static_cast<int>(min(static_cast<int64_t>(kTile), N - n0));
  const int cols = static_cast<int>(min(static_cast<int64_t>(kTile), K - k0));
  float amax = 0.0f;
  bool bad = false;
  for (int i = threadIdx.x; i < kTile * kTile; i += blockDim.x) {
    const int r = i / kTile, c = i % kTile;
    if (r < rows && c < cols) {
      const float v = load(w + (n0 + r) * K + k0 + c);
      bad |= !isfinite(v);
      amax = fmaxf(amax, fabsf(v));
    }
  }
  bad = __syncthreads_or(bad) != 0;
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x / 32] = amax;
  __syncthreads();
  amax = 0.0f;
  for (int i = 0; i < static_cast<int>(blockDim.x / 32); ++i) amax = fmaxf(amax, warp_max[i]);
  const int e = bad ? 0 : e4m3_scale_exponent(amax);
  for (int i = threadIdx.x; i < kTile * kTile; i += blockDim.x) {
    const int r = i / kTile, c = i % kTile;
    if (r < rows && c < cols) {
      const uint8_t code = e4m3_encode(load(w + (n0 + r) * K + k0 + c), e, bad);
      if (q != nullptr) q[(n0 + r) * K + k0 + c] = code;
      codes[r][c] = code;
    }
  }
  const int64_t tiles_n = (N + kTile - 1) / kTile, tiles_k = (K + kTile - 1) / kTile;
  const int64_t ld = (tiles_k + 3) / 4 * 4, ld_t = (tiles_n + 3) / 4 * 4;
  if (threadIdx.x == 0) {
    if (s != nullptr) {
      s[blockIdx.y * ld + blockIdx.x] = e4m3_scale(e, bad);
      if (blockIdx.x == tiles_k - 1)
        for (int64_t j = tiles_k; j < ld; ++j) s[blockIdx.y * ld + j] = 0.0f;
    }
    if (st != nullptr) {
      st[blockIdx.x * ld_t + blockIdx.y] = e4m3_scale(e, bad);
      if (blockIdx.y == tiles_n - 1)
        for (int64_t j = tiles_n; j < ld_t; ++j) st[blockIdx.x * ld_t + j] = 0.0f;
    }
  }
  if (qt == nullptr) return;
  __syncthreads();
  for (int i = threadIdx.x; i < kTile * kTile; i += blockDim.x) {
    const int c = i / kTile, r = i % kTile;  // qt row c, its element r
    if (r < rows && c < cols) qt[(k0 + c) * N + n0 + r] = codes[r][c];
  }
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
      row[c] = __float2bfloat16_rn(__bfloat162float(row[c]) + load(bias + c));
  }
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
  const int64_t tiles = R * fp8::tiles(K);
  if (tiles == 0) return;
  constexpr int kThreads = 256;
  quantize_rows_kernel<<<static_cast<unsigned>(ceil_div<int64_t>(tiles * 32, kThreads)), kThreads,
                         0, static_cast<cudaStream_t>(stream)>>>(static_cast<const bf16*>(x), R, K,
                                                                 q, s);
  CUDA_CHECK_LAUNCH();
}

void fp8_quantize_cols(const void* x, int64_t R, int64_t K, uint8_t* qt, float* st, void* stream) {
  GTRON_CHECK(R % fp8::kTile == 0 && K % 4 == 0, "fp8_quantize_cols: R = ", R, ", K = ", K,
              "; R a multiple of 128 and K of 4");
  if (R == 0 || K == 0) return;
  const dim3 grid(static_cast<unsigned>(ceil_div<int64_t>(K, kColsPerBlock)),
                  static_cast<unsigned>(R / fp8::kTile));
  quantize_cols_kernel<<<grid, 256, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const bf16*>(x), R, K, qt, st);
  CUDA_CHECK_LAUNCH();
}

void fp8_quantize_rows_cols(const void* x, int64_t R, int64_t K, uint8_t* q, float* s, uint8_t* qt,
                            float* st, void* stream) {
  GTRON_CHECK(R % fp8::kTile == 0 && K % fp8::kTile == 0, "fp8_quantize_rows_cols: R = ", R,
              ", K = ", K, "; both multiples of 128");
  if (R == 0 || K == 0) return;
  const dim3 grid(static_cast<unsigned>(K / fp8::kTile), static_cast<unsigned>(R / fp8::kTile));
  quantize_rows_cols_kernel<<<grid, 256, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const bf16*>(x), R, K, q, s, qt, st);
  CUDA_CHECK_LAUNCH();
}

void fp8_quantize_blocks(const void* w, DType w_dtype, int64_t N, int64_t K, uint8_t* q, float* s,
                         uint8_t* qt, float* st, void* stream) {
  GTRON_CHECK(w_dtype == DType::kF32 || w_dtype == DType::kBF16,
              "fp8_quantize_blocks: ", dtype_name(w_dtype), " weights; expected f32 or bf16");
  if (N == 0 || K == 0) return;
  const dim3 grid(static_cast<unsigned>(fp8::tiles(K)), static_cast<unsigned>(fp8::tiles(N)));
  cudaStream_t st_ = static_cast<cudaStream_t>(stream);
  if (w_dtype == DType::kF32) {
    quantize_blocks_kernel<float>
        <<<grid, 256, 0, st_>>>(static_cast<const float*>(w), N, K, q, s, qt, st);
  } else {
    quantize_blocks_kernel<bf16>
        <<<grid, 256, 0, st_>>>(static_cast<const bf16*>(w), N, K, q, s, qt, st);
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace gtron::cuda

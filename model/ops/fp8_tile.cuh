// The e4m3 tile arithmetic the CUDA quantizers share (Note [fp8 recipe] in model/ops/fp8.h): a
// tile's amax, its scale exponent, the scale itself and its values' codes; and the 1x128 row tile
// as a producing kernel holds it, 8 values in each of 16 lanes (Note [fp8 fused producers] in
// fp8.h). Note [fp8 tile arithmetic] says why each step equals the CPU reference (fp8_cpu.cc) bit
// for bit.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "model/cuda/kernel_util.cuh"

namespace gtron::cuda {

// Note [fp8 tile arithmetic]
// The CPU reference takes a tile's amax (NaN if a value is not finite), e = scale_exponent(amax)
// through frexp, and the codes encode_e4m3(ldexp(x, -e)). The CUDA quantizers run the same steps
// in a few instructions an element, without a branch (the build has no -ftz or fast math: fp32
// subnormals are kept, bazel/cuda.bzl):
// - amax: max.NaN of |x| (e4m3_absmax): a NaN anywhere makes amax NaN, an infinity makes it
//   infinite, so one compare of its bits (e4m3_bad) replaces a finiteness test per element; the
//   max of finite values is the CPU's, in any order. bf16 pairs take max.NaN.bf16x2 (exact too).
// - e from amax's bits: amax = 1.m · 2^(E-127) with frexp's f = 1.m / 2 and e2 = E - 126, so
//   f > 0.875 is m > 0x600000 and e = E - 135 + (m > 0x600000) = ((bits + 0x1fffff) >> 23) - 135
//   (the carry out of the mantissa is the +1). A subnormal amax (E = 0) gives at most -134, as
//   frexp's e does: both clamp to -126. For finite amax, E <= 254, so e <= 120: the upper clamp
//   (127) never binds, and 2^e and 2^-e (e in [-126, 120]) are normal floats made from bits.
// - x · 2^-e instead of ldexpf(x, -e): multiplying by a power of two is exact whenever the product
//   is representable, which holds down to 2^-149 (subnormals kept); a product below that rounds,
//   as ldexp's does, and anything below 2^-126 codes to ±0 either way (e4m3's smallest step is
//   2^-9, and half of it rounds to even zero), the sign kept by both.
// - codes two at a time: cvt.rn.satfinite.e4m3x2.f32 is the instruction the one-value conversion
//   (__nv_cvt_float_to_fp8) issues with a zero in the other half, so the rounding (to nearest
//   even, saturating at ±448) is the same; the CPU's encode_e4m3 rounds that way.
// - a tile with a non-finite value: every code 0x7f and the scale NaN, selected per 4 codes.

// max(a, |x|), NaN if either is NaN (PTX max.NaN; fmaxf would drop the NaN).
__device__ __forceinline__ float e4m3_absmax(float a, float x) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(fabsf(x)));
  return r;
}

// The same on two bf16 halves at once (a bf16x2 word, as loaded): max(a, |w|) per half.
__device__ __forceinline__ uint32_t e4m3_absmax2(uint32_t a, uint32_t w) {
  uint32_t r;
  asm("{.reg .b32 t;\n abs.bf16x2 t, %2;\n max.NaN.bf16x2 %0, %1, t;\n}"
      : "=r"(r)
      : "r"(a), "r"(w));
  return r;
}

// The halves of a bf16x2 word as floats (bf16 is the top half of an fp32).
__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

// Whether a tile of amax `amax` (e4m3_absmax over its values) holds a NaN or an infinity.
__device__ __forceinline__ bool e4m3_bad(float amax) {
  return __float_as_uint(amax) >= 0x7f800000u;
}

// scale_exponent() of fp8_cpu.cc: the smallest e with amax / 2^e <= 448, clamped to [-126, 127]
// (at most 120 for a finite amax). REQUIRES: amax >= 0 and finite.
__device__ __forceinline__ int e4m3_scale_exponent(float amax) {
  const uint32_t bits = __float_as_uint(amax);
  if (bits == 0) return 0;
  return max(static_cast<int>((bits + 0x1fffffu) >> 23) - 135, -126);
}

// 2^e from its bits. REQUIRES: e in [-126, 127] (a normal float).
__device__ __forceinline__ float e4m3_pow2(int e) {
  return __uint_as_float(static_cast<uint32_t>(e + 127) << 23);
}

// A tile's scale from its amax: 2^e to store, 2^-e to multiply its values by.
struct E4M3Scale {
  bool bad;   // a non-finite value: the scale is NaN, every code 0x7f
  int e;      // 0 when bad
  float inv;  // 2^-e
  __device__ __forceinline__ explicit E4M3Scale(float amax)
      : bad(e4m3_bad(amax)), e(bad ? 0 : e4m3_scale_exponent(amax)), inv(e4m3_pow2(-e)) {}
  __device__ __forceinline__ float scale() const { return bad ? NAN : e4m3_pow2(e); }
  // Codes of a, b, c, d in bytes 0-3.
  __device__ __forceinline__ uint32_t encode4(float a, float b, float c, float d) const {
    const uint32_t lo =
        __nv_cvt_float2_to_fp8x2(make_float2(a * inv, b * inv), __NV_SATFINITE, __NV_E4M3);
    const uint32_t hi =
        __nv_cvt_float2_to_fp8x2(make_float2(c * inv, d * inv), __NV_SATFINITE, __NV_E4M3);
    return bad ? 0x7f7f7f7fu : lo | hi << 16;
  }
  // Codes of the four bf16 values of two bf16x2 words (a's low half first).
  __device__ __forceinline__ uint32_t encode4(uint32_t a, uint32_t b) const {
    return encode4(bf16_lo(a), bf16_hi(a), bf16_lo(b), bf16_hi(b));
  }
  __device__ __forceinline__ uint2 encode8(const float (&v)[8]) const {
    return make_uint2(encode4(v[0], v[1], v[2], v[3]), encode4(v[4], v[5], v[6], v[7]));
  }
};

// The scale of the 1x128 tile whose 16 parts of 8 values the lanes of this half-warp (lanes
// 0-15 or 16-31) hold, every lane of the half getting it. All 16 lanes call it together; the
// other half may be elsewhere (the shuffles never leave the half). amax is order-free.
__device__ __forceinline__ E4M3Scale half_tile_scale(const float (&v)[8]) {
  const unsigned half = (threadIdx.x & 31) < 16 ? 0x0000ffffu : 0xffff0000u;
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) amax = e4m3_absmax(amax, v[i]);
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) amax = e4m3_absmax(amax, __shfl_xor_sync(half, amax, o));
  return E4M3Scale(amax);
}

// The producers' tile: lane l of a half-warp holds elements [8·(l % 16), 8·(l % 16) + 8) of one
// 1x128 tile, `v` as stored (rounded to the output dtype, which is what fp8_quantize_rows reads
// back). Writes this lane's 8 codes at q (8-byte aligned) and, from the half's first lane, the
// tile's scale at *s: fp8_quantize_rows' codes and scale bit for bit. Called as half_tile_scale.
__device__ __forceinline__ void quantize_tile_part(const float (&v)[8], uint8_t* __restrict__ q,
                                                   float* __restrict__ s) {
  const E4M3Scale t = half_tile_scale(v);
  *reinterpret_cast<uint2*>(q) = t.encode8(v);
  if ((threadIdx.x & 15) == 0) *s = t.scale();
}

// Where a producing kernel writes its output's codes: q[R, K] and the rows-layout scales s
// (s[(k / 128)·R + r], Note [fp8 layouts]) of its R rows of K.
struct RowCodes {
  uint8_t* q;
  float* s;
  int64_t R, K;
  // The tile part of row r, columns [k, k + 8) (k % 8 == 0).
  __device__ __forceinline__ void put(const float (&v)[8], int64_t r, int64_t k) const {
    quantize_tile_part(v, q + r * K + k, s + (k / 128) * R + r);
  }
};

// The 8 bf16 of a bf16x2 uint4 (x's low half first) as floats.
__device__ __forceinline__ void unpack8(const uint4& w, float (&v)[8]) {
  const uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[2 * i] = bf16_lo(u[i]);
    v[2 * i + 1] = bf16_hi(u[i]);
  }
}

// The column (and row) tiles of a 128 (rows) x 128 (columns) tile of a bf16 matrix x[R, K] whose
// values a CTA of 256 threads holds in registers: thread t holds in w[i] the 16-byte chunk t % 16
// (columns c0 + 8·(t % 16) .. + 8) of row r0 + t / 16 + 16i (i < 8), as bf16x2 words. Each
// column's 128 values are one tile of xᵀ, written transposed: qt[K, R], scales st[R / 128, K];
// with kRows each row's 128 values are also one row tile: q[R, K], scales s[K / 128, R] (Note [fp8
// layouts] in fp8.h). fp8_quantize_cols / fp8_quantize_rows_cols' tile (fp8_cuda.cu), and any
// producer that holds its output that way. `tile`: the CTA's shared memory; every thread calls
// this, which synchronizes the CTA once (a second call on the same `tile` needs a __syncthreads
// between). REQUIRES: r0 % 128 == 0, R % 128 == 0, K % 4 == 0 (a column pair is whole or gone);
// with kRows also c0 + 128 <= K.
// - Staging: chunk c of row r sits at c ^ (r / 16 % 8) in shared memory (the swizzle); the 8
//   threads of a quarter-warp store one row's 8 chunks: no bank conflict.
// - Row tiles (kRows): the 16 lanes of a half-warp hold one row, 8 values a lane: half_tile_scale's
//   layout, from registers.
// - Column tiles: a column pair (a bf16x2 word) and 16 rows a thread, two such units a thread; the
//   8 lanes of a pair are adjacent, so a warp reads word w % 4 of chunk w / 4 of rows 16g + i for 4
//   pairs and 8 groups g, which the swizzle spreads over the 32 banks. Each lane then holds 16
//   codes of each of its two columns: one 16-byte store each, 8 lanes filling a 128-byte line.
template <bool kRows>
__device__ __forceinline__ void code_tile_rows_cols(uint4 (&tile)[128][16], const uint4 (&w)[8],
                                                    int64_t r0, int64_t c0, int64_t R, int64_t K,
                                                    uint8_t* __restrict__ q, float* __restrict__ s,
                                                    uint8_t* __restrict__ qt,
                                                    float* __restrict__ st) {
  const int t = threadIdx.x, chunk = t % 16, row0 = t / 16;
#pragma unroll
  for (int i = 0; i < 8; ++i) tile[row0 + 16 * i][chunk ^ i] = w[i];
  if constexpr (kRows) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int64_t r = r0 + row0 + 16 * i;
      float v[8];
      unpack8(w[i], v);
      quantize_tile_part(v, q + r * K + c0 + 8 * chunk, s + (c0 / 128) * R + r);
    }
  }
  __syncthreads();
  const auto* words = reinterpret_cast<const uint32_t*>(tile);  // [128 rows][64 words]
#pragma unroll
  for (int unit = 0; unit < 2; ++unit) {
    const int u = t + 256 * unit;
    const int pair = u / 8, g = u % 8;  // columns 2·pair, 2·pair + 1; rows [16g, 16g + 16)
    const int word = ((pair / 4) ^ g) * 4 + pair % 4;
    uint32_t a[16];
    uint32_t amax = 0;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      a[i] = words[(16 * g + i) * 64 + word];
      amax = e4m3_absmax2(amax, a[i]);
    }
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) amax = e4m3_absmax2(amax, __shfl_xor_sync(~0u, amax, o));
    const int64_t c = c0 + 2 * pair;
    if (c >= K) continue;  // K % 4 == 0: the pair is whole or gone
    const E4M3Scale lo(bf16_lo(amax)), hi(bf16_hi(amax));
    uint32_t even[4], odd[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t* b = a + 4 * j;
      even[j] = lo.encode4(bf16_lo(b[0]), bf16_lo(b[1]), bf16_lo(b[2]), bf16_lo(b[3]));
      odd[j] = hi.encode4(bf16_hi(b[0]), bf16_hi(b[1]), bf16_hi(b[2]), bf16_hi(b[3]));
    }
    uint8_t* dst = qt + c * R + r0 + 16 * g;
    *reinterpret_cast<uint4*>(dst) = make_uint4(even[0], even[1], even[2], even[3]);
    *reinterpret_cast<uint4*>(dst + R) = make_uint4(odd[0], odd[1], odd[2], odd[3]);
    if (g == 0) {
      st[(r0 / 128) * K + c] = lo.scale();
      st[(r0 / 128) * K + c + 1] = hi.scale();
    }
  }
}

}  // namespace gtron::cuda

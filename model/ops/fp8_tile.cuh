// The e4m3 tile arithmetic the CUDA quantizers share (Note [fp8 recipe] in model/ops/fp8.h): a
// tile's scale exponent, a value's code, the scale itself; and the 1x128 row tile as a producing
// kernel holds it, 8 values in each of 16 lanes (Note [fp8 fused producers] in fp8.h).
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "model/cuda/kernel_util.cuh"

namespace gtron::cuda {

// scale_exponent() of fp8_cpu.cc: the smallest e with amax / 2^e <= 448, clamped to [-126, 127].
__device__ __forceinline__ int e4m3_scale_exponent(float amax) {
  if (amax == 0.0f) return 0;
  int e2 = 0;
  const float f = frexpf(amax, &e2);
  const int e = e2 - 9 + (f > 0.875f ? 1 : 0);
  return min(max(e, -126), 127);
}

// Code of x in a tile of scale exponent e (bad: the tile holds a non-finite value, every code
// NaN). Dividing by 2^e is exact; cvt.rn.satfinite rounds like encode_e4m3.
__device__ __forceinline__ uint8_t e4m3_encode(float x, int e, bool bad) {
  if (bad) return 0x7f;
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(ldexpf(x, -e), __NV_SATFINITE, __NV_E4M3));
}

__device__ __forceinline__ float e4m3_scale(int e, bool bad) { return bad ? NAN : ldexpf(1.0f, e); }

// The producers' tile: lane l of a half-warp (lanes 0-15 or 16-31) holds elements
// [8·(l % 16), 8·(l % 16) + 8) of one 1x128 tile, `v` as stored (rounded to the output dtype,
// which is what fp8_quantize_rows reads back). Writes this lane's 8 codes at q (8-byte aligned)
// and, from the half's first lane, the tile's scale at *s: fp8_quantize_rows' codes and scale
// bit for bit (amax and the non-finite test are order-free). All 16 lanes of the half call it
// together; the other half may be elsewhere (the shuffles never leave the half).
__device__ __forceinline__ void quantize_tile_part(const float (&v)[8], uint8_t* __restrict__ q,
                                                   float* __restrict__ s) {
  const int lane = threadIdx.x & 31;
  const unsigned half = lane < 16 ? 0x0000ffffu : 0xffff0000u;
  float amax = 0.0f;
  bool bad = false;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    bad |= !isfinite(v[i]);
    amax = fmaxf(amax, fabsf(v[i]));
  }
  bad = __any_sync(half, bad) != 0;
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(half, amax, o));
  const int e = bad ? 0 : e4m3_scale_exponent(amax);
  uint32_t lo = 0, hi = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    lo |= static_cast<uint32_t>(e4m3_encode(v[i], e, bad)) << (8 * i);
    hi |= static_cast<uint32_t>(e4m3_encode(v[4 + i], e, bad)) << (8 * i);
  }
  *reinterpret_cast<uint2*>(q) = make_uint2(lo, hi);
  if ((lane & 15) == 0) *s = e4m3_scale(e, bad);
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

}  // namespace gtron::cuda

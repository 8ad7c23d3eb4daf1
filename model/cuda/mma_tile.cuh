// Tensor-core tile helpers for hand-written bf16 kernels on sm_80+ (flash attention): PTX
// wrappers for cp.async, ldmatrix and mma.sync m16n8k16, XOR-swizzled shared-memory tiles, and
// the fragment-level products the kernels are built from. Fragment layouts (PTX ISA, m16n8k16):
// A is 16×16 row-major in 4 registers, B 16×8 "column" in 2, the fp32 accumulator 16×8 in 4
// (rows lane/4 and lane/4 + 8, columns 2·(lane%4) + {0, 1}).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "model/cuda/kernel_util.cuh"

namespace gtron::cuda {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared; `valid` false fills zeros (src must still be a mapped address).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem),
               "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Makes this thread's generic-proxy writes to shared memory (st.shared, cp.async after its wait)
// visible to the async proxy (wgmma operand reads); a barrier must follow before the reads.
__device__ __forceinline__ void async_proxy_fence() {
#if __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}

// d[16×8] += a[16×16] · b[16×8], bf16 in, fp32 accumulate.
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// The A fragment for k-slice `kk` of a 16-row accumulator held as n-tiles of 8 columns.
template <int N>
__device__ __forceinline__ void acc_to_a(const float (&acc)[N][4], int kk, uint32_t (&a)[4]) {
  a[0] = pack_bf16(acc[2 * kk][0], acc[2 * kk][1]);
  a[1] = pack_bf16(acc[2 * kk][2], acc[2 * kk][3]);
  a[2] = pack_bf16(acc[2 * kk + 1][0], acc[2 * kk + 1][1]);
  a[3] = pack_bf16(acc[2 * kk + 1][2], acc[2 * kk + 1][3]);
}

// A [rows, HS] bf16 tile in shared memory: row r's 16-byte chunk c sits at chunk c ^ (r % 8), so
// the 8 row addresses of one ldmatrix (same chunk, consecutive rows) hit 8 different bank groups.
template <int HS>
__device__ __forceinline__ int swz(int row, int chunk) {
  return row * HS + ((chunk ^ (row & 7)) << 3);
}

// Lane addresses of ldmatrix.x4 over a 16×16 block at (r0, chunk pair c0) of a swizzled tile:
// "a" order gives an A fragment (rows r0.., then r0+8.., columns c0, c0+1 second);
// "b" order gives the B fragments of two 8-row n-tiles (rows r0.. and r0+8.., k chunks c0, c0+1);
// "a" order under .trans gives the B fragments of two 8-column n-tiles of a [k, n] tile.
template <int HS>
__device__ __forceinline__ const bf16* lds_a(const bf16* t, int r0, int c0, int lane) {
  return t + swz<HS>(r0 + (lane & 7) + ((lane >> 3) & 1) * 8, c0 + (lane >> 4));
}
template <int HS>
__device__ __forceinline__ const bf16* lds_b(const bf16* t, int r0, int c0, int lane) {
  return t + swz<HS>(r0 + (lane & 7) + (lane >> 4) * 8, c0 + ((lane >> 3) & 1));
}

// Rows [row0, row0 + ROWS) of a head's [len, HS] slice (row stride `ld`) into a swizzled tile;
// rows at or past `len` become zeros. Called by all kThreads threads of the block; the caller
// commits the group.
// A thread keeps one 16-byte column chunk and takes every (kThreads / chunks)-th row; when that
// row step is a multiple of 8 the swizzle repeats (row % 8 is the thread's own), so the shared
// and global addresses of its copies are one base each plus a constant stride. Measured on the
// H200: the div/mod and 64-bit address arithmetic per copy of the plain loop were a third of the
// wgmma flash forward's instructions.
template <int HS, int ROWS, int kThreads>
__device__ __forceinline__ void load_tile(bf16* tile, const bf16* g, int64_t ld, int row0,
                                          int len) {
  constexpr int kChunks = HS / 8;
  constexpr int kStep = kThreads / kChunks;  // rows apart of one thread's copies
  if constexpr (kThreads % kChunks == 0 && kStep % 8 == 0 && ROWS % kStep == 0) {
    const int c = static_cast<int>(threadIdx.x % kChunks);
    const int r = static_cast<int>(threadIdx.x / kChunks);
    const uint32_t dst = smem_u32(tile + swz<HS>(r, c));
    const bf16* src = g + static_cast<int64_t>(row0 + r) * ld + c * 8;
    const int64_t src_step = kStep * ld;
#pragma unroll
    for (int k = 0; k < ROWS / kStep; ++k) {
      const bool valid = row0 + r + k * kStep < len;
      const int bytes = valid ? 16 : 0;
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(
                       dst + static_cast<uint32_t>(k * kStep * HS * 2)),
                   "l"(valid ? src + k * src_step : g), "r"(bytes));
    }
  } else {
    for (int i = threadIdx.x; i < ROWS * kChunks; i += kThreads) {
      const int r = i / kChunks, c = i % kChunks;
      const bool valid = row0 + r < len;
      const bf16* src = g + static_cast<int64_t>(valid ? row0 + r : 0) * ld + c * 8;
      cp_async16(tile + swz<HS>(r, c), src, valid);
    }
  }
}

// Max and sum over the 4 lanes of a quad (one accumulator row).
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// acc[m][16 × 8·NT] += A_m[16 × HS] (fragments af[m]) · Bᵀ for MT row tiles m, B a swizzled
// [8·NT rows, HS] tile: each B fragment is read from shared memory once for all MT products.
template <int HS, int NT, int MT>
__device__ __forceinline__ void mma_abt(float (&acc)[MT][NT][4],
                                        const uint32_t (&af)[MT][HS / 16][4], const bf16* b,
                                        int lane) {
#pragma unroll
  for (int kk = 0; kk < HS / 16; ++kk) {
#pragma unroll
    for (int n2 = 0; n2 < NT / 2; ++n2) {
      uint32_t r[4];
      ldsm_x4(r, lds_b<HS>(b, n2 * 16, kk * 2, lane));
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        mma16816(acc[m][2 * n2], af[m][kk], r[0], r[1]);
        mma16816(acc[m][2 * n2 + 1], af[m][kk], r[2], r[3]);
      }
    }
  }
}
template <int HS, int NT>
__device__ __forceinline__ void mma_abt(float (&acc)[NT][4], const uint32_t (&af)[HS / 16][4],
                                        const bf16* b, int lane) {
  mma_abt<HS, NT, 1>(reinterpret_cast<float(&)[1][NT][4]>(acc),
                     reinterpret_cast<const uint32_t(&)[1][HS / 16][4]>(af), b, lane);
}

// acc[m][16 × HS] += P_m[16 × 16·KT] (accumulator fragments p[m]) · V for MT row tiles m, V a
// swizzled [16·KT rows, HS] tile read once for all MT products.
template <int HS, int KT, int MT>
__device__ __forceinline__ void mma_pv(float (&acc)[MT][HS / 8][4], const float (&p)[MT][2 * KT][4],
                                       const bf16* v, int lane) {
#pragma unroll
  for (int kk = 0; kk < KT; ++kk) {
    uint32_t a[MT][4];
#pragma unroll
    for (int m = 0; m < MT; ++m) acc_to_a(p[m], kk, a[m]);
#pragma unroll
    for (int d2 = 0; d2 < HS / 16; ++d2) {
      uint32_t r[4];
      ldsm_x4_t(r, lds_a<HS>(v, kk * 16, d2 * 2, lane));
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        mma16816(acc[m][2 * d2], a[m], r[0], r[1]);
        mma16816(acc[m][2 * d2 + 1], a[m], r[2], r[3]);
      }
    }
  }
}
template <int HS, int KT>
__device__ __forceinline__ void mma_pv(float (&acc)[HS / 8][4], const float (&p)[2 * KT][4],
                                       const bf16* v, int lane) {
  mma_pv<HS, KT, 1>(reinterpret_cast<float(&)[1][HS / 8][4]>(acc),
                    reinterpret_cast<const float(&)[1][2 * KT][4]>(p), v, lane);
}

// A fragments of rows [r0, r0 + 16) of a swizzled tile.
template <int HS>
__device__ __forceinline__ void load_a(uint32_t (&af)[HS / 16][4], const bf16* t, int r0,
                                       int lane) {
#pragma unroll
  for (int kk = 0; kk < HS / 16; ++kk) ldsm_x4(af[kk], lds_a<HS>(t, r0, kk * 2, lane));
}

}  // namespace gtron::cuda

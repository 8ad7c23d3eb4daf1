// Hopper warpgroup MMA (wgmma, sm_90a only) for the hand-written bf16 kernels: shared-memory
// matrix descriptors of the swizzled [rows, 64] tiles of mma_tile.cuh, and m64n64k16 products
// with A from shared memory or from registers. Include only from a file compiled for sm_90a.
//
// Note [wgmma operands]
// A warpgroup is 4 consecutive warps (128 threads). One m64nNk16 instruction multiplies a 64×16
// A by a 16×N B into a 64×N fp32 accumulator spread over the warpgroup: warp w holds rows
// 16w .. 16w + 15, and within a warp the registers are laid out exactly like N/8 mma.sync
// m16n8 accumulators side by side (register 4j + e is element e of n-tile j). A from registers
// takes the m16n8k16 A fragment of each warp's 16 rows. So a kernel written per warp for
// mma.sync keeps its softmax code and its accumulator-to-operand conversion (acc_to_a) as is.
// - Shared-memory operands are described, not loaded: a 64-bit descriptor gives the start
//   address, the 128-byte swizzle mode, and the byte stride between 8-row groups (1024 here).
//   mma_tile.cuh's tiles of 64 bf16 per row are that layout already (chunk c of row r at
//   c ^ (r % 8)) when the tile starts on a 1024-byte boundary.
// - K-major (the reduced index along the 128-byte row): the k-th 16-wide slice starts 32·k bytes
//   in; the hardware applies the swizzle to the address it forms, so the start just moves.
// - MN-major (the reduced index along the rows, "transposed" B, as V in P·V): the same tile with
//   rows = k; a 16-row slice starts 2048·k bytes in, its two 8-row groups 1024 bytes apart.
// - The instructions are asynchronous: fence() before the first product of a batch (registers
//   written by ordinary instructions become visible to them), commit() after the batch, wait<0>()
//   before the results are read. `hold` stops the compiler from moving accumulator reads or writes
//   across those points. Tiles written by cp.async or st.shared need async_proxy_fence() and a
//   barrier before a wgmma reads them.
#pragma once

#include <cstdint>

#include "model/cuda/mma_tile.cuh"

namespace gtron::cuda::wg {

// Descriptor of a 1024-byte aligned, 128-byte swizzled tile at `p` (shared memory).
__device__ __forceinline__ uint64_t desc(const void* p) {
  const uint32_t addr = smem_u32(p);
  uint64_t d = (addr & 0x3FFFFu) >> 4;          // start address, 16-byte units
  d |= static_cast<uint64_t>(1) << 16;          // leading byte offset (unused here)
  d |= static_cast<uint64_t>(1024 >> 4) << 32;  // stride between 8-row groups
  d |= static_cast<uint64_t>(1) << 62;          // 128-byte swizzle
  return d;
}

// The descriptor moved `bytes` (a multiple of 16) further into its tile.
__device__ __forceinline__ uint64_t advance(uint64_t d, uint32_t bytes) { return d + (bytes >> 4); }

__device__ __forceinline__ void fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

template <int NT>
__device__ __forceinline__ void hold(float (&d)[NT][4]) {
#pragma unroll
  for (int j = 0; j < NT; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[j][e])::"memory");
  }
}

// The same for A operands in registers: an in-flight product still reads them, so they must not
// be reused before the wait that retires it.
template <int KT>
__device__ __forceinline__ void hold(uint32_t (&a)[KT][4]) {
#pragma unroll
  for (int k = 0; k < KT; ++k) {
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(a[k][e])::"memory");
  }
}

#define GTRON_WG_D32(d)                                                                         \
  "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),     \
      "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), \
      "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), \
      "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
      "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), \
      "+f"(d[7][2]), "+f"(d[7][3])

#define GTRON_WG_REGS32                                                                    \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, " \
  "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"

// d[64×64] (+)= A[64×16] · B[16×64], A and B from shared memory; TB = 1 for an MN-major B,
// TA = 1 for an MN-major A (a [16 (k), 64 (m)] slice of a [k, 64] tile, as B's). `accumulate`
// false overwrites d.
template <int TB, int TA = 0>
__device__ __forceinline__ void mma_ss(float (&d)[8][4], uint64_t da, uint64_t db,
                                       bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " GTRON_WG_REGS32
      ", %32, %33, p, 1, 1, %36, %35;\n}\n"
      : GTRON_WG_D32(d)
      : "l"(da), "l"(db), "r"(static_cast<int>(accumulate)), "n"(TB), "n"(TA));
}

// d[64×64] (+)= A[64×16] · B[16×64], A from registers (this warp's m16n8k16 A fragment of its
// 16 rows), B from shared memory; TB = 1 for an MN-major B.
template <int TB>
__device__ __forceinline__ void mma_rs(float (&d)[8][4], const uint32_t (&a)[4], uint64_t db,
                                       bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " GTRON_WG_REGS32
      ", {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
      : GTRON_WG_D32(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(static_cast<int>(accumulate)),
        "n"(TB));
}

#undef GTRON_WG_D32
#undef GTRON_WG_REGS32

// d[64×64] (+)= A · Bᵀ over a reduced length of 64, A a [64, 64] tile and B a [64 (n), 64 (k)]
// tile, both K-major in shared memory (scores Q·Kᵀ). Issues the 4 products; the caller fences,
// commits and waits.
__device__ __forceinline__ void abt_ss(float (&d)[8][4], const void* a, const void* b,
                                       bool accumulate) {
  const uint64_t da = desc(a), db = desc(b);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    mma_ss<0>(d, advance(da, 32 * k), advance(db, 32 * k), accumulate || k > 0);
  }
}

// The A operands of a 64-long reduction from this warp's 16 rows of a 64×64 fp32 accumulator,
// rounded to bf16: a[k] is the fragment of columns 16k .. 16k + 15.
template <int NT>
__device__ __forceinline__ void to_a(const float (&p)[NT][4], uint32_t (&a)[NT / 2][4]) {
#pragma unroll
  for (int k = 0; k < NT / 2; ++k) acc_to_a(p, k, a[k]);
}

// d[64×64] += P · V over a reduced length of 64, P given as to_a's operands and V a [64 (k),
// 64 (n)] tile in shared memory (MN-major). Convert every operand before the fence, so no
// register the products read changes between them.
template <int KT>
__device__ __forceinline__ void pv_rs(float (&d)[8][4], const uint32_t (&a)[KT][4], const void* v) {
  const uint64_t dv = desc(v);
#pragma unroll
  for (int k = 0; k < KT; ++k) mma_rs<1>(d, a[k], advance(dv, 2048 * k), true);
}

}  // namespace gtron::cuda::wg

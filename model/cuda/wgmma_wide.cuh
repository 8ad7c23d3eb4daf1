// Warpgroup MMA with 128 output columns (sm_90a only): the wider sibling of wgmma.cuh's m64n64k16
// products, for kernels whose B tiles have 128 rows: bf16 m64n128k16 (a key tile of 128 in the
// FlashAttention-3-structured forward, model/ops/flash_fa3_cuda.cu) and e4m3 m64n128k32 (the
// block-scaled FP8 GEMM, model/ops/fp8_gemm_cuda.cu). Include only from a file compiled for
// sm_90a.
//
// The operands are those of Note [wgmma operands] in wgmma.cuh: a K-major B of 128 rows is the
// same 128-byte swizzled layout with 16 groups of 8 rows (instead of 8), still 1024 bytes apart,
// so wg::desc describes it unchanged. The accumulator is 64 fp32 a thread, laid out as 16
// mma.sync m16n8 accumulators side by side (register 4j + e is element e of n-tile j, j < 16):
// the first 8 n-tiles are what an m64n64 product into keys 0..63 would give, the last 8 keys
// 64..127, so code written for [NT][4] accumulators (softmax, acc_to_a) takes it with NT = 16.
//
// Note [fp8 wgmma operands]
// An e4m3 product reduces over k = 32 one-byte codes, 32 bytes of a K-major row: the same bytes
// as a bf16 product's k = 16. A tile whose rows are 128 codes (one k-block of Note [fp8 recipe],
// loaded by TMA with the 128-byte swizzle, tma::codes_map) is therefore byte for byte the layout
// of a [rows, 64] bf16 tile: wg::desc describes it (8-row groups 1024 bytes apart), and the k-th
// 32-wide slice starts 32·k bytes in (wg::advance), the swizzle applied by the hardware to the
// address it forms. e4m3 operands must be K-major (PTX has no transposed e4m3 form), which both
// operands of A·Bᵀ are. The accumulator is the bf16 products' (register 4j + e is element e of
// the m16n8 accumulator of n-tile j): rows lane/4 (e = 0, 1) and lane/4 + 8 (e = 2, 3) of the
// warp's 16, columns 8j + 2·(lane % 4) + (e & 1).
#pragma once

#include <cstdint>

#include "model/cuda/wgmma.cuh"

namespace gtron::cuda::wg {

#define GTRON_WG_D64(d)                                                                           \
  "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),       \
      "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),   \
      "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),   \
      "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),   \
      "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),   \
      "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),   \
      "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), \
      "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]),             \
      "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),             \
      "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]),             \
      "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]),             \
      "+f"(d[15][2]), "+f"(d[15][3])

#define GTRON_WG_REGS64                                                                        \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "     \
  "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, " \
  "%37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, " \
  "%55, %56, %57, %58, %59, %60, %61, %62, %63}"

// d[64×128] (+)= A[64×16] · B[16×128], A and B from shared memory; TB = 1 for an MN-major B.
// `accumulate` false overwrites d.
template <int TB>
__device__ __forceinline__ void mma_ss_n128(float (&d)[16][4], uint64_t da, uint64_t db,
                                            bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " GTRON_WG_REGS64
      ", %64, %65, p, 1, 1, 0, %67;\n}\n"
      : GTRON_WG_D64(d)
      : "l"(da), "l"(db), "r"(static_cast<int>(accumulate)), "n"(TB));
}

// d[64×128] (+)= A[64×32] · B[32×128] in e4m3 codes with fp32 accumulation, A and B from shared
// memory, both K-major (e4m3 products have no transposed form). `accumulate` false overwrites d.
__device__ __forceinline__ void mma_e4m3_n128(float (&d)[16][4], uint64_t da, uint64_t db,
                                              bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " GTRON_WG_REGS64
      ", %64, %65, p, 1, 1;\n}\n"
      : GTRON_WG_D64(d)
      : "l"(da), "l"(db), "r"(static_cast<int>(accumulate)));
}

#undef GTRON_WG_D64
#undef GTRON_WG_REGS64

// d[64×128] (+)= A · Bᵀ over one k-block of 128 e4m3 codes: A a [64, 128] tile and B a [128 (n),
// 128 (k)] tile, both of 128-byte rows (Note [fp8 wgmma operands]). Issues the 4 products; with
// `accumulate` false the first overwrites d. The caller fences, commits and waits.
__device__ __forceinline__ void abt_e4m3_n128(float (&d)[16][4], const void* a, const void* b,
                                              bool accumulate) {
  const uint64_t da = desc(a), db = desc(b);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    mma_e4m3_n128(d, advance(da, 32 * k), advance(db, 32 * k), accumulate || k > 0);
  }
}

}  // namespace gtron::cuda::wg

// gtron's block-scaled FP8 matrix product on Hopper (sm_90a): the products of Note [fp8 recipe]
// (model/ops/fp8.h) in a hand-written warp-specialized kernel (model/ops/fp8_gemm_cuda.cu, Note
// [fp8 block GEMM]) instead of cuBLASLt's VEC128 / BLK128x128 modes. Its operands are exactly
// those fp8.cc hands cuBLASLt (cuda::gemm with GemmArgs::fp8), so it can stand in for that call.
// tests/model/fp8_gemm_cuda_test.cc checks it against cuBLASLt and an fp64 reference;
// tests/model/bench_fp8_gemm.cc times it beside cuBLASLt ("gtron" mode).
#pragma once

#include <cstdint>

#include "model/dtype.h"

namespace gtron::cuda {

// D[M, N] = Σ_kb (A_q[:, kb] · B_q[:, kb]ᵀ) · sa(kb, m) · sb(kb, n) + beta · C over the k-blocks kb
// of 128 (A_q, B_q the e4m3 codes, sa and sb their fp32 scales: Note [fp8 layouts]).
struct Fp8GemmArgs {
  const uint8_t* a = nullptr;      // A codes [M, K], row-major
  const float* scale_a = nullptr;  // A's rows-layout scales: sa[kb·M + m]
  const uint8_t* b = nullptr;      // B codes [N, K], row-major (the product reads Bᵀ)
  const float* scale_b = nullptr;  // B's scales, in the layout b_blocks says
  // true: blocks layout, sb[(n / 128)·block_scale_ld(K) + kb] (a weight, or its transposed
  // blocks); false: rows layout, sb[kb·N + n] (the weight gradient's xᵀ).
  bool b_blocks = true;
  void* d = nullptr;            // D [M, N], row-major, in d_type
  DType d_type = DType::kBF16;  // bf16 or f32
  // C [M, N] in d_type, read only when beta != 0; null means D itself (accumulate in place). A
  // residual R (fp8.cc's fp8_product): c = R, beta = 1, d the output.
  const void* c = nullptr;
  float beta = 0.0f;
  int64_t m = 0, n = 0, k = 0;
  // Output columns of a CTA's tile: 0 lets the launcher choose (256 where N % 256 == 0, else
  // 128); 128 or 256 asks for that one (tests and the bench compare them). REQUIRES: N % it == 0.
  int block_n = 0;
};

// Whether the current device can run the kernel (compute capability 9.0).
bool fp8_block_gemm_usable();

// Whether fp8_block_gemm takes these sizes: every one a positive multiple of 128 (whole tiles and
// k-blocks; no tails), each below 2^31.
bool fp8_block_gemm_ok(int64_t M, int64_t N, int64_t K);

// Runs the product on `stream` (a cudaStream_t) of the current device. Deterministic: a fixed
// summation order per element, no atomics, so reruns are bit-identical; the k-blocks are summed
// in order, each a product of four k = 32 tensor-core steps promoted to fp32 with its two scales
// (Note [fp8 accumulation on Hopper] in tests/model/fp8_cuda_test.cc). No bias: the caller adds
// it. REQUIRES: fp8_block_gemm_usable(); fp8_block_gemm_ok(m, n, k); a, b, scale_a, scale_b, c
// and d 16-byte aligned; d_type bf16 or f32; every operand on the current device.
void fp8_block_gemm(const Fp8GemmArgs& args, void* stream);

}  // namespace gtron::cuda

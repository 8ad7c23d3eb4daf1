// Tensor maps for the TMA loads of model/cuda/tma.cuh, made on the host: cuTensorMapEncodeTiled,
// reached through the runtime's driver entry point (cudaGetDriverEntryPointByVersion), so nothing
// links libcuda. The maps go to sm_90a kernels as __grid_constant__ parameters.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace gtron::cuda::tma {

// The bf16 map of one head-strided operand (q, k, v, o or dO rows): dimensions (innermost first)
// HS columns, `heads` heads HS apart, T rows `ld` apart, B batches `batch` apart (elements); the
// box one 64-column panel of `rows` rows of one head, 128-byte swizzled (the operand layout of
// Note [wgmma operands] in model/cuda/wgmma.cuh). Rows past T are outside and land as zeros.
// REQUIRES: base 16-byte aligned, ld and batch multiples of 8, rows <= 256.
CUtensorMap head_map(const void* base, int HS, int heads, int T, int B, int64_t ld, int64_t batch,
                     int rows);

// The map of an FP8 operand's codes (one byte each), a row-major [rows, cols] matrix: the box is
// 128 columns (one 128-byte swizzled row: a whole k-block of Note [fp8 recipe]) by `box_rows`
// rows, the K-major operand layout of Note [wgmma operands] (model/cuda/wgmma.cuh) for e4m3
// products (model/cuda/wgmma_wide.cuh). Coordinates are (column, row).
// REQUIRES: base 16-byte aligned, cols a multiple of 16, 0 < box_rows <= 256.
CUtensorMap codes_map(const void* base, int64_t rows, int64_t cols, int box_rows);

}  // namespace gtron::cuda::tma

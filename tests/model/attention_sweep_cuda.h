// Device helpers of the attention sweep (tests/model/bench_attention.cc): random inputs drawn on
// the GPU, the bf16 -> fp32 copies the fp32 reference reads, and the check's reductions. Every
// function takes a cudaStream_t as `stream`; the ones returning host values synchronize it.
#pragma once

#include <cstdint>

#include "model/dtype.h"

namespace gtron::bench {

// x[i] = bf16(stddev · z(seed, i)) for i < n, z a standard normal drawn from (seed, i) alone
// (a splitmix64 hash of the pair, two uniforms, Box–Muller): fresh inputs for every check without
// a host pass over hundreds of megabytes.
void fill_normal_bf16(void* x, int64_t n, uint64_t seed, float stddev, void* stream);

// y[i] = float(x[i]) for the n bf16 values x (exact).
void bf16_to_f32(const void* x, float* y, int64_t n, void* stream);

// Σ (got − ref)² and Σ ref² over the columns [c0, c1) of `rows` rows, in double: got (`got_dt`,
// f32 or bf16) with row stride got_ld, ref (f32) with row stride ref_ld. A NaN anywhere (an
// element left unwritten over the poison) makes them NaN. Fixed order: per-block partials summed
// on the host.
struct ErrSums {
  double diff2 = 0.0;
  double ref2 = 0.0;
};
ErrSums err_sums(const void* got, DType got_dt, int64_t got_ld, const float* ref, int64_t ref_ld,
                 int64_t rows, int64_t c0, int64_t c1, void* stream);

// out[t·W + c] = Σ float(x[r·W + c]) over the rows r of tile t (64 rows; the last tile may be
// shorter), in row order: the column partials the flash backward writes (Note [qkv bias
// partials]), recomputed from the bf16 rows x [rows, W] it stored.
void tile_column_sums(const void* x, int64_t rows, int64_t W, float* out, void* stream);

// How many of the `bytes` / 2 16-bit words of a and b differ. REQUIRES: bytes even.
int64_t count_differences(const void* a, const void* b, int64_t bytes, void* stream);

}  // namespace gtron::bench

// CUDA kernels of the decoder (model/decoder.h) that read a window's extents on the device, so
// that one captured graph serves every window of its width: the MTP hidden stores' row copies,
// the gather of each row's last real slot, and the greedy argmax of logit rows. No CUDA headers.
#pragma once

#include <cstdint>

#include "model/dtype.h"

namespace gtron::cuda {

// x [B, W, C] and store [B, cap, C] in `act`; start_count: i32 [2B] on the device (Note [decode
// windows] in model/kv_cache.h). save: slot i < count[b] of row b -> store row start[b] + i.
// load: the reverse, with zeros in the padding slots. REQUIRES: start[b] + count[b] <= cap.
void save_store_rows(const void* x, void* store, const int32_t* start_count, int64_t B, int64_t W,
                     int64_t cap, int64_t C, DType act, void* stream);
void load_store_rows(const void* store, void* x, const int32_t* start_count, int64_t B, int64_t W,
                     int64_t cap, int64_t C, DType act, void* stream);

// y [B, C] = x [B, W, C] at slot max(count[b] - 1, 0) of each row.
void gather_last_slots(const void* x, void* y, const int32_t* start_count, int64_t B, int64_t W,
                       int64_t C, DType act, void* stream);

// ids[r] = the first index of the largest of logits[r, 0..V) (rows of leading dimension ld), as
// std::max_element picks it (model/sampling.h argmax).
void argmax_rows(const void* logits, int32_t* ids, int64_t N, int64_t V, int64_t ld, DType act,
                 void* stream);

}  // namespace gtron::cuda

namespace gtron::cuda {

// Small-row linear for decoding steps (Note [decode fast block] in model/decode_ops.h), f32:
// y [M, N] = LN(x) [M, K] · wᵀ (w [N, K]) (+ bias [N]), then GELU-tanh when `gelu`, then
// (+ res [M, N]), where LN is the LayerNorm of gamma/beta when ln_gamma is set (the row
// statistics and the normalized values computed as model/ops/norm_cuda.cu does) and the identity
// otherwise. One warp per output column loads its whole weight row into registers first, then
// the block stages (and normalizes) x in shared memory, and each lane sums fixed k's for all M
// rows; the warp sums by xor butterfly: bit-identical reruns, and a row's result does not depend
// on M.
struct SmallLinearArgs {
  const float* x = nullptr;  // [M, K], 16-byte aligned
  const float* w = nullptr;  // [N, K], 16-byte aligned
  const float* bias = nullptr;
  const float* res = nullptr;
  float* y = nullptr;
  const float* ln_gamma = nullptr;  // [K] (with ln_beta) or null
  const float* ln_beta = nullptr;
  float ln_eps = 1e-5f;
  int64_t M = 0, K = 0, N = 0;
  bool gelu = false;
};
bool small_linear_supported(int64_t M, int64_t K);
// REQUIRES: small_linear_supported(M, K), x and w 16-byte aligned.
void small_linear(const SmallLinearArgs& a, void* stream);

}  // namespace gtron::cuda

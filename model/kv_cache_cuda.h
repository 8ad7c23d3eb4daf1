// The CUDA twin of cpu::cached_attention_forward (model/kv_cache.h); no CUDA headers here.
#pragma once

#include <cstdint>

#include "model/dtype.h"

namespace gtron::cuda {

// qkv [B, W, 3C] and out [B, W, C] in `act` (f32 or bf16); kc, vc [B, NH, Tc, HS] in `act`;
// start_count: i32 [2B] on the device, start[b] then count[b] (Note [decode windows]). Writes the
// real slots' keys and values into the caches, then each slot's attention over its prefix, all on
// `stream`. fp32 scores and softmax; one block per (row, head, slot), fixed-order reductions.
// REQUIRES: start[b] + count[b] <= Tc, (Tc + HS + 32) floats of shared memory fit in 48 KiB.
void cached_attention_forward(const void* qkv, void* kc, void* vc, void* out,
                              const int32_t* start_count, int64_t B, int64_t W, int64_t Tc,
                              int64_t NH, int64_t HS, DType act, void* stream);

}  // namespace gtron::cuda

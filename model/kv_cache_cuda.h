// The CUDA twin of cpu::cached_attention_forward (model/kv_cache.h); no CUDA headers here.
#pragma once

#include <cstdint>

#include "model/dtype.h"

namespace gtron::cuda {

// Floats of scratch cached_attention_forward needs: one partial result per (row, head, slot, key
// split) (Note [split-key decode attention] in model/kv_cache_cuda.cu).
int64_t cached_attention_scratch_floats(int64_t B, int64_t W, int64_t Tc, int64_t NH, int64_t HS);

// qkv [B, W, (NH + 2·NKV)·HS] and out [B, W, NH·HS] in `act` (f32 or bf16); kc, vc [B, NKV, Tc,
// HS] in `act` (query head h reads key/value head h / (NH / NKV); GPT-2: NKV = NH);
// start_count: i32 [2B] on the device, start[b] then count[b] (Note [decode windows]); scratch:
// cached_attention_scratch_floats(...) floats on the device. Writes the real slots' keys and
// values into the caches, then each slot's attention over its prefix, all on `stream`, reading
// the window's extents only on the device (so a captured graph replays it for any window of the
// same width). fp32 scores and softmax, fixed-order reductions (bit-identical reruns).
// REQUIRES: start[b] + count[b] <= Tc.
void cached_attention_forward(const void* qkv, void* kc, void* vc, void* out,
                              const int32_t* start_count, float* scratch, int64_t B, int64_t W,
                              int64_t Tc, int64_t NH, int64_t NKV, int64_t HS, DType act,
                              void* stream);

}  // namespace gtron::cuda

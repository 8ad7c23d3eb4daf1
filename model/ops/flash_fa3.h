// A flash-attention forward with FlashAttention-3's structure (model/ops/flash_fa3_cuda.cu, built
// for sm_90a; Note [FlashAttention-3 forward] there): a TMA producer warp and two consumer
// warpgroups of 64 query rows each, key tiles of 128, softmax and products ping-ponged between
// the consumers. Issue 49. Not routed from flash_attention_forward yet: the attention sweep's
// "fa3" variant (tests/model/bench_attention.cc) and flash_fa3_cuda_test call it directly.
#pragma once

#include <cstdint>

#include "model/ops/attention.h"

namespace gtron::cuda {

// True for HS = 64 or 128 on a compute-capability 9.0 device.
bool flash_fa3_usable(int64_t HS);

// flash_attention_forward's contract (model/ops/attention.h) for bf16, causal, self-attention:
// o rows [B, T] (NH heads) and lse [B, NH, T] (natural log) from q rows [B, T] (NH heads) and k, v
// rows [B, T] (NKV heads; query head h reads k/v head h / (NH / NKV)); row and batch strides as
// FlashForwardArgs gives them. Deterministic (no atomics), no O(T²) memory.
// REQUIRES: flash_fa3_usable(a.HS); a.Tq == a.Tk; a.seg null (no document masking yet); the
// alignment flash_attention_forward asks (strides multiples of 8 elements, 16-byte pointers).
void flash_fa3_forward(const FlashForwardArgs& a, void* stream);

}  // namespace gtron::cuda

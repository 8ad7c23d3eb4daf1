// Flash attention with Hopper's warpgroup MMA (model/ops/flash_wgmma_cuda.cu, built for sm_90a):
// the same algorithm, tiles and results contract as the mma.sync kernels of
// flash_attention_cuda.cu, for head sizes 64 and 128. flash_attention_forward/backward take it
// by themselves when flash_wgmma_usable().
#pragma once

#include <cstdint>

#include "model/ops/attention.h"

namespace gtron::cuda {

// True for HS = 64 or 128 on a compute-capability 9.0 device (elsewhere the mma.sync kernels
// run).
bool flash_wgmma_usable(int64_t HS);

// The forward kernel (contract of flash_attention_forward, arguments already checked).
void flash_wgmma_forward(const FlashForwardArgs& a, void* stream);

// The query kernel (which forms Δ = rowsum(dO ⊙ O) into `delta`, B·NH·T floats) and then the key
// kernel of the backward.
void flash_wgmma_backward(const FlashBackwardArgs& a, float* delta, void* stream);

// The query kernel alone (dQ, and Δ into `delta`): the first half of flash_wgmma_backward, for a
// backward whose dK and dV come from another kernel (flash_fa3_backward, model/ops/flash_fa3.h).
void flash_wgmma_backward_query(const FlashBackwardArgs& a, float* delta, void* stream);

}  // namespace gtron::cuda

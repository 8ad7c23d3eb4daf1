// Flash attention with FlashAttention-3's structure (built for sm_90a; issue 49). The forward
// (model/ops/flash_fa3_cuda.cu, Note [FlashAttention-3 forward]): a TMA producer warp and two
// consumer warpgroups of 64 query rows each, key tiles of 128, softmax and products ping-ponged
// between the consumers. The backward (model/ops/flash_fa3_bwd_cuda.cu, Note [FlashAttention-3
// backward]): the wgmma query kernel for dQ and Δ, then a key kernel of the same structure, 128
// keys a CTA with K and V resident and Q, dO, lse and Δ streamed by TMA.
// flash_attention_forward/backward route here under cuda::set_hopper_flash(HopperFlash::kFa3)
// (model/ops/attention.h; the forward with Fa3Schedule::kPersistentPairs); the attention sweep's
// "fa3", "fa3p" and "fa3pairs" variants (tests/model/bench_attention.cc), flash_fa3_cuda_test and
// flash_fa3_bwd_cuda_test call them directly.
#pragma once

#include <cstdint>

#include "model/ops/attention.h"

namespace gtron::cuda {

// True for HS = 64 or 128 on a compute-capability 9.0 device.
bool flash_fa3_usable(int64_t HS);

// How the forward's CTAs take their work tiles (128 query rows of one (b, h); Note [persistent FA3
// forward] in model/ops/flash_fa3_cuda.cu). The result is the same, bit for bit, under each.
enum class Fa3Schedule {
  // One CTA a tile, the longest tiles of every head first.
  kTiles,
  // min(SMs, tiles) CTAs walking that order with a static stride.
  kPersistent,
  // min(SMs, pairs) CTAs walking pairs of query tiles (qb, last − qb) of one (b, h), heads in
  // order: balanced, and a head's k and v stay in L2 while its query tiles read them (what
  // flash_attention_forward runs under kFa3).
  kPersistentPairs,
};

// flash_attention_forward's contract (model/ops/attention.h) for bf16, causal, self-attention:
// o rows [B, T] (NH heads) and lse [B, NH, T] (natural log) from q rows [B, T] (NH heads) and k, v
// rows [B, T] (NKV heads; query head h reads k/v head h / (NH / NKV)); row and batch strides as
// FlashForwardArgs gives them. Deterministic (no atomics), no O(T²) memory.
// a.seg (document masking, Note [document masking in the FA3 forward]) is honoured.
// REQUIRES: flash_fa3_usable(a.HS); a.Tq == a.Tk; a.seg null or a.seg_batch >= T; the alignment
// flash_attention_forward asks (strides multiples of 8 elements, 16-byte pointers).
// `schedule` picks the grid; `max_ctas` (persistent schedules only; 0: the SM count) caps it, so
// that tests make every CTA walk many tiles at small shapes.
// REQUIRES: max_ctas >= 0, and 0 under kTiles.
void flash_fa3_forward(const FlashForwardArgs& a, void* stream,
                       Fa3Schedule schedule = Fa3Schedule::kTiles, int max_ctas = 0);

// flash_attention_backward's contract (model/ops/attention.h) for bf16, causal self-attention, with
// flash_wgmma_backward's arguments: dqkv (packed rows [B, T, (NH + 2·NKV)·HS]) gets dQ, dK and dV
// (added, or written when !a.accumulate) from qkv, o, dout and the forward's lse; `delta`
// (B·NH·T floats, flash_attention_backward_scratch_floats) receives Δ = rowsum(dO ⊙ O) on the way.
// a.rope_inv_freq is honoured. Deterministic (no atomics; a shared k/v head's gradient is summed
// over its query heads in head order), no O(T²) memory.
// a.seg (document masking, Note [document masking in the FA3 backward]) and a.col_partial
// (Note [qkv bias partials]) are honoured.
// REQUIRES: flash_fa3_usable(a.HS); a.seg null or a.seg_batch >= a.T; strides multiples of 8
// elements; qkv, dqkv, o and dout 16-byte aligned.
void flash_fa3_backward(const FlashBackwardArgs& a, float* delta, void* stream);

// flash_fa3_backward's contract with dQ from the key kernel instead of the query kernel: 5
// products a visible (query, key) pair instead of 7, dQ summed over key blocks in a fixed order
// (deterministic; Note [ordered dQ in the FA3 backward] in model/ops/flash_fa3_dq_cuda.cu).
// `scratch`: flash_fa3_backward_dq_scratch_bytes(a) bytes on the device, 16-byte aligned (the fp32
// dQ sums and the turn counters). Not built yet for document masking or column partials.
// REQUIRES: flash_fa3_backward's, and a.seg == nullptr, a.col_partial == nullptr.
int64_t flash_fa3_backward_dq_scratch_bytes(const FlashBackwardArgs& a);
void flash_fa3_backward_dq(const FlashBackwardArgs& a, float* delta, void* scratch, void* stream);

// Building blocks of the two (flash_fa3_bwd_cuda.cu): the checked arguments (NKV filled in), and
// the key kernel with dQ's ordered sums [B, NH, T, HS] (fp32), `turns` zeroed ints
// [B, NH, ceil(T / (8192 / HS)), 2].
FlashBackwardArgs fa3_backward_checked(const FlashBackwardArgs& a, const float* delta);
void fa3_backward_keys_ordered_dq(const FlashBackwardArgs& a, const float* delta, float* dq_sums,
                                  int* turns, void* stream);

}  // namespace gtron::cuda

// CUDA kernels of the optimizer step (launchers only; no CUDA headers): the global gradient norm
// with its clipping factor, and AdamW, over a table of chunks of the owned segments; plus the
// loss sums the training loop keeps on the device.
//
// Policy: segments are cut into chunks of at most kOptimChunk elements, one thread block per
// chunk, so one launch covers every parameter. The norm is deterministic: each chunk's Σ g² is
// summed in a fixed order (per-thread strided sums, then a fixed tree) in double, and the chunk
// partials are combined by one block in a fixed order (across ranks: the partials are summed per
// group of chunks, one thread a group, each group sum is all-reduced, and the group sums are
// combined by that block). The clip factor is computed on the device and AdamW reads it from
// device memory: no host round trip between the two.
//
// Note [fused shadow refresh]
// A chunk may carry w_bf16, the bf16 shadow (model/mixed_precision.h) of the elements it updates:
// AdamW then stores bf16(w_new) there in the same pass (round to nearest even, the rounding of
// cast_f32_to_bf16, so the shadow holds the bits a re-cast would give) and no cast kernel runs for
// that parameter at its next use. The host sets it only where the chunks of one parameter cover
// the whole tensor its shadow mirrors (see AdamW::set_bf16_shadows). The update moves 16 bytes per
// operand (float4 w, g, m, v; 8 bytes of shadow) when a chunk's pointers allow, else one element a
// thread; both run the same per-element formula, so the bits do not depend on the path. A chunk
// of a packed master (w_lo set) reads and writes 8 bytes of shadow and 8 of low halves instead of
// the float4 w and the shadow, and its shadow rounds as model/packed_master.h says.
#pragma once

#include <cstdint>

namespace gtron::cuda {

constexpr int64_t kOptimChunk = 16384;

// Elements [0, n) of one owned segment, all device pointers.
struct OptimChunk {
  float* w = nullptr;          // parameter values (fp32 master)
  const float* g = nullptr;    // reduced gradient
  float* m = nullptr;          // AdamW first moment
  float* v = nullptr;          // AdamW second moment
  uint16_t* w_bf16 = nullptr;  // bf16 shadow of w[0, n), or null (Note [fused shadow refresh])
  // Note [packed masters] (model/mixed_precision.h): the low halves of w[0, n), or null. When set,
  // w is null and the fp32 values are (w_bf16, w_lo) (model/packed_master.h), both rewritten.
  uint16_t* w_lo = nullptr;
  int32_t n = 0;      // 1 <= n <= kOptimChunk
  int32_t decay = 0;  // 1: weight decay applies to this segment
};

// partials[i] = Σ g² over chunk i (double). REQUIRES: `chunks` (device) holds num_chunks entries.
void grad_sumsq_partials(const OptimChunk* chunks, int64_t num_chunks, double* partials,
                         void* stream);
// norm_out[0] = sqrt(Σ partials) (f32); scale_out[0] = clip / (norm + 1e-6) when clip > 0 and
// norm > clip, else 1 — the same rule as clip_scale() in trainer/optimizer.h (a NaN norm gives 1).
void grad_norm_finalize(const double* partials, int64_t num_partials, double clip, float* norm_out,
                        float* scale_out, void* stream);

// out[j] = Σ partials[offsets[j], offsets[j + 1]) for j < k, each in index order (one thread per
// group: a fixed order). For the norm across ranks: each group's sum is all-reduced over its
// communicators before grad_norm_finalize. REQUIRES: `offsets` (device) holds k + 1
// non-decreasing entries within `partials`; `out` (device) holds k.
void sum_partial_groups(const double* partials, const int32_t* offsets, int64_t k, double* out,
                        void* stream);

// Per-step constants of the update (computed on the host in double, rounded to float as the CPU
// path does).
struct AdamWConstants {
  float lr = 0, b1 = 0, b2 = 0, eps = 0;
  float c1 = 0, c2 = 0;  // 1/(1−β1^t), 1/(1−β2^t)
  float wd = 0;          // decay of chunks with decay = 1
};
// For every element, with gi = g · scale[0] (read on the device):
//   m = β1·m + (1−β1)·gi;  v = β2·v + (1−β2)·gi²;  w −= lr·((m·c1)/(sqrt(v·c2) + ε) + wd·w)
// — the formula of adamw_update() on the CPU — and w_bf16 = bf16(w) where a chunk has a shadow.
void adamw_chunks(const OptimChunk* chunks, int64_t num_chunks, const AdamWConstants& k,
                  const float* scale, void* stream);

// Note [fp8 codes from the update]
// An FP8 linear's weight gets its codes from the fp32 master once a step (Note [fp8 weights once
// a step] in model/ops/fp8.h): a pass that reads the master (4 bytes a parameter) right after
// AdamW wrote it. adamw_blocks updates such a weight by 128x128 blocks instead of by chunks, a
// CTA a block, and codes the new values where they are (code_block of model/ops/fp8_blocks.cuh,
// the quantizer's own function): the same master, moments and codes bit for bit, without the
// second read of the master or the quantizer's launches. The gradient norm still runs over the
// chunks (its sums, and so the clip factor, keep their order); adamw_chunks gets a table without
// the chunks of the weights adamw_blocks updates.
struct OptimBlocks {  // one weight w[N, K], updated whole
  float* w = nullptr;
  const float* g = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  int64_t N = 0, K = 0;
  uint8_t* q = nullptr;     // codes [N, K] (fp8::QuantizedWeight's q, s, qt, st)
  float* s = nullptr;       // blocks-layout scales of [N, K]
  uint8_t* qt = nullptr;    // codes [K, N]
  float* st = nullptr;      // blocks-layout scales of [K, N]
  int64_t first_block = 0;  // its first block in the launch; its blocks go row by row
  int32_t decay = 0;
  int32_t qt_vec = 0;  // N % 8 == 0 and qt 8-byte aligned
};
// Whether adamw_blocks takes a weight's layout: K % 4 == 0; w, g, m, v 16-byte aligned; and with
// its codes: q, s, qt, st set, q 4-byte aligned.
bool adamw_blocks_layout_ok(const OptimBlocks& b);
bool adamw_blocks_ok(const OptimBlocks& b);
// The number of 128x128 blocks of w[N, K].
int64_t adamw_blocks_of(int64_t N, int64_t K);
// adamw_chunks' update of every element of each weight, then its codes and scales (those
// fp8_quantize_blocks gives for the new values). REQUIRES: `weights` (device) holds num_weights
// entries in first_block order, the first at 0, num_blocks blocks in all; each adamw_blocks_ok.
void adamw_blocks(const OptimBlocks* weights, int64_t num_weights, int64_t num_blocks,
                  const AdamWConstants& k, const float* scale, void* stream);

// dst[i] += factor · src[i][0] for i < n: the training loop's per-step loss sums (f32 scalars on
// the device), so no micro-batch reads a loss back to the host.
constexpr int kMaxScalars = 16;
struct ScalarList {
  const float* src[kMaxScalars] = {};
  int n = 0;
};
void accumulate_scalars(const ScalarList& list, float factor, float* dst, void* stream);

}  // namespace gtron::cuda

// Document segments of packed training rows (config data.document_masking).
//
// Note [document masking]
// Prepared text packs documents one after the other, each opened by the same token (GPT-2 and
// Qwen: the <|endoftext|> that precedes every document; Llama 3: <|begin_of_text|>), and a
// training row is a window cut anywhere in that stream. With document masking a token attends
// only to the earlier tokens of its own document:
// - seg[b, t] = the number of document starts at positions 1..t of row b (position 0 opens
//   segment 0 whatever token it holds), so a row's segments are non-decreasing and each is one
//   contiguous run of positions;
// - query t sees key s only when s <= t and seg[b, s] == seg[b, t] (model/ops/attention.h);
//   since segments are runs, that is the key range [start of t's segment, t], and no row is
//   ever empty (t sees itself);
// - pos[b, t] = t − (the first position of t's segment): GPT-2's learned positions restart at
//   each document, so that with the mask a document in a packed row computes exactly what it
//   computes alone in a row of its own (the llama family's RoPE scores depend only on the
//   distance s − t, which the mask leaves unchanged).
// The MTP depth k reads the tokens shifted by k (model/gpt.h): its segments are computed the same
// way from the tokens it embeds. Generation (gtron sample) runs one document and masks nothing.
#pragma once

#include <cstdint>

#include "model/tensor.h"

namespace gtron {

// Writes seg (and, when `pos` is not null, pos) [B, T] i32 of tokens i32 [B, T] (Note [document
// masking]): a position t >= 1 whose token equals `start_id` opens a new segment. The outputs are
// caller-owned buffers on the model's device (fixed addresses for captured graphs); the tokens are
// on that device or the CPU (a CUDA model's evaluation and sampling windows: copied to the device
// first, as embedding() does). The work runs on the outputs' device's current stream (recorded
// into a CPU capture like every CPU kernel), with no host sync for device tokens.
void document_segments(const Tensor& tokens, int32_t start_id, Tensor& seg, Tensor* pos);

namespace cpu {
// Rows of T tokens: seg and (when not null) pos as above.
void document_segments(const int32_t* tokens, int32_t start_id, int32_t* seg, int32_t* pos,
                       int64_t B, int64_t T);
}  // namespace cpu

namespace cuda {
// The device twin of cpu::document_segments: one block per row, on `stream` (a cudaStream_t).
void document_segments(const int32_t* tokens, int32_t start_id, int32_t* seg, int32_t* pos,
                       int64_t B, int64_t T, void* stream);
}  // namespace cuda

}  // namespace gtron

// Causal multi-head self-attention on a packed qkv projection: GPT-2's layout, and grouped-query
// attention (Llama 3, Qwen3) with fewer k/v heads than query heads.
#pragma once

#include <cstdint>

#include "model/autograd.h"

namespace gtron {

// qkv: [B, T, 3C] holding [q | k | v], each C = NH·HS wide, head h in columns [h·HS, (h+1)·HS) of
// its part. Returns [B, T, C] with head h's output in columns [h·HS, (h+1)·HS):
//   out_h[t] = Σ_{s<=t} softmax_s(q_h[t]·k_h[s] / sqrt(HS)) · v_h[s].
// Backward accumulates into dqkv. Softmax statistics in the tensor's float type (fp32 on GPU).
// `segments` (optional, every entry point below): i32 [B, T] on qkv's device, non-decreasing
// along each row; query t then sees key s only when s <= t and segments[b, s] == segments[b, t]
// (Note [document masking] in model/ops/segments.h). Kept alive for the backward.
Var causal_attention(const Var& qkv, int NH, const Tensor& segments = Tensor());

// Grouped-query attention (GQA; NKV = 1 is multi-query attention). qkv: [B, T, (NH + 2·NKV)·HS]
// holding NH q heads, then NKV k heads, then NKV v heads, head j of a part in columns
// [j·HS, (j+1)·HS) of the part. Query head h attends with k/v head h / (NH / NKV): consecutive
// query heads share a k/v head, read in place (never copied per query head). Returns
// [B, T, NH·HS] as causal_attention, scale 1/sqrt(HS); backward accumulates into dqkv, the
// gradient of a shared k/v head summed over its query heads in a fixed order (deterministic).
// On CUDA in bf16 at HS = 64 or 128 it runs the flash kernels (any NKV), else the reference
// kernels below; NKV = NH is causal_attention(qkv, NH)'s computation.
// REQUIRES: NH, NKV > 0, NH % NKV == 0, HS even (as RoPE needs).
Var causal_attention_gqa(const Var& qkv, int NH, int NKV, int HS,
                         const Tensor& segments = Tensor());

// causal_attention_gqa(rope(qkv, inv_freq, NH, NKV, HS, pos0), NH, NKV, HS) (model/ops/rope.h),
// as one op. On the flash path q and k are rotated in place in qkv's value, which the kernels
// then read, and the backward writes the gradient of the un-rotated q and k straight from the
// attention kernels (Note [RoPE in the flash backward]): no second [B, T, W] tensor is kept and
// no rotated gradient is stored and rotated back by a separate pass. Elsewhere it is the two ops
// composed, and qkv's value is left as it is.
// REQUIRES: nothing else reads qkv's value after this op (the llama block's q|k|v projection or
// q/k-norm output, whose own backwards read their inputs, not it).
// `rotated`: q and k arrive rotated already (qk_rmsnorm's fused RoPE, Note [RoPE in the q/k
// norm] in model/ops/qk_norm.h); the same backward. REQUIRES then the flash path
// (rope_rotated_input_supported).
Var causal_attention_gqa_rope(const Var& qkv, const Tensor& inv_freq, int NH, int NKV, int HS,
                              int64_t pos0, bool rotated = false,
                              const Tensor& segments = Tensor());
// Whether causal_attention_gqa_rope takes pre-rotated q and k for qkv: [B, T, ...] on CUDA where
// the flash kernels run.
bool rope_rotated_input_supported(const Var& qkv, int HS);

namespace cpu {
// qkv: [B, Tlen, 3·NH·HS], out: [B, Tlen, NH·HS]. Also writes lse: [B, NH, Tlen], the log-sum-exp
// of each scaled score row, from which the backward recomputes the probabilities (memory O(T),
// not O(T²), per head). `seg` (optional): [B, Tlen] segment ids, non-decreasing along each row
// (aborts otherwise): query t sees key s only when seg[b, s] == seg[b, t] too.
template <typename T>
void attention_forward(const T* qkv, T* out, T* lse, int64_t B, int64_t Tlen, int64_t NH,
                       int64_t HS, const int32_t* seg = nullptr);
// Accumulates dqkv += d(out·dout)/dqkv.
template <typename T>
void attention_backward(const T* qkv, const T* lse, const T* dout, T* dqkv, int64_t B, int64_t Tlen,
                        int64_t NH, int64_t HS, const int32_t* seg = nullptr);
// The grouped-query kernels: qkv [B, Tlen, (NH + 2·NKV)·HS], out [B, Tlen, NH·HS], lse
// [B, NH, Tlen]. With NKV = NH they are the kernels above (which call them).
// REQUIRES: NH % NKV == 0.
template <typename T>
void attention_gqa_forward(const T* qkv, T* out, T* lse, int64_t B, int64_t Tlen, int64_t NH,
                           int64_t NKV, int64_t HS, const int32_t* seg = nullptr);
template <typename T>
void attention_gqa_backward(const T* qkv, const T* lse, const T* dout, T* dqkv, int64_t B,
                            int64_t Tlen, int64_t NH, int64_t NKV, int64_t HS,
                            const int32_t* seg = nullptr);
}  // namespace cpu

namespace cuda {
// Same contract as the CPU kernels: qkv [B, Tlen, 3·NH·HS] and out [B, Tlen, NH·HS] in `act`
// (f32 or bf16); lse [B, NH, Tlen] in f32. The forward keeps only lse; the backward recomputes
// the probabilities from it. Scores, log-sum-exps and softmax math are fp32; with bf16, the
// probabilities and dS enter their GEMMs rounded to bf16. `scratch` holds
// attention_{forward,backward}_scratch_bytes(...) bytes (O(B·NH·Tlen²): see attention_cuda.cu).
int64_t attention_forward_scratch_bytes(int64_t B, int64_t Tlen, int64_t NH, int64_t HS, DType act);
int64_t attention_backward_scratch_bytes(int64_t B, int64_t Tlen, int64_t NH, int64_t HS,
                                         DType act);
void attention_forward(const void* qkv, void* out, float* lse, void* scratch, int64_t B,
                       int64_t Tlen, int64_t NH, int64_t HS, DType act, void* stream);
// Accumulates dqkv (act) += d(out·dout)/dqkv.
void attention_backward(const void* qkv, const float* lse, const void* dout, void* dqkv,
                        void* scratch, int64_t B, int64_t Tlen, int64_t NH, int64_t HS, DType act,
                        void* stream);
// The grouped-query versions (the CPU layout); the four above are their NKV = NH case. The scratch
// holds O(B·NH·Tlen²) scores as above, plus the k/v heads of only NKV heads. `seg` (optional):
// device [B, Tlen] segment ids, non-decreasing along each row, as the CPU kernels take them.
// REQUIRES: NH % NKV == 0.
int64_t attention_gqa_forward_scratch_bytes(int64_t B, int64_t Tlen, int64_t NH, int64_t NKV,
                                            int64_t HS, DType act);
int64_t attention_gqa_backward_scratch_bytes(int64_t B, int64_t Tlen, int64_t NH, int64_t NKV,
                                             int64_t HS, DType act);
void attention_gqa_forward(const void* qkv, void* out, float* lse, void* scratch, int64_t B,
                           int64_t Tlen, int64_t NH, int64_t NKV, int64_t HS, DType act,
                           void* stream, const int32_t* seg = nullptr);
void attention_gqa_backward(const void* qkv, const float* lse, const void* dout, void* dqkv,
                            void* scratch, int64_t B, int64_t Tlen, int64_t NH, int64_t NKV,
                            int64_t HS, DType act, void* stream, const int32_t* seg = nullptr);

// Flash attention (model/ops/flash_attention_cuda.cu): bf16, HS = 64 or 128, no O(T²) memory,
// grouped-query attention included (NKV k/v heads, each read in place by NH / NKV query heads).
// causal_attention and causal_attention_gqa take it whenever flash_attention_supported(); the
// kernels above stay as the reference for every other case (fp32, other head sizes) and for the
// tests.
bool flash_attention_supported(int64_t HS, DType act);

// Which sm_90a kernels flash_attention_forward/backward run on a compute-capability 9.0 GPU where
// both kinds apply (HS 64 or 128; for the forward, self-attention with Tq = Tk): kWgmma
// (model/ops/flash_wgmma.h, one warpgroup a CTA; the default) or kFa3 (model/ops/flash_fa3.h,
// FlashAttention-3's producer/consumer structure). Everything else keeps its kernels. Process-wide,
// read at each launch (so a graph captures the choice in force at capture); bench_gpu --attention
// and the attention sweep set it until measurements pick one (Note [Hopper attention choice] in
// flash_attention_cuda.cu).
enum class HopperFlash { kWgmma, kFa3 };
void set_hopper_flash(HopperFlash kind);
HopperFlash hopper_flash();

// q rows [B, Tq] with NH heads and k, v rows [B, Tk] (Tk >= Tq) with NKV heads (0: NH; NKV
// divides NH), head h in columns [h·HS, (h+1)·HS) of each row; query head h reads k/v head
// h / (NH / NKV). Element strides between rows (`*_ld`) and batches (`*_batch`), multiples of 8,
// pointers 16-byte aligned. Query i attends to keys j <= i + (Tk − Tq) (causal, aligned to the
// last query). Writes o rows [B, Tq] (NH heads) and lse [B, NH, Tq] (natural-log log-sum-exp of
// each row's scaled scores). With `seg` (document masking; Tq = Tk = T): i32 segment ids, row b at
// seg + b·seg_batch, non-decreasing along the row; query i then sees key j only when
// seg[j] == seg[i] too (Note [document masking in the flash kernels] in flash_common.cuh).
struct FlashForwardArgs {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  float* lse = nullptr;
  int64_t q_ld = 0, kv_ld = 0, o_ld = 0;
  int64_t q_batch = 0, kv_batch = 0, o_batch = 0;
  int B = 0, NH = 0, HS = 0, Tq = 0, Tk = 0;
  int NKV = 0;                   // k/v heads; 0 means NH
  float scale = 0.0f;            // multiplies q·k
  const int32_t* seg = nullptr;  // [B, T] segment ids (document masking), or null
  int64_t seg_batch = 0;         // elements between the segment rows of two batches
};
void flash_attention_forward(const FlashForwardArgs& a, void* stream);

// Self-attention backward (Tq = Tk = T) on the packed qkv rows [B, T, (NH + 2·NKV)·HS] (NH q
// heads at column 0, then NKV k heads, then NKV v heads): accumulates dqkv (same layout, bf16) +=
// the gradient, given o and dout rows [B, T] (NH heads) and the forward's lse. Deterministic (no
// atomics; a shared k/v head's gradient is summed over its query heads in head order). `scratch`:
// flash_attention_backward_scratch_floats floats.
struct FlashBackwardArgs {
  const void* qkv = nullptr;
  const void* o = nullptr;
  const void* dout = nullptr;
  const float* lse = nullptr;
  void* dqkv = nullptr;
  int64_t qkv_ld = 0, qkv_batch = 0, o_ld = 0, o_batch = 0;
  int B = 0, NH = 0, HS = 0, T = 0;
  int NKV = 0;  // k/v heads; 0 means NH
  float scale = 0.0f;
  bool accumulate = true;  // false: dqkv is written, not added to (every element is covered)
  // When set ([HS/2] f32, rope_table's): q and k were rotated by RoPE at positions rope_pos0 + t
  // before the forward, and the dQ and dK stored are rotated back, the gradient of the
  // un-rotated q and k (Note [RoPE in the flash backward] in model/ops/flash_common.cuh).
  const float* rope_inv_freq = nullptr;
  int64_t rope_pos0 = 0;
  // When set: flash_column_chunks(B, T) × (NH + 2·NKV)·HS floats that get the fixed-chunk column
  // partials of the stored dqkv (Note [qkv bias partials] in model/ops/flash_common.cuh).
  float* col_partial = nullptr;
  // Document masking, as FlashForwardArgs::seg (the forward's segment ids).
  const int32_t* seg = nullptr;
  int64_t seg_batch = 0;
};
// Row chunks of FlashBackwardArgs::col_partial: one per 64-row tile of each sequence.
inline int64_t flash_column_chunks(int64_t B, int64_t T) { return B * ((T + 63) / 64); }
int64_t flash_attention_backward_scratch_floats(int64_t B, int64_t T, int64_t NH);
void flash_attention_backward(const FlashBackwardArgs& a, float* scratch, void* stream);
}  // namespace cuda

}  // namespace gtron

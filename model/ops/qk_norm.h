// Per-head RMSNorm of the query and key heads of a packed llama projection (Qwen3's q_norm and
// k_norm, applied before RoPE; model/llama.h).
#pragma once

#include <cstdint>

#include "model/autograd.h"

namespace gtron {

// qkv: [..., (NH + 2·NKV)·HS] rows holding NH query heads, then NKV key heads, then NKV value
// heads, HS wide each. Returns the same shape: each query head's HS values RMS-normalized and
// scaled by gamma_q [HS], each key head's by gamma_k [HS], the value heads copied:
//   y = x / sqrt(mean(x²) + eps) · gamma.
// Statistics in the tensor's float type on the CPU, fp32 on CUDA. Backward accumulates into dqkv
// (the value heads' gradient passes through; on CUDA an empty dqkv slot is written, not zeroed
// and added to), dgamma_q and dgamma_k.
//
// Note [RoPE in the q/k norm]
// With `rope` (CUDA only), the query and key heads of the result also come out rotated by RoPE at
// positions rope->pos0 + t, as causal_attention_gqa_rope(..., rotated = true) reads them: that
// attention's backward delivers the gradient of the un-rotated heads (Note [RoPE in the flash
// backward] in model/ops/attention.h), which is what this op's backward takes, so the rotation
// costs no pass of its own either way. The packed kernels rotate on their way to the store (a
// lane swaps values with the lane holding the other half of its pairs); the general ones leave
// it to RoPE's in-place pass. Either way the bits are those of the norm followed by
// cuda::rope_forward_inplace (model/ops/rope_math.cuh's rotation, of the rounded norm output).
// Without the fusion the attention rotated q and k in a pass of its own over them.
struct QkNormRope {
  Tensor inv_freq;   // f32 [HS/2] (rope_table)
  int64_t pos0 = 0;  // position of t = 0
};
Var qk_rmsnorm(const Var& qkv, int NH, int NKV, int64_t HS, const Var& gamma_q, const Var& gamma_k,
               double eps, const QkNormRope* rope = nullptr);

namespace cpu {
// N rows of (NH + 2·NKV)·HS; rrms [N, NH + NKV]: 1 / sqrt(mean(x²) + eps) of each q and k head.
template <typename T>
void qk_rmsnorm_forward(const T* x, const T* gq, const T* gk, T* y, T* rrms, int64_t N, int NH,
                        int NKV, int64_t HS, double eps);
// dx, dgq, dgk may be null. Accumulates.
template <typename T>
void qk_rmsnorm_backward(const T* x, const T* gq, const T* gk, const T* rrms, const T* dy, T* dx,
                         T* dgq, T* dgk, int64_t N, int NH, int NKV, int64_t HS);
}  // namespace cpu

namespace cuda {
// RoPE fused into the forward (Note [RoPE in the q/k norm]): the N rows are N / Tlen sequences of
// Tlen, row n at position pos0 + n % Tlen.
struct QkRope {
  const float* inv_freq = nullptr;  // [HS/2]
  int64_t Tlen = 1;
  int64_t pos0 = 0;
};
// Same contract; x, y, dy, dx in `act` (f32 or bf16), gq/gk in `param` (act, or f32 with bf16
// activations), rrms and the gamma gradients in f32. REQUIRES: HS <= 1024. With `rope`, y's q and
// k heads come out rotated (the bits of cuda::rope_forward_inplace over the plain result).
void qk_rmsnorm_forward(const void* x, const void* gq, const void* gk, DType param, void* y,
                        float* rrms, int64_t N, int NH, int NKV, int64_t HS, double eps, DType act,
                        void* stream, const QkRope* rope = nullptr);
// Floats of scratch qk_rmsnorm_backward needs when a gamma gradient is wanted.
int64_t qk_rmsnorm_backward_scratch_floats(int64_t N, int NH, int NKV, int64_t HS);
// dx_overwrite: dx is written instead of added to (the slot was empty: Var::grad_for_write).
void qk_rmsnorm_backward(const void* x, const void* gq, const void* gk, DType param,
                         const float* rrms, const void* dy, void* dx, float* dgq, float* dgk,
                         float* scratch, int64_t N, int NH, int NKV, int64_t HS, DType act,
                         void* stream, bool dx_overwrite = false);
}  // namespace cuda

}  // namespace gtron

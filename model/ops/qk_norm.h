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
// (the value heads' gradient passes through), dgamma_q and dgamma_k.
Var qk_rmsnorm(const Var& qkv, int NH, int NKV, int64_t HS, const Var& gamma_q, const Var& gamma_k,
               double eps);

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
// Same contract; x, y, dy, dx in `act` (f32 or bf16), gq/gk in `param` (act, or f32 with bf16
// activations), rrms and the gamma gradients in f32. REQUIRES: HS <= 1024.
void qk_rmsnorm_forward(const void* x, const void* gq, const void* gk, DType param, void* y,
                        float* rrms, int64_t N, int NH, int NKV, int64_t HS, double eps, DType act,
                        void* stream);
// Floats of scratch qk_rmsnorm_backward needs when a gamma gradient is wanted.
int64_t qk_rmsnorm_backward_scratch_floats(int64_t N, int NH, int NKV, int64_t HS);
void qk_rmsnorm_backward(const void* x, const void* gq, const void* gk, DType param,
                         const float* rrms, const void* dy, void* dx, float* dgq, float* dgk,
                         float* scratch, int64_t N, int NH, int NKV, int64_t HS, DType act,
                         void* stream);
}  // namespace cuda

}  // namespace gtron

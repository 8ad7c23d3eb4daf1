// The GPT-2 MLP's GELU fused into its two GEMMs (CUDA, bf16; cuBLASLt epilogues):
//   up:   pre = x·w_upᵀ + b_up and g = gelu(pre) from one GEMM (GELU_AUX_BIAS)
//   down: y = g·w_downᵀ + b_down; its backward writes d pre = (dy·w_down) ⊙ gelu'(pre) from one
//         GEMM (DGELU) straight into pre's gradient, so dg is never formed.
//
// Note [keeping g]
// The backward's dw_down needs g. Keeping it costs a [N, 4C] activation per block (1.2 GB on GPT-2
// 124M at B·T = 16k); recomputing it from pre costs one elementwise pass per block (0.74 ms a
// step there). The head's blocked classifier (model/ops/classifier.h) frees more than that, so g
// is kept; train.recompute = "selective" recomputes it (the way to trade the time for the memory;
// it replaced the switch GTRON_MLP_KEEP_G=0). Recomputed, g comes from the GELU kernel, not the
// epilogue: bf16 rounding apart, so dw_down differs from the kept path's in the last bits.
// Same values as linear → gelu → linear up to bf16 rounding order. The composed ops stay the
// path everywhere else (CPU, f32) and the reference the tests compare against.
#pragma once

#include <cstdint>

#include "model/autograd.h"

namespace gtron {

namespace fp8 {
struct QuantizedWeight;
}  // namespace fp8

struct GeluUp {
  Var pre;  // [.., Cout] x·wᵀ + b: its gradient is what linear_gelu_up's backward reads
  Var g;    // [.., Cout] gelu(pre): to be consumed by linear_after_gelu only
};

// True when the fused pair applies to activations of this device and dtype.
bool fused_mlp_supported(const Var& x);

// x: [N.., Cin], w: [Cout, Cin], b: [Cout] (bf16 like x). Backward (when pre has a gradient)
// accumulates dx, dw, db exactly like linear's.
GeluUp linear_gelu_up(const Var& x, const Var& w, const Var& b);

// y = linear(up.g, w, b) (b may be undefined: a row-parallel layer adds it after the sum over
// TP), plus `residual` when given (the block's residual stream, added in the GEMM's epilogue
// before the one rounding). Backward accumulates dw += dyᵀ·g, db += Σ dy, dresidual += dy, and
// delivers d pre = (dy·w) ⊙ gelu'(pre) into up.pre's gradient (written when the slot is empty,
// else added). `recompute` (train.recompute = "selective"): drop g and re-form it from pre in the
// backward (Note [keeping g]). REQUIRES: up.g has no other consumer.
Var linear_after_gelu(const GeluUp& up, const Var& w, const Var& b, const Var& residual = Var(),
                      bool recompute = false);

// Note [recomputing the SwiGLU output]
// The llama block's down projection reads a = silu(gate) ⊙ up, a [N, F] activation per block
// (2.1 GB on the Llama-3.2-1B shape at B·T = 8192, 1.4 GB on Qwen3-0.6B's) that the composed ops
// keep from the forward to down's weight gradient. swiglu_linear forms a, runs the GEMM, and
// either keeps a (keep_act) or drops it at once and re-forms it from [gate | up] (kept anyway:
// SwiGLU's own backward reads it) right before the weight gradient: one elementwise pass per
// block (about 1.5% of the step there) for that memory. train.recompute = "selective" asks for
// the second. Either way values and gradients equal the composed swiglu → linear (+ residual)
// bit for bit: the same kernels in the same order, the same GEMMs.
//
// gu: [N.., 2F] holding [gate | up]; w: [Cout, F] (bf16 like gu). y = swiglu(gu)·wᵀ (+ residual,
// in the GEMM's epilogue). Backward: dw += dyᵀ·a, dresidual += dy, and d gu (+)= SwiGLU's backward
// of dy·w. REQUIRES: CUDA, bf16; w not split over TP.
Var swiglu_linear(const Var& gu, const Var& w, const Var& residual, bool keep_act);

// Note [SwiGLU into an FP8 down projection]
// With FP8 (train.precision = "fp8") the down projection reads a = silu(gate) ⊙ up only as codes:
// the forward product as 1x128 tiles along F (the rows codes SwiGLU writes, Note [fp8 fused
// producers] in fp8.h), the weight gradient as aᵀ in 1x128 tiles along the tokens, which the
// composed ops make in the backward from a bf16 a kept since the forward (fp8_quantize_cols).
// swiglu_linear_fp8 makes both codes in the forward, from one tile kernel (Note [SwiGLU forward
// with both codes] in swiglu_cuda.cu), keeps the column codes for the backward and never stores a
// at all: per block, 2·N·F bytes less written in the forward and read in the backward, and a
// quantizer launch less; N·F bytes (plus scales) kept between the passes instead of 2·N·F. The
// products, codes and gradients are the composed path's bit for bit (the same codes from the same
// tile arithmetic, the same GEMMs; fp8_fused_cuda_test compares the whole model both ways).
//
// gu: [N.., 2F]; w: [Cout, F], read through `wq`, its codes (Note [fp8 weights once a step] in
// fp8.h), or quantized here when wq is null (w then bf16). y = swiglu(gu)·wᵀ (+ residual in the
// epilogue). Backward: dw (+)= dyᵀ·a, dresidual += dy, d gu (+)= SwiGLU's backward of dy·w (with
// gu's gradient codes where its reader asked: Note [gradient fp8 codes] in model/autograd.h).
// REQUIRES: swiglu_linear_fp8_ok(gu, F, Cout); no bias; w not split over TP.
// The llama block takes this path unless GTRON_FP8_SWIGLU_DOWN=0 (an A/B switch; read at the
// first question). The calls so far, for tests.
bool fp8_swiglu_down();
int64_t swiglu_linear_fp8_calls();
bool swiglu_linear_fp8_ok(const Var& gu, int64_t F, int64_t Cout);
Var swiglu_linear_fp8(const Var& gu, const Var& w, const fp8::QuantizedWeight* wq,
                      const Var& residual);

namespace cuda {
// pre[N, Cout] = x·wᵀ + bias, g = gelu(pre), one GEMM when cuBLASLt offers the epilogue (else a
// GEMM and the GELU kernel). All bf16.
void linear_gelu_forward(const void* x, const void* w, const void* bias, void* pre, void* g,
                         int64_t N, int64_t Cin, int64_t Cout, void* stream);
// dpre[N, Cin] = (dy[N, Cout]·w[Cout, Cin]) ⊙ gelu'(pre[N, Cin]), written (not accumulated), in one
// GEMM. Returns false, doing nothing, where cuBLASLt offers no DGELU epilogue for the problem (the
// caller then composes a GEMM and gelu_backward). All bf16.
bool dgelu_backward(const void* dy, const void* w, const void* pre, void* dpre, int64_t N,
                    int64_t Cin, int64_t Cout, void* stream);
}  // namespace cuda

}  // namespace gtron

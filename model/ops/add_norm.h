// The residual add and the norm that reads it, as one op: h = x + a, y = layernorm(h) (GPT-2) or
// y = rmsnorm(h) (the llama family).
//
// Note [fused residual add and LayerNorm]
// A pre-LN block adds the attention output to the residual stream and normalizes the sum at once
// (h = x + a; y = ln2(h)). Composed, that is two passes over [N, C] rows: add reads x and a and
// writes h, then layernorm reads h back and writes y. On CUDA one kernel does both: a warp forms
// its row of h from x and a, stores it and normalizes it, so h is never read back from memory:
// 4 passes of N·C elements instead of 5 (read x, a; write h, y), one launch instead of two. On
// GPT-2 124M at B·T = 16k in bf16 a pass is 25 MB, so 0.3 GB less traffic per forward over the
// 12 blocks (and as much again in the backward, below). The statistics are those of h rounded to
// the activation dtype (x + a in fp32, rounded as add's kernel rounds it), summed in the order
// layernorm's kernel sums them (same pack width, same lanes), so h, y, mean and rstd equal the
// composed ops' bit for bit. The later two visits of each column (the centred squares, the
// output) recompute the rounded h from x and a, which the first visit left in cache, instead of
// reading h back.
// Backward: h's gradient has two sources, the residual path (whatever consumed h: the next add)
// and the norm. The residual gradient arrives in h's slot first; the norm backward adds its dx
// into that slot in place (as layernorm's backward accumulates), and then the sum goes to x and a
// as add's backward delivers it (Note [add backward aliasing]): the first empty slot takes the
// buffer itself; the next one is written by the norm kernel as it stores dh (or added into, for a
// slot already holding gradient), instead of by a separate copy or add kernel that reads dh back:
// 5 passes instead of 6 (read h, dy, dh; write dh, da), one launch less per block. Same values as
// the composed ops, bit for bit (the same kernel arithmetic in the same order), and deterministic.
// Covered: every shape layernorm covers. Where x or a is unaligned but h is not, the forward runs
// the two composed kernels (the pack width must match layernorm's); where the second gradient
// slot is unaligned under 16-byte packs, it is written by a second pass. On the CPU the op is
// add then layernorm (the reference).
// RMSNorm (add_rmsnorm) is the same op without the centring and beta: the kernels are the
// LayerNorm ones with their kLN flag off (the forward's SumRow stores h on its first visit, the
// sum of squares; the backward's kAlso rides in rmsnorm's dx kernels), so everything above holds
// with rmsnorm's kernels in place of layernorm's: bit for bit the composed add → rmsnorm on CUDA,
// add then rmsnorm on the CPU.
#pragma once

#include <cstdint>

#include "model/autograd.h"
#include "model/ops/norm.h"

namespace gtron {

struct AddNorm {
  Var h;  // [.., C] x + a (the residual stream)
  Var y;  // [.., C] layernorm(h)
};

// x, a: [.., C] (same shape, dtype, device); gamma, beta: [C] (f32, or x's dtype). Backward
// accumulates into x, a, gamma and beta like add then layernorm; h and y may each have other
// consumers (their gradients are summed).
AddNorm add_layernorm(const Var& x, const Var& a, const Var& gamma, const Var& beta,
                      double eps = kLayerNormEps);

// h = x + a, y = rmsnorm(h, gamma, eps): add_layernorm's contract without beta. x, a: [.., C];
// gamma: [C] (f32, or x's dtype). Backward accumulates into x, a and gamma like add then rmsnorm.
AddNorm add_rmsnorm(const Var& x, const Var& a, const Var& gamma, double eps = kRMSNormEps);

namespace cuda {
// h = x + a and y = layernorm(h) over N rows of C; the other arguments as layernorm_forward's.
void add_layernorm_forward(const void* x, const void* a, const void* gamma, const void* beta,
                           DType param, void* h, void* y, float* mean, float* rstd, int64_t N,
                           int64_t C, double eps, DType act, void* stream);
// dh += layernorm's dx (dh: the residual gradient, in place), then `also` = dh (also_add: +=),
// from the same kernel where the layout allows; dgamma and dbeta accumulate (either may be null).
// `also` may be null; scratch: layernorm_backward_scratch_floats(N, C). REQUIRES: also != dh.
void add_layernorm_backward(const void* h, const void* gamma, DType param, const float* mean,
                            const float* rstd, const void* dy, void* dh, void* also, bool also_add,
                            float* dgamma, float* dbeta, float* scratch, int64_t N, int64_t C,
                            DType act, void* stream);
// The same two for RMSNorm: rrms[N] as rmsnorm_forward's; scratch:
// rmsnorm_backward_scratch_floats(N, C). REQUIRES: also != dh.
void add_rmsnorm_forward(const void* x, const void* a, const void* gamma, DType param, void* h,
                         void* y, float* rrms, int64_t N, int64_t C, double eps, DType act,
                         void* stream);
void add_rmsnorm_backward(const void* h, const void* gamma, DType param, const float* rrms,
                          const void* dy, void* dh, void* also, bool also_add, float* dgamma,
                          float* scratch, int64_t N, int64_t C, DType act, void* stream);
}  // namespace cuda

}  // namespace gtron

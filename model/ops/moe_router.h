// The mixture-of-experts router (model/moe.h): affinities from the router's logits, the top-k
// choice of experts per token with their gate weights, and the Switch-style balance loss.
//
// Note [router determinism]
// The choice of experts is a host decision per token made from its own row only: the k largest
// values of score + bias, ties broken by the lower expert index, slot 0 the largest. The same row
// gives the same experts whatever the batch, the thread count or the run, so a rerun routes every
// token to the same experts and the dispatch order (model/ops/moe_dispatch.h) is the same too.
// The choice is piecewise constant in the logits: gradients reach the router through the gate
// weights (and the balance loss) only. The CUDA kernel makes the same choice from the same
// values: one warp a row, the argmax of each of the k rounds taken under the order (value
// descending, index ascending), which is the CPU's strict-> scan.
//
// Note [fp32 routing on CUDA]
// On CUDA the affinities are f32 whatever the logits' dtype (bf16 under mixed precision): the
// logits GEMM is the block linears' (bf16 in, fp32 accumulate, bf16 out), then softmax/sigmoid,
// the choice, the gates and the balance loss run and are stored in fp32, as DeepSeek-V3's and
// Megatron's routers do. Near-equal experts then tie only where the bf16 logits do, and the
// gates that weight the experts' outputs keep fp32 precision (moe_combine takes f32 gates next to
// bf16 rows). The backward hands bf16 dlogits back to the linear.
#pragma once

#include <cstdint>

#include "model/autograd.h"

namespace gtron {

enum class MoeRouterKind {
  kSoftmax,  // Qwen3-MoE, Mixtral: softmax over the experts, then top-k
  kSigmoid,  // DeepSeek-V3: independent sigmoid affinities, top-k on affinity + bias
};

// logits: [..., E] -> affinities of the same shape: softmax over the last dim, or sigmoid per
// element; in the logits' dtype on the CPU, f32 on CUDA (Note [fp32 routing on CUDA]). Backward
// accumulates into dlogits:
//   softmax: dz += s ⊙ (ds − Σ_e ds·s),   sigmoid: dz += ds·s·(1 − s).
Var router_scores(const Var& logits, MoeRouterKind kind);

struct TopKGates {
  Var gates;   // [N, k], differentiable in the scores
  Tensor ids;  // i32 [N, k]: the chosen experts, slot 0 first (Note [router determinism])
};

// scores: [..., E] (N rows). Chooses, per row, the k experts of largest score + bias (`bias`:
// [E] in the scores' dtype, or undefined for none) and returns the gates taken from the scores
// without the bias: g_j = s[id_j], divided by Σ_j s[id_j] when `normalize`. Backward accumulates
// ds[id_j] += dg_j, or with `normalize` ds[id_j] += (dg_j − Σ_i dg_i·g_i) / Σ_i s[id_i].
// REQUIRES: 1 <= k <= E; with `normalize`, scores > 0 (softmax or sigmoid affinities). On CUDA,
// f32 scores and bias and E <= cuda::kMaxExperts.
TopKGates topk_gates(const Var& scores, const Tensor& bias, int k, bool normalize);

// The Switch-Transformer balance loss: weight · E · Σ_e f_e · P_e, a scalar (rank 0), where
// f_e = (slots routed to e) / (N·k) from `ids` (constant) and P_e = the mean over the N rows of
// p[n, e], p = scores (rows summing to 1: softmax) or, with `normalize_rows` (sigmoid), each row
// of scores divided by its sum. Backward accumulates dscores += dloss · weight · E · f_e / N,
// through the row normalization when `normalize_rows`. Sums in a fixed order. On CUDA, f32
// scores; the loss is computed on the device (no host read).
Var moe_aux_loss(const Var& scores, const Tensor& ids, double weight, bool normalize_rows);

namespace cpu {
// N rows of E: s = softmax(z) or sigmoid(z); the backward accumulates dz.
template <typename T>
void router_scores_forward(const T* z, T* s, int64_t N, int64_t E, MoeRouterKind kind);
template <typename T>
void router_scores_backward(const T* s, const T* ds, T* dz, int64_t N, int64_t E,
                            MoeRouterKind kind);
// bias: [E] or null. Writes ids [N, k] and gates [N, k].
template <typename T>
void topk_gates_forward(const T* s, const T* bias, int32_t* ids, T* gates, int64_t N, int64_t E,
                        int k, bool normalize);
// Accumulates ds [N, E].
template <typename T>
void topk_gates_backward(const T* s, const int32_t* ids, const T* gates, const T* dgates, T* ds,
                         int64_t N, int64_t E, int k, bool normalize);
// loss[0] = the balance loss; coef [E] receives weight · E · f_e / N (the backward's factor).
template <typename T>
void moe_aux_loss_forward(const T* s, const int32_t* ids, T* loss, T* coef, int64_t N, int64_t E,
                          int k, double weight, bool normalize_rows);
// Accumulates ds [N, E] += dloss · (coef through the row normalization).
template <typename T>
void moe_aux_loss_backward(const T* s, const T* coef, T dloss, T* ds, int64_t N, int64_t E,
                           bool normalize_rows);
}  // namespace cpu

namespace cuda {
// The most experts the CUDA MoE kernels take (the top-k warp keeps E/32 values a lane, the plan's
// scan is one block of this many threads, the grouped GEMMs take the experts' pointers as kernel
// arguments).
constexpr int kMaxExperts = 512;
// z: [N, E] in `act` (f32 or bf16) -> s: [N, E] f32, on `stream` (a cudaStream_t).
void router_scores_forward(const void* z, float* s, int64_t N, int64_t E, MoeRouterKind kind,
                           DType act, void* stream);
// dz [N, E] (act) += the gradient for ds (f32); written instead with `overwrite`.
void router_scores_backward(const float* s, const float* ds, void* dz, int64_t N, int64_t E,
                            MoeRouterKind kind, DType act, void* stream, bool overwrite);
// The CPU contract in f32 (bias: [E] or null); one warp a row.
void topk_gates_forward(const float* s, const float* bias, int32_t* ids, float* gates, int64_t N,
                        int64_t E, int k, bool normalize, void* stream);
// Accumulates ds [N, E].
void topk_gates_backward(const float* s, const int32_t* ids, const float* gates,
                         const float* dgates, float* ds, int64_t N, int64_t E, int k,
                         bool normalize, void* stream);
// Floats of scratch moe_aux_loss_forward needs.
int64_t moe_aux_loss_scratch_floats(int64_t N, int64_t E);
// loss[0] and coef [E] as the CPU's, every sum in a fixed order; all pointers on the device.
void moe_aux_loss_forward(const float* s, const int32_t* ids, float* loss, float* coef,
                          float* scratch, int64_t N, int64_t E, int k, double weight,
                          bool normalize_rows, void* stream);
// Accumulates ds [N, E] += dloss[0] · (coef through the row normalization); dloss on the device.
void moe_aux_loss_backward(const float* s, const float* coef, const float* dloss, float* ds,
                           int64_t N, int64_t E, bool normalize_rows, void* stream);
}  // namespace cuda

}  // namespace gtron

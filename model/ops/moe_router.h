// The mixture-of-experts router (model/moe.h): affinities from the router's logits, the top-k
// choice of experts per token with their gate weights, and the Switch-style balance loss.
//
// Note [router determinism]
// The choice of experts is a host decision per token made from its own row only: the k largest
// values of score + bias, ties broken by the lower expert index, slot 0 the largest. The same row
// gives the same experts whatever the batch, the thread count or the run, so a rerun routes every
// token to the same experts and the dispatch order (model/ops/moe_dispatch.h) is the same too.
// The choice is piecewise constant in the logits: gradients reach the router through the gate
// weights (and the balance loss) only.
#pragma once

#include <cstdint>

#include "model/autograd.h"

namespace gtron {

enum class MoeRouterKind {
  kSoftmax,  // Qwen3-MoE, Mixtral: softmax over the experts, then top-k
  kSigmoid,  // DeepSeek-V3: independent sigmoid affinities, top-k on affinity + bias
};

// logits: [..., E] -> affinities of the same shape: softmax over the last dim, or sigmoid per
// element. Backward accumulates into dlogits:
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
// REQUIRES: 1 <= k <= E; with `normalize`, scores > 0 (softmax or sigmoid affinities).
TopKGates topk_gates(const Var& scores, const Tensor& bias, int k, bool normalize);

// The Switch-Transformer balance loss: weight · E · Σ_e f_e · P_e, a scalar (rank 0), where
// f_e = (slots routed to e) / (N·k) from `ids` (constant) and P_e = the mean over the N rows of
// p[n, e], p = scores (rows summing to 1: softmax) or, with `normalize_rows` (sigmoid), each row
// of scores divided by its sum. Backward accumulates dscores += dloss · weight · E · f_e / N,
// through the row normalization when `normalize_rows`. Sums in a fixed order.
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

}  // namespace gtron

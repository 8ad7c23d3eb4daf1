// The mixture-of-experts MLP of the llama family (DeepSeek-V3 / Qwen3-MoE style), in place of a
// block's SwiGLU MLP from layer first_dense_layers on:
//   logits = g · W_rᵀ                       router [E, C]
//   s      = softmax(logits) | sigmoid(logits)
//   ids    = top-k of s (+ bias, sigmoid)   per token, Note [router determinism]
//   gates  = s[ids] (normalized: sigmoid always, softmax with norm_topk_prob)
//   y      = Σ_j gates_j · Expert_{ids_j}(g)  +  Shared(g)
// Every expert, and the shared experts as one, is a SwiGLU MLP: down(silu(gate(g)) ⊙ up(g)) with
// gate_up [2F, C] (gate's rows, then up's: Note [packed llama projections]) and down [C, F]; the
// shared MLP is num_shared experts wide (F_shared = num_shared · F). Routing is dropless: every
// token reaches its k experts. The ops are model/ops/moe_router.h, moe_dispatch.h and
// grouped_linear.h; the CPU only for now.
//
// Note [MoE layout]
// Parameters, in creation order (the order of the checkpoint and of the GTP chain):
//   <name>.router.weight                 [E, C]
//   <name>.experts.<e>.gate_up.weight    [2F, C]   } expert by expert, e = 0 .. E − 1
//   <name>.experts.<e>.down.weight       [C, F]    }
//   <name>.shared.gate_up.weight         [2·S·F, C]   (num_shared S > 0)
//   <name>.shared.down.weight            [C, S·F]
// One parameter per expert matrix, and the grouped op takes the experts as a list over one
// permuted row buffer with offsets, so expert parallelism cuts the list: rank r of EP keeps the
// experts [r·E/EP, (r + 1)·E/EP), a contiguous stretch of parameters, and the rows an all-to-all
// brings it are the offsets' contiguous blocks of those experts, already in (expert, token)
// order. Not yet under GTP: grouped_linear holds the use() of every expert weight of a layer at
// once, while GTP's gather buffers are shared by same-shaped weights that are not chain
// neighbours (the ticket cache in parallel/gtp.h), so expert e + 2's gather would overwrite
// expert e's before the op reads it; EP (each rank's experts whole) or a per-expert
// use -> GEMM -> used sequence lifts that. The expert GEMMs take the block linears' precision: with
// train.precision = "fp8" they run linear's FP8 recipe per expert (the router stays in full
// precision, as DeepSeek-V3's).
//
// Note [router bias]
// The sigmoid router's aux-loss-free balancing (DeepSeek-V3): a per-expert bias b [E] added to
// the affinities for the choice of experts only (never to the gates). It is not a parameter (no
// gradient, no optimizer state): after each optimizer step, update_bias() moves it by
// b_e += rate · sign(mean_load − load_e) from the slots each expert received since the last
// update (counted by forwards in grad mode only, so evaluation does not count), and resets the
// counts. It is the layer's state, saved in checkpoints as <name>.router.expert_bias. Under data
// parallelism the trainer sums the counts over the data ranks first (exact: integers), so the
// bias moves by the global batch's load, the same on every rank and in every layout.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/layers.h"
#include "model/ops/moe_router.h"

namespace gtron {

struct MoeDims {
  int E = 0;                   // routed experts (0: dense)
  int top_k = 1;               // experts per token
  int num_shared = 0;          // shared experts (one always-on MLP of num_shared · F)
  int64_t F = 0;               // each expert's SwiGLU width
  int first_dense_layers = 0;  // blocks [0, first_dense_layers) keep the dense MLP
  MoeRouterKind router = MoeRouterKind::kSoftmax;
  bool norm_topk_prob = true;   // softmax: renormalize the top-k gates to sum 1
  double aux_loss_weight = 0;   // Switch balance loss weight (0: none)
  double bias_update_rate = 0;  // sigmoid: Note [router bias] (0: the bias stays 0)
};

// Expert load and balance of one MoE layer: the slots each expert received over the forwards
// counted since the last reset (Note [router bias]).
struct MoeLayerStats {
  int layer = 0;                // block index
  std::vector<int64_t> tokens;  // [E] slots per expert
  int64_t tokens_min = 0, tokens_max = 0;
  double load_cv = 0;    // coefficient of variation of tokens (population std / mean)
  double aux_loss = 0;   // the balance loss of the last forward in grad mode (weighted)
  double bias_norm = 0;  // ‖b‖₂ of the router bias
};

class MoeLayer {
 public:
  // resid_std: the init std of the down projections (the block's residual-scaled one).
  MoeLayer(ParamRegistry& reg, const std::string& name, int64_t C, const MoeDims& d, double std,
           double resid_std);
  MoeLayer(const MoeLayer&) = delete;
  MoeLayer& operator=(const MoeLayer&) = delete;

  // g: [..., C] (the block's mlp_norm output) -> the MLP output of the same shape (no residual).
  // In grad mode, counts the load and keeps the balance loss for take_aux_loss().
  Var forward(const Var& g, WeightAccess& w);
  // The balance loss of the last forward (a scalar Var, weighted), then forgotten; undefined when
  // aux_loss_weight is 0 or no forward ran since.
  Var take_aux_loss();

  MoeLayerStats stats(int layer) const;
  // Note [router bias]: the sigmoid router's bias update (when rate > 0), then the load reset.
  void update_bias();
  void reset_load();
  // The slots each expert received since the last reset, [E]: data-parallel ranks sum theirs
  // before update_bias(), so every rank moves its bias the same way (Note [router bias]).
  std::vector<int64_t>& load() { return load_; }
  // The router bias [E] in the model's dtype (state saved in checkpoints).
  Tensor& expert_bias() { return bias_; }
  const std::string& bias_name() const { return bias_name_; }
  const MoeDims& dims() const { return d_; }

 private:
  MoeDims d_;
  LinearLayer router_;                        // [E, C], full precision
  std::vector<LinearLayer> gate_up_, down_;   // per expert: [2F, C], [C, F]
  LinearLayer shared_gate_up_, shared_down_;  // [2·S·F, C], [C, S·F] when num_shared > 0
  Tensor bias_;                               // [E]
  std::string bias_name_;
  std::vector<int64_t> load_;  // [E] slots since the last reset (written by the plan's closure)
  Var aux_;                    // the last forward's balance loss
  Tensor last_aux_value_;      // the balance loss of the last forward in grad mode
};

}  // namespace gtron

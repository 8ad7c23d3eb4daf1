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
// grouped_linear.h, on the CPU and on CUDA (Note [MoE on CUDA]).
//
// Note [MoE layout]
// Parameters, in creation order (the order of the checkpoint and of the GTP chain):
//   <name>.router.weight                 [E, C]
//   <name>.experts.<e>.gate_up.weight    [2F, C]   } expert by expert, e = 0 .. E − 1
//   <name>.experts.<e>.down.weight       [C, F]    }
//   <name>.shared.gate_up.weight         [2·S·F, C]   (num_shared S > 0)
//   <name>.shared.down.weight            [C, S·F]
// One parameter per expert matrix, and the grouped op takes the experts as a list over one
// permuted row buffer with offsets, so expert parallelism cuts the list (Note [expert
// parallelism]): an EP rank creates only its own experts' parameters, under their global names.
// Under GTP the routed experts are not sharded (the trainer keeps them whole, reduced over the
// ranks that hold them): grouped_linear holds the use() of every expert weight of a layer at
// once, while GTP's gather buffers are shared by same-shaped weights that are not chain
// neighbours (the ticket cache in parallel/gtp.h), so expert e + 2's gather would overwrite
// expert e's before the op reads it. The router and the shared experts are plain linears and
// shard as any other. The expert GEMMs take the block linears' precision: with
// train.precision = "fp8" they run linear's FP8 recipe per expert (the router stays in full
// precision, as DeepSeek-V3's).
//
// Note [expert parallelism]
// With EP > 1 (MoeDims::ep_size, parallel.ep) the EP ranks of a group (parallel/grid.h, Note
// [expert-parallel groups]) each route their own tokens, and rank r holds the experts
// [r·E/EP, (r + 1)·E/EP) only. A forward:
//   1. router, top-k and plan as at EP = 1, over this rank's tokens and all E experts; dispatch
//      permutes the slots into expert order, so the rows for rank p's experts are one block;
//   2. the per-expert row counts go to the experts' owners (an all_to_all of E/EP counts per
//      peer): each rank learns how many rows of each of its experts every peer sends;
//   3. ep_all_to_all (model/ops/ep_comm.h) sends each block to its owner; the rows arrive by
//      source rank, then local expert, then token;
//   4. a fixed permutation (moe_dispatch with a one-slot plan) regroups them by local expert, then
//      source rank, then token, and the grouped expert MLP runs over the E/EP local experts;
//   5. the inverse permutation, the reverse ep_all_to_all, and combine as at EP = 1.
// The backward mirrors it (each op's backward is the transposed exchange or permutation). An
// expert's rows are then the same rows, in the same order (source rank, token), that one process
// sees for the concatenated batch of the group, so the expert GEMMs and their weight gradients
// over one group's micro-batches are those of one process over the same rows. The gradients of a
// rank's experts cover every token of its EP group; the trainer sums them over the expert-data
// group (the ranks holding the same experts), while the router's, the shared experts' and every
// dense weight's reduce over all data ranks as before. The load counts stay per expert over all E
// (every rank counts its own tokens' choices), summed over the data ranks. The row counts are
// read on the host (CPU streams run at once), so the exchange sizes follow the routing: no
// capture (graphs.scope = "none"). On CUDA (over NCCL or IPC) that read is the known cost of
// EP > 1: each MoE layer's forward copies this rank's per-expert counts (the plan's E + 1
// offsets) to the host, which waits for the router and the plan, and the counts exchange of step 2
// goes through the device and back (ExpertParallelGroup stages host tensors), a second small
// wait; the rows themselves stay on the device and the backward reads nothing. Graphs are
// refused with EP > 1 on every device (trainer/config_moe.cc). Checkpoints hold every expert under
// its global name whatever EP is: the trainer gathers the EP ranks' experts to save, and each rank
// loads its own by name.
//
// Note [MoE on CUDA]
// fp32 or bf16 mixed precision (bf16 rows, the experts' bf16 shadows from
// Bf16Weights, fp32 main_grads). The forward never reads the device from the host: the router's
// choice, the plan (offsets), the grouped GEMMs' group sizes and the load counts stay on the GPU
// (Note [MoE plan on CUDA] in model/ops/moe_dispatch.h, Note [grouped GEMM on CUDA] in
// model/ops/grouped_linear_cuda.cu). Every buffer is sized by N, k, E, C and F alone ([N·k, ·]
// permuted rows), and nothing the host decides depends on the routing, so graphs capture the
// layer: the load counters advance at every replay, and the bias the update writes between steps
// stays at its address. What graphs cannot take is the balance loss, an output of the block
// beside its hidden state that the graph runner does not carry (trainer/config_moe.cc refuses
// graphs with aux_loss_weight > 0), and expert parallelism. The routing runs in fp32 (Note [fp32
// routing on CUDA] in model/ops/moe_router.h); the router bias is f32 on the device. The load
// counters are i32 [E] on the device, advanced by the plan kernel in grad mode; load(), stats()
// and update_bias() add them into the host counts (one small copy after the step, which waits
// for the step's kernels) and zero them. EP > 1 runs on CUDA with host reads of the counts
// (Note [expert parallelism]), so without graphs. Not built on CUDA: FP8 expert GEMMs, more than
// 512 experts.
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
#include "model/ops/ep_comm.h"
#include "model/ops/moe_dispatch.h"
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
  // This process's place in the expert-parallel group (Note [expert parallelism]): it holds the
  // experts [ep_rank·E/EP, (ep_rank + 1)·E/EP). ep_size divides E.
  int ep_size = 1;
  int ep_rank = 0;
};

// The checkpoint name of a routed expert's matrix: <layer>.experts.<e>.<matrix>.weight (Note [MoE
// layout]); `layer` is the MoE layer's name ("blocks.1.mlp"), `matrix` "gate_up" or "down".
std::string moe_expert_weight_name(const std::string& layer, int e, const std::string& matrix);
// `name` with its expert index e replaced by e + shift, for a name of that form; "" otherwise.
std::string moe_expert_shifted(const std::string& name, int shift);

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
  // The group the experts' rows travel over when dims().ep_size > 1 (Note [expert parallelism]);
  // REQUIRES before a forward at EP > 1, of size ep_size with this rank at ep_rank. Not owned.
  void set_expert_parallel(ExpertParallelGroup* group) { ep_ = group; }
  // Whether `name` is the weight of one of this layer's experts held by another EP rank.
  bool holds_elsewhere(const std::string& name) const;
  // The balance loss of the last forward (a scalar Var, weighted), then forgotten; undefined when
  // aux_loss_weight is 0 or no forward ran since.
  Var take_aux_loss();

  MoeLayerStats stats(int layer) const;
  // Note [router bias]: the sigmoid router's bias update (when rate > 0), then the load reset.
  void update_bias();
  void reset_load();
  // The slots each expert received since the last reset, [E]: data-parallel ranks sum theirs
  // before update_bias(), so every rank moves its bias the same way (Note [router bias]). On
  // CUDA, first adds the device counters in (waits for the queued kernels; Note [MoE on CUDA]).
  std::vector<int64_t>& load();
  // The router bias [E] in the model's dtype (state saved in checkpoints).
  Tensor& expert_bias() { return bias_; }
  const std::string& bias_name() const { return bias_name_; }
  const MoeDims& dims() const { return d_; }

 private:
  // The grouped expert MLP over rows in expert order: expert first_expert_ + g's rows are
  // [offsets[g], offsets[g + 1]).
  // With `gather`, `rows` are the layer's input in token order and the first product dispatches
  // them itself (grouped_linear_gathered).
  Var experts(const Var& rows, const Tensor& offsets, WeightAccess& w,
              const MoePlan* gather = nullptr);
  // Steps 2 to 5 of Note [expert parallelism]: xp in expert order -> the experts' outputs, in
  // the same order.
  Var exchange_experts(const Var& xp, const MoePlan& plan, WeightAccess& w);
  // CUDA: adds the device load counters into load_ and zeroes them (Note [MoE on CUDA]).
  void pull_load() const;

  MoeDims d_;
  std::string name_;                          // "blocks.<l>.mlp"
  int first_expert_ = 0;                      // ep_rank · E/EP
  ExpertParallelGroup* ep_ = nullptr;         // EP > 1
  LinearLayer router_;                        // [E, C], full precision
  std::vector<LinearLayer> gate_up_, down_;   // per held expert: [2F, C], [C, F]
  LinearLayer shared_gate_up_, shared_down_;  // [2·S·F, C], [C, S·F] when num_shared > 0
  Tensor bias_;                               // [E]
  std::string bias_name_;
  // [E] slots since the last reset (written by the plan's closure; on CUDA, pulled from load_dev_)
  mutable std::vector<int64_t> load_;
  mutable Tensor load_dev_;  // CUDA: i32 [E] on the device, advanced by the plan kernel
  Var aux_;                  // the last forward's balance loss
  Tensor last_aux_value_;    // the balance loss of the last forward in grad mode
};

}  // namespace gtron

// The GPT model, of one of two families (GPTConfig::arch), with D Multi-Token-Prediction depths
// (DeepSeek-V3) sharing the embedding, final norm and head:
// - gpt2: learned positions, pre-LN blocks, GELU-tanh MLP, final LayerNorm;
// - llama (Llama-3, Qwen2, Qwen3): RoPE, RMSNorm, grouped-query attention, SwiGLU, final RMSNorm
//   (model/llama.h); no position table.
// The output head is tied to the token embedding by default; the vocab is padded to a multiple of
// 64. The family is chosen once, at construction: each block is of one family.
//
// Loss = CE_main + (λ/D)·Σ_k CE_k. Depth k (1..D) at position t combines the previous depth's
// hidden state (k = 1: the main model's last hidden state, before the final norm) with the
// embedding of token t+k and predicts token t+k+1; positions whose target lies beyond the sampled
// window are masked.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "model/layers.h"
#include "model/llama.h"

namespace gtron {

enum class Arch { kGpt2, kLlama };

// train.recompute: what the backward re-forms instead of keeping from the forward. kSelective (CUDA
// bf16; the CPU and f32 paths keep everything): GPT-2's GELU outputs and ln1 rows, the llama
// family's SwiGLU and RMSNorm outputs — one elementwise pass each per block, the same bits (GPT-2's
// GELU output aside: Note [keeping g] in model/ops/fused_mlp.h). kFull (any device): Note [full
// recompute] in model/gpt.cc.
enum class Recompute { kNone, kSelective, kFull };

struct GPTConfig {
  Arch arch = Arch::kGpt2;
  int64_t vocab_size = 50257;     // V: real vocabulary
  int64_t context_length = 1024;  // Tmax: rows of the position table
  int n_layer = 12;               // L
  int n_head = 12;                // NH
  int64_t n_embd = 768;           // C
  int mtp_depth = 0;              // D
  double mtp_loss_weight = 0.3;   // λ
  bool tied_embeddings = true;
  double init_std = 0.02;
  // The llama family only (arch = kLlama); 0 means the default noted.
  int n_kv_head = 0;              // NKV (0: n_head); divides n_head
  int64_t head_dim = 0;           // HS (0: n_embd / n_head); even
  int64_t intermediate_size = 0;  // F, SwiGLU width (0: 8C/3 rounded up to a multiple of 64)
  double rope_theta = 500000;
  bool rope_llama3 = false;  // the llama3 rewrite of the RoPE frequencies, with these factors
  RopeLlama3Scaling rope_scaling;
  double rms_norm_eps = 1e-5;
  bool qk_norm = false;   // Qwen3: per-head RMSNorm of q and k before RoPE
  bool qkv_bias = false;  // Qwen2: biases on the q, k, v projections
  // This process's place in the tensor-parallel group: the split layers hold its part
  // (Note [tensor-parallel layout] in model/tensor_parallel.h).
  int tp_size = 1;
  int tp_rank = 0;
  bool tp_through_group = false;   // tests: the TP layers at tp_size 1 too (TpContext)
  bool sequence_parallel = false;  // Note [sequence parallelism]; needs tp_size > 1
  Recompute recompute = Recompute::kNone;
  // train.precision = "fp8": the block and MTP linears' products in FP8 (Note [fp8 recipe] in
  // model/ops/fp8.h); the embedding and head stay.
  bool fp8 = false;
  // The llama family's mixture-of-experts MLP (model/moe.h) in main blocks l >=
  // moe.first_dense_layers when moe.E > 0; in the MTP depths' blocks too with mtp_moe.
  MoeDims moe;
  bool mtp_moe = false;
  // Document masking (Note [document masking] in model/ops/segments.h): the token that opens a
  // document (data.document_masking; meta.json's doc_start_ids[0]); -1: none, every position
  // attends to the whole window before it.
  int32_t document_start = -1;

  int64_t padded_vocab() const { return (vocab_size + 63) / 64 * 64; }  // Vp
  bool llama() const { return arch == Arch::kLlama; }
  bool moe_block(int layer) const { return moe.E > 0 && layer >= moe.first_dense_layers; }
  // The llama family's block dimensions, defaults resolved.
  LlamaDims llama_dims() const;
};

struct GPTOutput {
  Var loss;                     // scalar: CE_main + (λ/D)·Σ_k CE_k (+ moe_aux_loss)
  Var main_loss;                // scalar CE of the next-token head
  std::vector<Var> mtp_losses;  // D scalars, CE_k of depth k (unweighted)
  // Σ over the MoE layers of their balance losses (weighted; model/ops/moe_router.h), in
  // `loss`; undefined without MoE or with moe.aux_loss_weight 0.
  Var moe_aux_loss;
};

class GPT {
 public:
  GPT(const GPTConfig& cfg, DType dtype, Device device, uint64_t seed);
  GPT(const GPT&) = delete;
  GPT& operator=(const GPT&) = delete;

  // window: i32 [B, T+1] tokens (inputs are [:, 0:T], next-token targets [:, 1:T+1]; MTP depth k
  // needs tokens up to t+k+1), on the CPU or on the model's CUDA device (then the shifted inputs
  // and targets are cut on the device, with no host copy). Records the backward on the tape when
  // grad mode is on.
  GPTOutput forward(const Tensor& window);
  // The training loop's promise (CUDA): backward of forward()'s `loss` is seeded with exactly this
  // f32 device scalar's value (read when the backward runs, e.g. backward_with(loss, seed)) and
  // nothing else adds gradient into the losses. The heads' cross-entropies then write their
  // gradient in the forward's pass over the logits (Note [one-pass cross-entropy] in
  // model/ops/loss.h); values and gradients are the same. A broken promise is caught on the
  // device (the gradient is rescaled to the one that arrived). An empty tensor withdraws it.
  void set_loss_seed(Tensor seed) { loss_seed_ = std::move(seed); }
  // Next-token logits [B, T, Vp] for i32 inputs [B, T] (no MTP; sampling). Runs without grad.
  // With config().document_start set, masked by documents as forward() is.
  Tensor logits(const Tensor& inputs);

  const GPTConfig& config() const { return cfg_; }
  const std::vector<Parameter*>& parameters() const { return params_.all(); }
  // The weights of the FP8 linears (GPTConfig::fp8; empty without it).
  const std::unordered_set<const Parameter*>& fp8_weights() const { return params_.fp8_weights(); }
  Parameter* find(const std::string& name) const { return params_.find(name); }
  int64_t num_parameters() const;
  // Training FLOPs per token for sequence length T: 6·N + 6·L'·C·T, N = weights entering GEMMs
  // (the head once per use), L' = main layers + MTP blocks (the attention term).
  double flops_per_token(int64_t T) const;

  // The TP group the split layers talk through (REQUIRES before a forward at TP > 1: its rank and
  // size are config().tp_rank and tp_size). Not owned.
  void set_tensor_parallel(TensorParallelGroup* group);
  const TpContext& tensor_parallel() const { return params_.tensor_parallel(); }
  // How p is split over TP (null: whole on every TP rank).
  const TpSlice* tp_slice(const Parameter* p) const { return params_.slice_of(p); }
  // A whole parameter whose gradient is a partial sum over TP
  // (ParamRegistry::mark_tp_partial_grad).
  bool tp_partial_grad(const Parameter* p) const { return params_.tp_partial_grad(p); }

  // The weight access seam (GTP). Default: DirectWeights. Not owned.
  void set_weight_access(WeightAccess* w) { weights_ = w ? w : &direct_; }
  WeightAccess& weight_access() { return *weights_; }

  // The block seam (graphs/, scope "layers"): when set, the trunk runs block l as
  // runner(l, x) instead of block_forward(l, x). The runner must compute what block_forward
  // does. Null restores the plain call.
  using BlockRunner = std::function<Var(int layer, const Var& x)>;
  void set_block_runner(BlockRunner runner) { block_runner_ = std::move(runner); }
  // Main-model block l: x [B, T, C] -> [B, T, C], through the weight access.
  Var block_forward(int layer, const Var& x);
  // The block's own forward, recorded on the tape as it is (block_forward without kFull).
  Var plain_block_forward(int layer, const Var& x);
  int num_blocks() const { return cfg_.n_layer; }

  // The modules, for code that runs them its own way (generation with key/value caches,
  // model/generate.h). Read directly, not through the weight access.
  const TransformerBlock& block(int layer) const;  // GPT-2 family only
  const LlamaBlock& llama_block(int layer) const;  // llama family only
  const MTPModule& mtp_module(int depth) const;    // depth k in 1..D
  const LayerNormLayer& final_norm() const;        // GPT-2 family only
  // The family's final norm (LayerNorm or RMSNorm) of hidden states h [..., C], without TP.
  Var final_norm_forward(const Var& h) const;
  Parameter& token_embedding() const { return *wte_; }  // [Vp, C]
  Parameter& position_embedding() const;                // [Tmax, C]; GPT-2 family only
  Parameter& output_head() const { return *head_; }     // [Vp, C]

  // Mixture of experts (GPTConfig::moe). The load and balance of each MoE layer since the last
  // update, in block order (empty for a dense model).
  std::vector<MoeLayerStats> moe_stats() const;
  // After each optimizer step: the sigmoid routers' bias update, then the load counts reset
  // (Note [router bias] in model/moe.h).
  void moe_update_bias();
  // The MoE layers' load counts since the last update, concatenated in block order ([E] each),
  // and their replacement (same length): data-parallel ranks sum them between the two.
  std::vector<int64_t> moe_load() const;
  void set_moe_load(const std::vector<int64_t>& load);
  // Model state that is not a parameter, by checkpoint name: the MoE router biases (the tensors
  // themselves: copy into them to restore). Empty for a dense model.
  std::vector<std::pair<std::string, Tensor>> buffers() const;
  // Expert parallelism (Note [expert parallelism] in model/moe.h): the group every MoE layer's
  // rows travel over (REQUIRES before a forward at moe.ep_size > 1). Not owned.
  void set_expert_parallel(ExpertParallelGroup* group);
  // The routed experts' weights this process holds (all of them at EP = 1).
  const std::unordered_set<const Parameter*>& routed_experts() const {
    return params_.routed_experts();
  }
  // Whether `name` is a routed expert's weight that another EP rank holds (a checkpoint's name
  // this process has no parameter for, yet belongs to the model).
  bool expert_held_elsewhere(const std::string& name) const;

 private:
  // inputs i32 [B, T] -> last hidden state [B, T, C] (before the final norm).
  Var trunk(const Tensor& inputs);
  // Document masking: the segment ids (and for GPT-2's trunk the positions) of `tokens`, the
  // inputs of depth k (0: the trunk), into this shape's buffers; documents_[k] points at them
  // until the next forward. Nothing without cfg_.document_start.
  void mark_documents(int depth, const Tensor& tokens);
  // Depth k's segment ids of the current forward (undefined without document masking).
  Tensor segments_of(int depth) const;
  Var embed(const Tensor& tokens);  // [B, T] -> [B, T, C] through the (maybe sharded) table
  Var head_input(const Var& h);     // [B, T, C] -> final norm (-> TP seam): the head's input
  Var head_logits(const Var& h);    // [B, T, C] -> final norm -> head -> [B, T, Vp] (TP: Vp/TP)
  // The weighted head's loss of h against targets: the blocked classifier where it applies
  // (model/ops/classifier.h), else head_logits then loss_of.
  Var head_loss(const Var& h, const Tensor& targets, double weight);
  // The (vocab-parallel) mean CE, whose total-loss weight is `weight` (1, or λ/D for a depth).
  Var loss_of(const Var& logits, const Tensor& targets, double weight);
  int64_t vocab_begin() const;  // first row of this rank's embedding/head part
  // The MoE layers, main blocks first, then the MTP depths', with their metric index (block l, or
  // n_layer + k − 1 for depth k).
  std::vector<std::pair<int, MoeLayer*>> moe_layers() const;

  GPTConfig cfg_;
  ParamRegistry params_;
  Parameter* wte_ = nullptr;              // [Vp, C] token embedding (rows >= V are zero)
  Parameter* wpe_ = nullptr;              // [Tmax, C]
  Parameter* head_ = nullptr;             // [Vp, C]: wte_ when tied
  std::vector<TransformerBlock> blocks_;  // gpt2
  std::vector<LlamaBlock> llama_blocks_;  // llama
  LayerNormLayer ln_f_;                   // gpt2
  RMSNormLayer norm_f_;                   // llama
  std::vector<MTPModule> mtp_;
  DirectWeights direct_;
  WeightAccess* weights_ = &direct_;
  BlockRunner block_runner_;
  Tensor loss_seed_;  // set_loss_seed(); empty: no promise
  // Document masking: i32 [B, T] segment ids and positions of one depth's rows.
  struct DocumentRows {
    Tensor seg, pos;
  };
  // Buffers by (depth, B, T), made once and never freed: a captured graph keeps reading the
  // addresses it saw at capture (Note [document masking] in model/ops/segments.h), which every
  // forward rewrites in place.
  std::map<std::tuple<int, int64_t, int64_t>, DocumentRows> document_buffers_;
  std::vector<DocumentRows> documents_;  // the current forward's, by depth
};

// Token tensors for one window (exposed for tests). All i32 [B, T], on the window's device.
Tensor window_inputs(const Tensor& window, int shift);   // x[:, t+shift], 0 past the window
Tensor window_targets(const Tensor& window, int shift);  // x[:, t+shift+1], kMaskedTarget past it

}  // namespace gtron

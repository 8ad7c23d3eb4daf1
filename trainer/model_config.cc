// gpt_config(): the model's GPTConfig from a validated trainer Config (trainer/model_config.h).
#include "trainer/model_config.h"

namespace gtron {

GPTConfig gpt_config(const Config& cfg) {
  GPTConfig g;
  g.vocab_size = cfg.model.vocab_size;
  g.context_length = cfg.model.context_length;
  g.n_layer = static_cast<int>(cfg.model.n_layer);
  g.n_head = static_cast<int>(cfg.model.n_head);
  g.n_embd = cfg.model.n_embd;
  g.mtp_depth = static_cast<int>(cfg.mtp.depth);
  g.mtp_loss_weight = cfg.mtp.loss_weight;
  g.tied_embeddings = cfg.model.tied_embeddings;
  g.init_std = cfg.model.init_std;
  const ModelConfig& m = cfg.model;
  g.arch = m.arch == ModelArch::kLlama ? Arch::kLlama : Arch::kGpt2;
  g.n_kv_head = static_cast<int>(m.n_kv_head);
  g.head_dim = m.head_dim;
  g.intermediate_size = m.intermediate_size;
  g.rope_theta = m.rope_theta;
  g.rope_llama3 = m.rope_scaling.type == RopeScalingType::kLlama3;
  g.rope_scaling.factor = m.rope_scaling.factor;
  g.rope_scaling.low_freq_factor = m.rope_scaling.low_freq_factor;
  g.rope_scaling.high_freq_factor = m.rope_scaling.high_freq_factor;
  g.rope_scaling.original_max_position_embeddings = m.rope_scaling.original_max_position_embeddings;
  g.rms_norm_eps = m.rms_norm_eps;
  g.qk_norm = m.qk_norm;
  g.qkv_bias = m.qkv_bias;
  g.fp8 = cfg.train.precision == PrecisionChoice::kFp8;
  const MoeConfig& moe = m.moe;
  if (moe.num_experts > 0) {
    g.moe.E = static_cast<int>(moe.num_experts);
    g.moe.top_k = static_cast<int>(moe.top_k);
    g.moe.num_shared = static_cast<int>(moe.num_shared_experts);
    g.moe.F = moe.expert_intermediate_size > 0 ? moe.expert_intermediate_size : g.llama_dims().F;
    g.moe.first_dense_layers = static_cast<int>(moe.first_dense_layers);
    g.moe.router =
        moe.router == MoeRouterChoice::kSigmoid ? MoeRouterKind::kSigmoid : MoeRouterKind::kSoftmax;
    g.moe.norm_topk_prob = moe.norm_topk_prob;
    g.moe.aux_loss_weight = moe.aux_loss_weight;
    g.moe.bias_update_rate = moe.bias_update_rate;
    g.mtp_moe = cfg.mtp.moe;
  }
  g.recompute = cfg.train.recompute == RecomputeChoice::kFull        ? Recompute::kFull
                : cfg.train.recompute == RecomputeChoice::kSelective ? Recompute::kSelective
                                                                     : Recompute::kNone;
  return g;
}

}  // namespace gtron

// Hugging Face transformers Qwen3MoeForCausalLM directories (config.json model_type
// "qwen3_moe"): what a mixture-of-experts llama (model/moe.h) adds to the Qwen3 conversion of
// trainer/hf_llama.h. Attention, norms, embedding and head are Qwen3's (q/k norms always on);
// the blocks' MLPs are gtron's MoE layers in the sparse layers and the dense SwiGLU in the rest.
//
// Note [Qwen3-MoE mapping]
//   config.json (Qwen3MoeConfig)        gtron config
//   num_experts (or num_local_experts)  model.moe.num_experts
//   num_experts_per_tok                 model.moe.top_k                   (<= num_experts)
//   moe_intermediate_size               model.moe.expert_intermediate_size
//   norm_topk_prob (absent: false)      model.moe.norm_topk_prob
//   decoder_sparse_step, mlp_only_layers  model.moe.first_dense_layers     (below)
//   intermediate_size                   model.intermediate_size           (the dense layers')
//   (fixed by the architecture)         model.qk_norm true, model.moe.router "softmax",
//                                       num_shared_experts 0, bias_update_rate 0
// Which layers are sparse: transformers makes layer l a mixture of experts when l is not in
// mlp_only_layers and (l + 1) % decoder_sparse_step == 0; gtron makes the layers
// l >= first_dense_layers one. Import computes transformers' set and takes it when it is the last
// L - k layers (first_dense_layers = k); any other set (every other layer, a dense layer after a
// sparse one) is refused naming both fields. No sparse layer at all (num_experts 0, or a step
// above num_hidden_layers) is a dense Qwen3 model. Export writes decoder_sparse_step 1 and
// mlp_only_layers [0, k).
//
// The router is the same function on both sides: transformers' softmax over all E logits (in
// fp32), the top-k probabilities, divided by their sum when norm_topk_prob, is gtron's softmax
// router (model/ops/moe_router.h). Only the order of the sums differs (transformers adds the
// experts' outputs expert by expert, gtron token by token in top-k order): logits agree to float
// rounding, not bit for bit. A tie between two router probabilities may pick another expert on
// each side (gtron: the lower index; torch.topk: unspecified); random weights never tie.
//
// Tensors, beside Note [llama names] (Hugging Face names under the prefix model.):
//   blocks.{i}.mlp.router.weight [E, C]             layers.{i}.mlp.gate.weight [E, C]
//   blocks.{i}.mlp.experts.{e}.gate_up.weight       layers.{i}.mlp.experts.{e}.gate_proj.weight,
//     [2·Fe, C]                                       .up_proj.weight [Fe, C] each (rows split)
//   blocks.{i}.mlp.experts.{e}.down.weight [C, Fe]  layers.{i}.mlp.experts.{e}.down_proj.weight
// That per-expert form is what the Hub's checkpoints hold and what export writes (transformers 4
// and 5 both load it). Import also reads the fused form transformers 5 keeps in memory,
// layers.{i}.mlp.experts.gate_up_proj [E, 2·Fe, C] (each expert's gate rows, then its up rows) and
// layers.{i}.mlp.experts.down_proj [E, C, Fe]: cut into the per-expert tensors before names are
// matched (unfuse_qwen3_moe_experts). A layer holding both forms is refused.
//
// Export refuses what Qwen3MoeForCausalLM cannot hold, naming the key: the sigmoid router (and
// its bias), shared experts, model.qk_norm false, model.qkv_bias true. Not converted either way:
// model.moe.aux_loss_weight, a training setting whose loss transformers defines otherwise
// (router_aux_loss_coef pools every layer's routing; gtron sums one loss per layer), so export
// leaves router_aux_loss_coef at transformers' default and import keeps the base config's weight.
// OLMoE (model_type "olmoe") is not read: its q/k norms span the whole projection, not one head.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "model/gpt.h"
#include "trainer/config.h"
#include "trainer/hf_weights.h"

namespace gtron {

// True for config.json's model_type "qwen3_moe".
bool is_qwen3_moe_type(const nlohmann::ordered_json& model_type);

// The model.moe keys of a Qwen3-MoE config.json (`j`, read from `path`) of `n_layer` layers (Note
// [Qwen3-MoE mapping]); {"num_experts": 0} when no layer is sparse. Throws UserError naming the
// config.json field.
nlohmann::ordered_json qwen3_moe_keys(const nlohmann::ordered_json& j, const std::string& path,
                                      int64_t n_layer);

// Note [config.json sizes against the tensors] for the mixture of experts of `moe` (the result of
// qwen3_moe_keys; nothing when num_experts is 0) of config.json at `path`:
// num_experts against the rows of the first sparse layer's mlp.gate.weight, moe_intermediate_size
// against its expert 0's gate_proj rows (or half the fused gate_up_proj's dim 1).
void check_qwen3_moe_sizes(const nlohmann::ordered_json& moe, const HfHeaders& h,
                           const std::string& path);

// Replaces transformers 5's fused expert tensors of `hf` (read from `file`) by the per-expert ones
// they hold (views of the same storage). E, Fe, C: the config's sizes, which a fused tensor must
// match exactly. Throws UserError naming a mis-shaped fused tensor, or a layer holding both forms.
void unfuse_qwen3_moe_experts(std::map<std::string, Tensor>& hf, int64_t E, int64_t Fe, int64_t C,
                              const std::string& file);

// Refuses (UserError naming the key) a mixture-of-experts config of the checkpoint at
// `checkpoint_dir` that Qwen3MoeForCausalLM cannot hold; before any weight is read.
void check_qwen3_moe_export(const Config& cfg, const std::string& checkpoint_dir);
// Refuses a model (its weights loaded from `checkpoint_dir`) with a nonzero router bias, which the
// export would lose.
void check_qwen3_moe_bias(const GPT& model, const std::string& checkpoint_dir);

// Turns `j`, the llama_hf_config of a Qwen3 model, into Qwen3MoeForCausalLM's config.json.
void add_qwen3_moe_config(const Config& cfg, nlohmann::ordered_json& j);

}  // namespace gtron

// Hugging Face transformers llama-family directories (LlamaForCausalLM, Qwen2ForCausalLM,
// Qwen3ForCausalLM, and Qwen3MoeForCausalLM for a mixture of experts: trainer/hf_qwen3_moe.h): the
// parts of `gtron export --hf` and `gtron import --hf` that differ from GPT-2's. The directory
// layout, gtron.json, mtp.safetensors, atomic writes and the bit-exact fp32 contract are GPT-2's
// (trainer/hf_gpt2.h); trainer/hf_gpt2.cc dispatches here by model.arch on export and by
// config.json's model_type on import.
//
//   config.json  model_type "llama", or "qwen3" when model.qk_norm, "qwen2" when model.qkv_bias,
//                "qwen3_moe" when model.moe.num_experts > 0 (Note [Qwen3-MoE mapping]);
//                hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
//                num_key_value_heads, head_dim, rms_norm_eps, rope_theta, rope_scaling (llama3 or
//                null), max_position_embeddings (context_length), vocab_size (the real V),
//                tie_word_embeddings, attention_bias (qkv_bias), torch_dtype "float32"
//
// Export writes exactly that (fp32, one model.safetensors, the older rope_theta + rope_scaling).
// Import reads more of what transformers writes:
//   - weights in F32, BF16 or F16, mixed freely, each value widened exactly to fp32; any other
//     dtype (F64, integer, quantized) is refused naming the tensor (trainer/io/safetensors.h);
//   - one model.safetensors or a sharded checkpoint, model.safetensors.index.json with its shards
//     (Note [sharded Hugging Face checkpoints] in trainer/hf_weights.h; both at once is refused);
//   - RoPE as rope_theta + rope_scaling, or as transformers 5's rope_parameters, or both when they
//     agree (Note [llama RoPE fields] in hf_llama.cc); rope_type "default" or "llama3" only.
// Every refusal is a UserError naming the file, field or tensor; nothing is written.
//
// Note [llama names]
//   gtron (checkpoint)                       Hugging Face (model.safetensors, prefix model.)
//   wte.weight [Vp, C]                       embed_tokens.weight [V, C]             rows < V
//   blocks.{i}.attn_norm.weight [C]          layers.{i}.input_layernorm.weight
//   blocks.{i}.attn.qkv.weight               layers.{i}.self_attn.{q,k,v}_proj.weight  rows split
//     [(NH + 2·NKV)·HS, C]                     [NH·HS, C], [NKV·HS, C], [NKV·HS, C]
//   blocks.{i}.attn.qkv.bias (qkv_bias)      layers.{i}.self_attn.{q,k,v}_proj.bias    split
//   blocks.{i}.attn.{q,k}_norm.weight [HS]   layers.{i}.self_attn.{q,k}_norm.weight (qk_norm)
//   blocks.{i}.attn.proj.weight [C, NH·HS]   layers.{i}.self_attn.o_proj.weight
//   blocks.{i}.mlp_norm.weight [C]           layers.{i}.post_attention_layernorm.weight
//   blocks.{i}.mlp.gate_up.weight [2F, C]    layers.{i}.mlp.{gate,up}_proj.weight [F, C] split
//   blocks.{i}.mlp.down.weight [C, F]        layers.{i}.mlp.down_proj.weight
//   norm_f.weight [C]                        norm.weight
//   lm_head.weight [Vp, C] (untied)          lm_head.weight [V, C] (no prefix)      rows < V
// Every matrix is nn.Linear's [out, in] on both sides: nothing is transposed, only rows are cut
// (Note [packed llama projections]). Import refuses a tensor it has no place for, except the
// lm_head.weight of a tied model (transformers may save the tied copy).
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/gpt.h"
#include "trainer/config.h"
#include "trainer/hf_weights.h"
#include "trainer/io/safetensors.h"

namespace gtron {

// The model.safetensors tensors (Hugging Face names) of a llama-family model's main parameters
// (everything but mtp.*). V: the real vocabulary. Throws UserError on a nonzero padded row.
std::vector<NamedTensor> llama_hf_tensors(GPT& model, int64_t V);

// config.json of a llama-family config (Qwen3MoeForCausalLM's for a mixture of experts).
nlohmann::ordered_json llama_hf_config(const Config& cfg);

// True for the model_types import reads as the llama family.
bool is_llama_model_type(const nlohmann::ordered_json& model_type);

// Checks config.json (`j`, read from `path`) and returns the gtron model.* keys it fixes. Throws
// UserError naming the config.json field.
nlohmann::ordered_json llama_model_keys(const nlohmann::ordered_json& j, const std::string& path);

// Note [config.json sizes against the tensors] (trainer/hf_weights.h) for `keys`, the result of
// llama_model_keys for config.json at `path`: vocab_size and hidden_size against
// model.embed_tokens.weight [V, C]; num_hidden_layers against the layers model.layers.{i};
// num_attention_heads × head_dim, num_key_value_heads × head_dim and intermediate_size against
// the rows of layer 0's q_proj, k_proj and gate_proj. max_position_embeddings, which no tensor
// holds, has the bound only. Throws UserError naming the field and the tensor.
void check_llama_sizes(const nlohmann::ordered_json& keys, const HfHeaders& h,
                       const std::string& path);

// Fills every main (non-MTP) parameter of `model` from `hf` (names as stored in `file`). Throws
// UserError naming a missing, mis-shaped or extra tensor.
// A Qwen3-MoE model's experts may come fused (unfuse_qwen3_moe_experts in trainer/hf_qwen3_moe.h).
void fill_llama_model(GPT& model, std::map<std::string, Tensor> hf, const std::string& file);

// Shared with hf_gpt2.cc: rows < V of a [Vp, C] table (refusing nonzero padded rows, which the
// export would lose), and the way back (padded rows zero).
Tensor vocab_rows_to_hf(const std::string& name, const Tensor& t, int64_t V);
void vocab_rows_from_hf(const Tensor& hf, Tensor& dst);

}  // namespace gtron

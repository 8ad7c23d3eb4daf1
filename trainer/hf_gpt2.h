// Hugging Face transformers GPT-2 directories (GPT2LMHeadModel): `gtron export` and `gtron import`;
// the llama family dispatches from here to trainer/hf_llama.h.
//
//   OUT/
//     config.json        GPT2Config: model_type "gpt2", n_layer, n_head, n_embd, n_positions,
//                        vocab_size (the real vocabulary V, not the padded Vp), layer_norm_epsilon
//                        1e-5, activation_function "gelu_new", tie_word_embeddings as trained
//     model.safetensors  GPT-2's names and layout (Note [GPT-2 names]); metadata "format": "pt",
//                        which transformers requires of a safetensors file
//     mtp.safetensors    the MTP depths under gtron's names (GPT-2 has no place for them); only
//                        when mtp.depth > 0
//     gtron.json         {"format": "gtron-hf", "version": 1, "step", "seed", "config"}: the
//                        resolved gtron config and step of the checkpoint, so that import gives
//                        the same checkpoint back; transformers ignores the file
//     tokenizer.json     copied from the checkpoint when it has one
//
// Both directions are pure data conversions: fp32 in, fp32 out, every value bit-exact (rows are
// cut or zero-padded, matrices transposed; nothing is computed). Import also reads BF16 and F16
// weights (widened exactly) and sharded checkpoints, for both families (trainer/hf_weights.h).
// Optimizer state stays in gtron checkpoints: an imported checkpoint has weights only (train
// --init starts from it).
//
// Note [GPT-2 names]
//   gtron (checkpoint)                GPT-2 (model.safetensors)              conversion
//   wte.weight [Vp, C]                transformer.wte.weight [V, C]          rows < V
//   wpe.weight [Tmax, C]              transformer.wpe.weight [Tmax, C]       as is
//   blocks.{i}.ln1.{weight,bias}      transformer.h.{i}.ln_1.{weight,bias}   as is
//   blocks.{i}.attn.qkv.weight [3C,C] transformer.h.{i}.attn.c_attn.weight   transposed [C, 3C]
//   blocks.{i}.attn.proj.weight       transformer.h.{i}.attn.c_proj.weight   transposed
//   blocks.{i}.ln2.{weight,bias}      transformer.h.{i}.ln_2.{weight,bias}   as is
//   blocks.{i}.mlp.fc.weight [4C, C]  transformer.h.{i}.mlp.c_fc.weight      transposed [C, 4C]
//   blocks.{i}.mlp.proj.weight        transformer.h.{i}.mlp.c_proj.weight    transposed [4C, C]
//   blocks.{i}.*.bias                 the same GPT-2 module's .bias          as is
//   ln_f.{weight,bias}                transformer.ln_f.{weight,bias}         as is
//   lm_head.weight [Vp, C] (untied)   lm_head.weight [V, C]                  rows < V
// GPT-2's Conv1D stores [in, out] (gtron, like nn.Linear, [out, in]); lm_head is an nn.Linear.
// The [q | k | v] packing of c_attn, heads in column blocks of C/NH, is gtron's own. The padded
// vocabulary rows are zero in every gtron checkpoint (export refuses one where they are not) and
// are zero again after import.
//
// Import reads names with or without the "transformer." prefix (OpenAI's files on the Hub have
// none), skips the causal-mask buffers older files carry (h.{i}.attn.bias, h.{i}.attn.masked_bias)
// and a lm_head.weight of a tied model (transformers ties it to wte too), and refuses any other
// tensor it has no place for.
#pragma once

#include <string>
#include <vector>

namespace gtron {

// Writes the GPT-2 (or, for model.arch "llama", the llama-family: trainer/hf_llama.h) directory
// `out_dir` (must not exist; written atomically) from the verified gtron checkpoint directory
// `checkpoint_dir`. Throws UserError.
// config_path "" takes the checkpoint's config (trainer_state.json); a file must match its model.
// `sets` apply on top either way.
void export_hf(const std::string& checkpoint_dir, const std::string& out_dir,
               const std::string& config_path = "", const std::vector<std::string>& sets = {});

struct HfImportOptions {
  std::string hf_dir;             // a GPT-2 or llama-family directory (config.json, ...)
  std::string out_dir;            // the gtron checkpoint directory to write (must not exist)
  std::string config_path;        // gtron config for the keys config.json lacks; "" = gtron.json's
                                  // config when present, else the defaults
  std::vector<std::string> sets;  // --set overrides, applied after that config
};

// Reads a GPT-2 directory into a gtron checkpoint directory (MANIFEST.json, model.safetensors,
// trainer_state.json; no optimizer state). The model.* shape keys (vocab_size, context_length,
// n_layer, n_head, n_embd, tied_embeddings) come from config.json; the MTP depths 1..mtp.depth from
// mtp.safetensors when it holds them, else freshly initialized from train.seed. A model_type of
// "llama", "qwen2", "qwen3" or "qwen3_moe" is read as the llama family (trainer/hf_llama.h,
// trainer/hf_qwen3_moe.h); anything but a
// GPT-2 architecture otherwise is refused naming the config field that differs. config.json's
// sizes are checked against the safetensors headers before the model is built (Note [config.json
// sizes against the tensors] in trainer/hf_weights.h). Throws UserError.
// Returns a one-line summary of what was imported.
std::string import_hf(const HfImportOptions& options);

}  // namespace gtron

// The weights of a Hugging Face directory for `gtron import --hf`: one model.safetensors, or a
// sharded checkpoint (model.safetensors.index.json and the shard files it names), every tensor
// widened exactly to fp32 (read_safetensors_f32: F32, BF16 and F16 are read, any other dtype is
// refused naming the tensor).
//
// Note [sharded Hugging Face checkpoints]
//   save_pretrained() splits a large model into DIR/model-00001-of-0000N.safetensors, ... and
//   writes DIR/model.safetensors.index.json:
//     {"metadata": {"total_size": ...}, "weight_map": {"<tensor name>": "<shard file name>", ...}}
//   The import reads every shard the weight_map names and takes the union of their tensors. The
//   index and the shards must agree exactly, else the import is refused naming the file and the
//   tensor (UserError, exit code 2, before anything is written):
//   - the index is not valid JSON, not an object, or has no non-empty weight_map of strings;
//   - a shard file name is empty, ".", "..", or holds a path separator ('/' or '\'): shards live
//     in DIR itself, and a name must not reach outside it;
//   - a shard the index names is missing;
//   - a tensor the index maps to a shard is not in that shard;
//   - a shard holds a tensor that the index does not map to that shard (an unmapped tensor, or
//     one mapped to another shard: a tensor is never read twice).
//   metadata (total_size and anything else) is not checked: the shard files' own headers are.
//   Files in DIR that the index does not name are ignored. A directory holding both
//   model.safetensors and the index is refused: save_pretrained writes one or the other, so one of
//   them is a stale leftover, and guessing which would import the wrong weights silently.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "trainer/io/safetensors.h"

namespace gtron {

struct HfWeights {
  std::vector<NamedTensor> tensors;  // f32, names as stored; unique across shards
  std::string source;  // the file messages name: DIR/model.safetensors or DIR/<the index>
};

// Reads the weights of the Hugging Face directory `dir` (Note [sharded Hugging Face checkpoints]).
// Throws UserError naming the file, the field or the tensor that is wrong.
HfWeights read_hf_weights(const std::string& dir);

struct HfHeaders {
  std::map<std::string, Shape> shapes;  // every tensor's shape by name as stored
  std::string source;                   // as HfWeights::source
};

// The shapes read_hf_weights would load, from the safetensors headers alone (every check of
// read_hf_weights but the data's CRC; no tensor is allocated): what import checks config.json's
// sizes against before it builds a model from them. Throws UserError as read_hf_weights does.
HfHeaders read_hf_headers(const std::string& dir);

// Note [config.json sizes against the tensors]
//   Import builds the model config.json describes before it reads a weight, so a size there
//   could ask for any amount of memory. Every size is checked first, against a bound and against
//   the safetensors headers (read_hf_headers: shapes only, nothing allocated):
//   - each is a positive integer at most kMaxHfConfigSize;
//   - each is at most the dimension of the tensor that holds it (trainer/hf_gpt2.cc and
//     trainer/hf_llama.cc list which), and a count of layers at most the layers the files hold;
//     a size that no tensor holds (llama's max_position_embeddings) has the bound only.
//   A refusal is a UserError naming config.json, the field, its value and the tensor. A size
//   smaller than its tensor passes here and is refused by the shape check that follows, naming
//   the tensor and both shapes. So no size the model is built with exceeds what the files' own
//   headers say, whatever config.json says.

// Sizes in config.json above this are refused whatever the tensors say: gtron's token ids are
// int32, and no released model has a size near it.
inline constexpr int64_t kMaxHfConfigSize = 2147483647;  // 2^31 - 1

// config.json's (`j`, read from `path`) size `field`: a positive integer at most
// kMaxHfConfigSize, else a UserError naming the file, the field and its value (or "missing").
int64_t hf_config_size(const nlohmann::ordered_json& j, const std::string& path, const char* field);

// Refuses (Note [config.json sizes against the tensors]) `field` of `config` (its path) with value
// `value` when it exceeds dimension `dim` of the tensor stored as `tensor`, or the files do not
// hold that tensor.
void check_size_against_tensor(const HfHeaders& h, const std::string& config,
                               const std::string& field, int64_t value, const std::string& tensor,
                               int dim);

// The same for `field`, a count of layers: at most the distinct i of the tensor names that start
// with one of `prefixes` + i + "." (e.g. "model.layers.").
void check_layers_against_tensors(const HfHeaders& h, const std::string& config,
                                  const std::string& field, int64_t value,
                                  const std::vector<std::string>& prefixes);

}  // namespace gtron

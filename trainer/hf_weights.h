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

}  // namespace gtron

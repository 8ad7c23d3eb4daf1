// Training checkpoints: what goes into a checkpoint directory and how it comes back.
//
//   model.safetensors      every parameter by its documented name, fp32, full (unsharded) and in
//                          PyTorch layout (linear weights [out, in]); a tied head is stored once;
//                          the model's buffers too (GPT::buffers: the MoE router biases)
//   optimizer.safetensors  AdamW moments "m.<name>" and "v.<name>", full, fp32; metadata t
//   trainer_state.json     {"step", "optimizer_steps", "seed", "config": <resolved config>}
//   tokenizer.json         the data's BPE tokenizer (only for data prepared with one)
//   MANIFEST.json          sizes and CRC32 of the files above (trainer/io/checkpoint_io.h)
//
// Everything is stored unsharded, so a checkpoint loads into any DP × GTP layout. The data
// position needs no state: batches are a function of (seed, step). Directories are written
// atomically by save_checkpoint_dir(); a partial or corrupt one is never loaded.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "model/gpt.h"
#include "trainer/io/safetensors.h"
#include "trainer/text/tokenizer.h"

namespace gtron {

struct TrainerState {
  int64_t step = 0;             // optimizer steps completed
  int64_t optimizer_steps = 0;  // AdamW's t
  uint64_t seed = 0;
  std::string config_json;     // resolved config of the run that wrote it
  std::string tokenizer_json;  // the data's tokenizer.json; empty for byte-level/synthetic data
};

// Writes full parameters, full moments ("m.<name>", "v.<name>"; empty = no optimizer file) and
// trainer state for `state.step` under `root`, keeping the newest `keep`. Returns the directory.
std::string save_training_checkpoint(const std::string& root,
                                     const std::vector<NamedTensor>& params,
                                     const std::vector<NamedTensor>& moments,
                                     const TrainerState& state, int keep);

// Writes a checkpoint without optimizer state as the folder `dir` itself (gtron import): atomic,
// with MANIFEST.json; `extra_files(tmp_dir)`, when set, adds files (tokenizer.json) before the
// manifest. Throws UserError when `dir` exists.
void save_weights_checkpoint(const std::string& dir, const std::vector<NamedTensor>& params,
                             const TrainerState& state,
                             const std::function<void(const std::string& tmp_dir)>& extra_files);

// Reads trainer_state.json of a verified checkpoint directory. Throws UserError.
TrainerState read_trainer_state(const std::string& dir);

struct CheckpointTensors {
  std::map<std::string, Tensor> params;   // by parameter name
  std::map<std::string, Tensor> moments;  // "m.<name>", "v.<name>"
  int64_t optimizer_steps = 0;
};
// The tokenizer a verified checkpoint carries, or nullopt (byte-level). Throws UserError.
std::optional<Tokenizer> read_checkpoint_tokenizer(const std::string& dir);

// Reads the tensors of a checkpoint directory (moments only when `with_optimizer`).
CheckpointTensors read_checkpoint_tensors(const std::string& dir, bool with_optimizer);

// The tensor `name` of `tensors` (read from `file`), checked against the expected shape; a missing
// tensor or a shape mismatch is a UserError naming the tensor, the file and both shapes.
const Tensor& checked_tensor(const std::map<std::string, Tensor>& tensors, const std::string& name,
                             const Shape& shape, const std::string& file);

// Loads every parameter of an unsharded model, and its buffers (GPT::buffers: the MoE router
// biases; eval, sample). Throws UserError.
void load_model_weights(const std::string& dir, GPT& model);

}  // namespace gtron

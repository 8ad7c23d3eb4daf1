// Checks that run before any work (Note [preflight]), and the config a checkpoint command uses.
//
// Note [preflight]
// `gtron train` calls preflight_train() once, before the Run is built, on every rank. It reads and
// checks everything the run will touch — the config against the world size, every train and val
// shard (header, size, token ids, one window), the data's tokenizer, the folders it will write,
// what an earlier run left in the run folder, the checkpoint --resume or --init will read, and the
// memory the model needs on the CPU — and throws UserError (exit code 2) on the first problem,
// with nothing created or changed: no run folder, no metrics.jsonl, no checkpoint folder.
// Only after every check has passed does global rank 0 change anything, and only what the flags
// ask for: --overwrite deletes the earlier run's checkpoints and metrics file, and leftover
// temporary checkpoint folders (interrupted saves, incomplete by construction) are removed, each
// with a console line.
#pragma once

#include <string>
#include <vector>

#include "trainer/config.h"

namespace gtron {

struct TrainFlags {
  bool resume = false;     // --resume: continue from the newest complete checkpoint, if any
  bool overwrite = false;  // --overwrite: delete the earlier run's checkpoints and metrics first
  std::string init;        // --init: a checkpoint whose weights start the run ("" = none)
};

// Note [preflight]. `world_size` and `rank` are the launcher's (1 and 0 for one process).
void preflight_train(const Config& cfg, const TrainFlags& flags, int world_size, int rank);

// The first key that fixes the model's tensors and differs between a checkpoint's config and
// `cfg`, as "model.n_embd: checkpoint 64, config 128"; "" when they agree. model.vocab_size
// counts as different only when its padded size differs (the tensors have padded rows).
std::string model_difference(const Config& checkpoint, const Config& cfg);

// The config of a checkpoint command (eval, sample, logits, export): the checkpoint's own
// (trainer_state.json holds the resolved config) when `config_path` is "", else the file; `sets`
// apply on top either way. With a file, its model must match the checkpoint's (UserError naming
// the key otherwise). REQUIRES: verify_checkpoint_dir(checkpoint) passed.
Config checkpoint_command_config(const std::string& command, const std::string& checkpoint,
                                 const std::string& config_path,
                                 const std::vector<std::string>& sets);

// Refuses (UserError naming the keys) a model whose fp32 weights — with `training`, also the
// gradients, the AdamW moments and the activations of one micro-batch — plus `extra_bytes` need
// more memory than this machine (or its cgroup) has. For CPU processes only.
void check_cpu_memory(const Config& cfg, bool training, double extra_bytes,
                      const std::string& what);

}  // namespace gtron

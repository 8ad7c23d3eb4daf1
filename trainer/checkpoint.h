// Training checkpoints: what goes into a checkpoint directory and how it comes back.
//
//   model.safetensors      every parameter by its documented name, fp32, PyTorch layout
//                          (linear weights [out, in]); a tied head is stored once (wte.weight)
//   optimizer.safetensors  AdamW moments "m.<name>" and "v.<name>", fp32
//   trainer_state.json     {"step", "optimizer_steps", "seed", "config": <resolved config>}
//   MANIFEST.json          sizes and CRC32 of the files above (trainer/checkpoint_io.h)
//
// The data position needs no state: batches are a function of (seed, step). Directories are written
// atomically by save_checkpoint_dir(); a partial or corrupt one is never loaded.
#pragma once

#include <cstdint>
#include <string>

#include "model/gpt.h"
#include "parallel/ddp.h"

namespace gtron {

struct TrainerState {
  int64_t step = 0;             // optimizer steps completed
  int64_t optimizer_steps = 0;  // AdamW's t (equal to step unless a run skipped updates)
  uint64_t seed = 0;
  std::string config_json;  // resolved config of the run that wrote it
};

// AdamW moments in the full flat layout of a DataParallel (every parameter at
// layout.flat_offset(p)); the same on every rank, whatever the DP size.
struct FullOptimizerState {
  Tensor m, v;  // [layout.flat_numel()]
  const parallel::DataParallel* layout = nullptr;
};

// Writes model, optimizer and trainer state for `state.step` under `root`, keeping the newest
// `keep`. Returns the directory written. REQUIRES: parameters gathered (ensure_all_ready).
std::string save_training_checkpoint(const std::string& root, const GPT& model,
                                     const FullOptimizerState* opt, const TrainerState& state,
                                     int keep);

// Reads trainer_state.json of a verified checkpoint directory. Throws UserError.
TrainerState read_trainer_state(const std::string& dir);

// Loads parameters (and, when `opt` is non-null, the moments into opt->m/v, which must be allocated
// in opt->layout's flat layout) from a verified checkpoint dir; returns AdamW's step count. Every
// model parameter must be present with the same shape: a mismatch names the tensor and both
// shapes. Throws UserError.
int64_t load_training_checkpoint(const std::string& dir, GPT& model, FullOptimizerState* opt);

}  // namespace gtron

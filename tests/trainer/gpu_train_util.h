// Shared set-up of the trainer-level GPU tests: a tiny config on the synthetic Markov source,
// trained in-process by run_training() on the CPU or the GPU.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trainer/config.h"
#include "trainer/train.h"

namespace gtron::testing {

// A fresh, empty directory under TEST_TMPDIR (or /tmp when run outside Bazel).
std::string fresh_dir(const std::string& name);

// The tiny config (V = 16, L = 2, C = 64, NH = 4, MTP D = 1, T = 32, 16 sequences a step in two
// micro-batches of 8) for `steps` steps on `device` ("cpu" | "cuda") at `precision`, logging every
// `log_every` steps, writing under `out_dir`; a checkpoint at the end only; a cosine schedule
// warming up over min(10, steps) steps. `extra_sets` (key=value) come last and override.
Config tiny_train_config(const std::string& out_dir, const std::string& device,
                         const std::string& precision, int64_t steps, int64_t log_every,
                         const std::vector<std::string>& extra_sets = {});

// Trains `cfg` from scratch; EXPECTs exit code 0 and returns the summary.
TrainSummary train_ok(const Config& cfg);

// train_ok() as rank 0 of a world of one on the multi-process path: the torchrun variables (a
// fresh MASTER_PORT per call) and GTRON_TEST_GRID_OF_ONE = `mode` ("1", "gtp" or "tp"), unset
// afterwards.
TrainSummary train_on_grid_of_one(const Config& cfg, const char* mode);

}  // namespace gtron::testing

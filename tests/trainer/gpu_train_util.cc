#include "tests/trainer/gpu_train_util.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace gtron::testing {

std::string fresh_dir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(base ? base : "/tmp") + "/gtron_gpu_" + name;
  const int rc = std::system(("rm -rf '" + dir + "' && mkdir -p '" + dir + "'").c_str());
  EXPECT_EQ(rc, 0) << dir;
  return dir;
}

Config tiny_train_config(const std::string& out_dir, const std::string& device,
                         const std::string& precision, int64_t steps, int64_t log_every,
                         const std::vector<std::string>& extra_sets) {
  const std::string json = R"({
    "model": {"vocab_size": 16, "context_length": 32, "n_layer": 2, "n_head": 4, "n_embd": 64},
    "mtp": {"depth": 1},
    "data": {"synthetic": {"order": 2, "vocab": 16, "alpha": 0.2, "bigram": 0.0, "tokens": 100000,
                           "val_tokens": 10000}},
    "optimizer": {"lr": 3e-3, "weight_decay": 0.0},
    "schedule": {"kind": "cosine"},
    "train": {"global_batch": 16, "micro_batch": 8, "seq_len": 32, "eval_batches": 2},
    "checkpoint": {"every": 0}
  })";
  // Ten warmup steps, or all of a shorter run's (validate() refuses more warmup than steps); the
  // runs of 10 steps or more keep the schedule their losses were recorded with.
  const int64_t warmup = std::min<int64_t>(10, steps);
  std::vector<std::string> sets = {"train.steps=" + std::to_string(steps),
                                   "schedule.warmup_steps=" + std::to_string(warmup),
                                   "train.device=" + device,
                                   "train.precision=" + precision,
                                   "train.out_dir=" + out_dir,
                                   "log.every=" + std::to_string(log_every)};
  sets.insert(sets.end(), extra_sets.begin(), extra_sets.end());
  return config_from_json_text(json, sets, "tiny GPU test config");
}

TrainSummary train_ok(const Config& cfg) {
  TrainSummary s;
  EXPECT_EQ(run_training(cfg, /*resume=*/false, &s), kExitOk);
  EXPECT_EQ(static_cast<int64_t>(s.losses.size()), cfg.train.steps);
  return s;
}

TrainSummary train_on_grid_of_one(const Config& cfg, const char* mode) {
  static int port = 31000 + static_cast<int>(getpid() % 4000);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", std::to_string(++port).c_str(), 1);
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "1", 1);
  setenv("LOCAL_RANK", "0", 1);
  setenv("LOCAL_WORLD_SIZE", "1", 1);
  setenv("GROUP_RANK", "0", 1);
  setenv("GTRON_TEST_GRID_OF_ONE", mode, 1);
  TrainSummary s = train_ok(cfg);
  unsetenv("GTRON_TEST_GRID_OF_ONE");
  return s;
}

}  // namespace gtron::testing

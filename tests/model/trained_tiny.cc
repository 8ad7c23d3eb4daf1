#include "tests/model/trained_tiny.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cstdlib>

#include "trainer/config.h"
#include "trainer/data/shards.h"
#include "trainer/io/checkpoint.h"
#include "trainer/train.h"

namespace gtron::testing {
namespace {

const char kConfig[] = R"({
  "model": {"vocab_size": 16, "context_length": 256, "n_layer": 2, "n_head": 2, "n_embd": 32},
  "mtp": {"depth": 2},
  "data": {"synthetic": {"order": 2, "vocab": 16, "alpha": 0.2, "tokens": 200000,
                         "val_tokens": 5000}},
  "optimizer": {"lr": 3e-3, "weight_decay": 0.0},
  "schedule": {"warmup_steps": 20},
  "train": {"steps": 400, "global_batch": 8, "micro_batch": 8, "seq_len": 64, "device": "cpu"},
  "log": {"every": 200}
})";

std::string run_dir() {
  const char* base = std::getenv("TEST_TMPDIR");
  return std::string(base ? base : "/tmp") + "/gtron_trained_tiny_mtp2";
}

std::unique_ptr<GPT> train_and_load() {
  const std::string dir = run_dir();
  EXPECT_EQ(std::system(("rm -rf '" + dir + "'").c_str()), 0);
  const Config cfg = config_from_json_text(kConfig, {"train.out_dir=" + dir}, "tiny MTP D=2");
  EXPECT_EQ(run_training(cfg, /*resume=*/false), kExitOk);
  auto model = std::make_unique<GPT>(gpt_config(cfg), DType::kF32, Device::cpu(), 1);
  load_model_weights(dir + "/checkpoints/step_00000400", *model);
  return model;
}

}  // namespace

GPT& trained_tiny_mtp2() {
  // One OpenMP thread for the whole test process: a model this small gains nothing from more,
  // and on a machine whose cores are shared (CI) every OpenMP barrier can cost a time slice, a
  // hundredfold slowdown. The kernels give the same bits whatever the thread count.
  static const bool one_thread = [] {
    omp_set_num_threads(1);
    return true;
  }();
  (void)one_thread;
  static std::unique_ptr<GPT> model = train_and_load();
  return *model;
}

std::vector<int32_t> source_tokens(int64_t first, int64_t n) {
  trained_tiny_mtp2();  // writes the source
  ShardSet val(run_dir() + "/data/val_*.bin", 16);
  const std::vector<uint32_t>& t = val.tokens(0);
  EXPECT_GE(static_cast<int64_t>(t.size()), first + n);
  return std::vector<int32_t>(t.begin() + first, t.begin() + first + n);
}

}  // namespace gtron::testing

// A steady-state GPU training step makes no backend allocation: the CUDA caching allocator's miss
// count and reserved bytes, logged by the trainer in metrics.jsonl on every step, do not change
// from step 3 on (steps 1-2 fill the caches: shadows, optimizer tables, activations); with
// train.transient_grads too.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/device.h"
#include "tests/trainer/gpu_train_util.h"

namespace gtron {
namespace {

// Trains 12 steps with `sets` and EXPECTs the misses and reserved bytes of steps `steady`..12 to
// equal those of step `steady` (the steps before fill the caches, and capture the graphs).
void expect_steady(const std::string& name, const std::vector<std::string>& sets, int64_t steady) {
  const Config cfg =
      testing::tiny_train_config(testing::fresh_dir(name), "cuda", "bf16", 12, 1, sets);
  testing::train_ok(cfg);
  std::ifstream f(metrics_path(cfg));
  ASSERT_TRUE(f.good()) << metrics_path(cfg);
  std::map<int64_t, std::pair<double, double>> by_step;  // step -> (misses, reserved MiB)
  std::string line;
  while (std::getline(f, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.value("split", "train") != "train") continue;  // validation records
    ASSERT_TRUE(j.contains("alloc_misses") && j.contains("reserved_mib")) << line;
    by_step[j["step"].get<int64_t>()] = {j["alloc_misses"].get<double>(),
                                         j["reserved_mib"].get<double>()};
  }
  ASSERT_EQ(by_step.size(), 12u) << name;
  const auto base = by_step.at(steady);
  EXPECT_GT(base.first, 0) << name;  // the first steps did allocate
  for (int64_t s = steady + 1; s <= 12; ++s) {
    EXPECT_EQ(by_step.at(s).first, base.first) << name << ": allocator misses grew at step " << s;
    EXPECT_EQ(by_step.at(s).second, base.second) << name << ": reserved bytes grew at step " << s;
  }
}

TEST(TrainAllocCuda, NoMissesInSteadyState) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU test skipped";
  expect_steady("alloc", {"train.transient_grads=false"}, 3);  // held (auto: transient below)
}

TEST(TrainAllocCuda, TransientGradsNoMissesInSteadyState) {
  // Note [transient gradients]: eager, the buckets come back from the cache every step; under
  // graphs "full" (one micro-batch a step) they are pinned in the graphs' pool at the capture
  // (step 3) and never allocated again.
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU test skipped";
  const std::vector<std::string> one_micro = {"train.global_batch=8", "train.transient_grads=true",
                                              "parallel.bucket_mb=0.01"};
  expect_steady("alloc_transient", one_micro, 3);
  std::vector<std::string> full = one_micro;
  full.push_back("graphs.scope=full");
  expect_steady("alloc_transient_full", full, 4);
}

}  // namespace
}  // namespace gtron

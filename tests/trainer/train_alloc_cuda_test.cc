// A steady-state GPU training step makes no backend allocation: the CUDA caching allocator's miss
// count and reserved bytes, logged by the trainer in metrics.jsonl on every step, do not change
// from step 3 on (steps 1-2 fill the caches: shadows, optimizer tables, activations).
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "model/device.h"
#include "tests/trainer/gpu_train_util.h"

namespace gtron {
namespace {

TEST(TrainAllocCuda, NoMissesInSteadyState) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU test skipped";
  const Config cfg = testing::tiny_train_config(testing::fresh_dir("alloc"), "cuda", "bf16", 12, 1);
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
  ASSERT_EQ(by_step.size(), 12u);
  const auto base = by_step.at(3);
  EXPECT_GT(base.first, 0);  // the first steps did allocate
  for (int64_t s = 4; s <= 12; ++s) {
    EXPECT_EQ(by_step.at(s).first, base.first) << "allocator misses grew at step " << s;
    EXPECT_EQ(by_step.at(s).second, base.second) << "reserved bytes grew at step " << s;
  }
}

}  // namespace
}  // namespace gtron

// Graphs on the GPU (issue: graphs, acceptance 1): graphs.scope layers and full (CUDA graphs,
// captured after 2 eager warmups, replayed every micro-batch) give bit-identical losses to none,
// in bf16 and in fp32, and the steady state makes no allocator misses; train.transient_grads
// gives the persistent buffer's losses, and train.recompute = "full" the same losses under every
// scope.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/device.h"
#include "model/tensor.h"
#include "tests/trainer/gpu_train_util.h"

namespace gtron {
namespace {

TrainSummary train_scope(const std::string& precision, GraphScope scope) {
  Config cfg = testing::tiny_train_config(
      testing::fresh_dir("graphs_" + precision + "_" + to_string(scope)), "cuda", precision, 20, 5);
  cfg.graphs.scope = scope;
  return testing::train_ok(cfg);
}

void expect_graphs_match_eager(const std::string& precision) {
  const TrainSummary none = train_scope(precision, GraphScope::kNone);
  ASSERT_EQ(none.losses.size(), 20u);
  for (GraphScope scope : {GraphScope::kLayers, GraphScope::kFull}) {
    const TrainSummary g = train_scope(precision, scope);
    ASSERT_EQ(g.losses.size(), none.losses.size()) << to_string(scope);
    for (size_t i = 0; i < g.losses.size(); ++i) {
      EXPECT_EQ(g.losses[i], none.losses[i])
          << precision << " " << to_string(scope) << " step " << i + 1;  // bit for bit
    }
    EXPECT_EQ(g.val_loss, none.val_loss) << precision << " " << to_string(scope);
  }
}

TEST(TrainGraphsCuda, TransientGradsMatchPersistent) {
  // Note [transient gradients]: the same bits as the persistent buffer, eager and under graphs
  // "full" (one micro-batch a step), with buckets small enough that there are several.
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU test skipped";
  for (const std::string precision : {"bf16", "fp32"}) {
    std::vector<TrainSummary> runs;
    for (const char* transient : {"false", "true"}) {
      for (GraphScope scope : {GraphScope::kNone, GraphScope::kFull}) {
        Config cfg = testing::tiny_train_config(
            testing::fresh_dir("transient_" + precision + "_" + transient + "_" + to_string(scope)),
            "cuda", precision, 12, 4,
            {"train.global_batch=8", std::string("train.transient_grads=") + transient,
             "parallel.bucket_mb=0.01"});
        cfg.graphs.scope = scope;
        runs.push_back(testing::train_ok(cfg));
      }
    }
    ASSERT_EQ(runs[0].losses.size(), 12u);
    for (size_t r = 1; r < runs.size(); ++r) {
      EXPECT_EQ(runs[r].losses, runs[0].losses) << precision << " run " << r;  // bit for bit
      EXPECT_EQ(runs[r].val_loss, runs[0].val_loss) << precision << " run " << r;
    }
  }
}

TEST(TrainGraphsCuda, FullRecomputeUnderGraphsMatchesEager) {
  // Note [full recompute] in model/gpt.cc: the backward graph runs each block's forward again.
  // Head size 64 (the flash kernels), bf16, MTP D=1, both families: graphs none, layers and full
  // with train.recompute = "full" give the losses of graphs none without it, bit for bit.
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU test skipped";
  for (const std::string arch : {"gpt2", "llama"}) {
    std::vector<TrainSummary> runs;
    for (const char* recompute : {"none", "full"}) {
      for (GraphScope scope : {GraphScope::kNone, GraphScope::kLayers, GraphScope::kFull}) {
        if (std::string(recompute) == "none" && scope != GraphScope::kNone) continue;
        Config cfg = testing::tiny_train_config(
            testing::fresh_dir("recompute_" + arch + "_" + recompute + "_" + to_string(scope)),
            "cuda", "bf16", 12, 4,
            {"model.arch=" + arch, "model.n_embd=128", "model.n_head=2",
             std::string("train.recompute=") + recompute});
        cfg.graphs.scope = scope;
        runs.push_back(testing::train_ok(cfg));
      }
    }
    ASSERT_EQ(runs.size(), 4u);
    ASSERT_EQ(runs[0].losses.size(), 12u);
    for (size_t r = 1; r < runs.size(); ++r) {
      EXPECT_EQ(runs[r].losses, runs[0].losses) << arch << " run " << r;  // bit for bit
      EXPECT_EQ(runs[r].val_loss, runs[0].val_loss) << arch << " run " << r;
    }
  }
}

TEST(TrainGraphsCuda, Bf16LayersAndFullMatchEager) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU test skipped";
  expect_graphs_match_eager("bf16");
}

TEST(TrainGraphsCuda, Fp32LayersAndFullMatchEager) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU test skipped";
  expect_graphs_match_eager("fp32");
}

}  // namespace
}  // namespace gtron

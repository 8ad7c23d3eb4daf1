// The tensor-parallel code path on one GPU (issue 17, acceptance 5): GTRON_TEST_GRID_OF_ONE=tp
// runs every split layer (the column- and row-parallel GEMMs, the fused LayerNorm-qkv and MLP
// through the TP seams), the vocab-parallel embedding and cross-entropy and the TP collectives
// over a one-rank NCCL TP group (Note [tensor parallelism at one rank] in model/tensor_parallel.h).
// A tiny bf16 run with MTP D = 2 gives the plain single-GPU path's losses bit for bit, eager and
// under CUDA graphs (graphs.scope layers and full: the collectives are captured). Tagged "gpu".
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "model/device.h"
#include "tests/trainer/gpu_train_util.h"

namespace gtron {
namespace {

TrainSummary train(const std::string& name, bool tp_code, const std::string& scope) {
  const Config cfg =
      testing::tiny_train_config(testing::fresh_dir("tp_" + name + "_" + scope), "cuda", "bf16", 20,
                                 5, {"mtp.depth=2", "graphs.scope=" + scope});
  if (tp_code) {
    static int port = 33000 + static_cast<int>(getpid() % 2000);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", std::to_string(++port).c_str(), 1);
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "1", 1);
    setenv("LOCAL_RANK", "0", 1);
    setenv("LOCAL_WORLD_SIZE", "1", 1);
    setenv("GROUP_RANK", "0", 1);
    setenv("GTRON_TEST_GRID_OF_ONE", "tp", 1);
  }
  TrainSummary s = testing::train_ok(cfg);
  unsetenv("GTRON_TEST_GRID_OF_ONE");
  return s;
}

TEST(TrainTpCuda, TpCodeAtOneRankTrainsLikeThePlainPathBitForBit) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU test skipped";
  for (const std::string scope : {"none", "layers", "full"}) {
    const TrainSummary plain = train("plain", false, scope);
    const TrainSummary tp = train("tp1", true, scope);
    ASSERT_EQ(plain.losses.size(), 20u) << scope;
    EXPECT_EQ(tp.losses, plain.losses) << "graphs.scope " << scope;
    EXPECT_EQ(tp.val_loss, plain.val_loss) << "graphs.scope " << scope;
    std::printf("graphs.scope %s: step-20 loss %.9g plain, %.9g through the TP code at TP = 1\n",
                scope.c_str(), plain.losses.back(), tp.losses.back());
  }
}

}  // namespace
}  // namespace gtron

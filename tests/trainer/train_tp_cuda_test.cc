// The tensor-parallel code path on one GPU (issue 17, acceptance 5): GTRON_TEST_GRID_OF_ONE=tp
// runs every split layer (the column- and row-parallel GEMMs, the fused LayerNorm-qkv and MLP
// through the TP seams), the vocab-parallel embedding and cross-entropy and the TP collectives
// over a one-rank NCCL TP group (Note [tensor parallelism at one rank] in model/tensor_parallel.h).
// A tiny bf16 run with MTP D = 2 gives the plain single-GPU path's losses bit for bit, eager and
// under CUDA graphs (graphs.scope layers and full: the collectives are captured). Tagged "gpu".
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "model/device.h"
#include "model/layers.h"
#include "tests/trainer/gpu_train_util.h"

namespace gtron {
namespace {

// The plain path runs the ops the TP code runs at one rank: the head as linear + cross-entropy,
// as the vocab-parallel code does (the blocked classifier, model/ops/classifier.h, sums the head's
// gradient in another order), and the MLP's residual added after mlp.proj, as after the TP seam
// (not in the GEMM's epilogue, which rounds once instead of twice).
class TpKernels {
 public:
  TpKernels() {
    setenv("GTRON_CLASSIFIER_ROWS", "0", 1);
    set_residual_in_gemm_for_testing(false);
  }
  ~TpKernels() {
    unsetenv("GTRON_CLASSIFIER_ROWS");
    set_residual_in_gemm_for_testing(true);  // the default
  }
};

TrainSummary train(const std::string& name, bool tp_code, const std::string& scope) {
  TpKernels same_kernels;
  const Config cfg =
      testing::tiny_train_config(testing::fresh_dir("tp_" + name + "_" + scope), "cuda", "bf16", 20,
                                 5, {"mtp.depth=2", "graphs.scope=" + scope});
  return tp_code ? testing::train_on_grid_of_one(cfg, "tp") : testing::train_ok(cfg);
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

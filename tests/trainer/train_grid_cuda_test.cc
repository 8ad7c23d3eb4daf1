// The multi-process training path on one GPU (GTRON_TEST_GRID_OF_ONE): a one-rank NCCL process
// grid — rendezvous, NCCL DDP, the device gradient norm reduced over the groups, world-mean loss
// rows, comm timing, checkpoints gathered through NCCL — and GTP at G = 1 on top (bf16 gathers,
// NCCL symmetric send buffers) train the tiny model like the plain single-GPU path: bit for bit
// without GTP, within 1e-5 relative with it (the norm's partial sums are combined in another
// order). Tagged "gpu".
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "model/device.h"
#include "tests/trainer/gpu_train_util.h"

namespace gtron {
namespace {

TrainSummary train(const std::string& name, const char* grid, std::vector<std::string> sets) {
  const Config cfg =
      testing::tiny_train_config(testing::fresh_dir("grid_" + name), "cuda", "bf16", 20, 5, sets);
  return grid != nullptr ? testing::train_on_grid_of_one(cfg, grid) : testing::train_ok(cfg);
}

double worst_rel(const TrainSummary& a, const TrainSummary& b) {
  double w = 0;
  for (size_t i = 0; i < a.losses.size() && i < b.losses.size(); ++i)
    w = std::max(w, std::abs(a.losses[i] - b.losses[i]) / std::abs(a.losses[i]));
  return w;
}

TEST(TrainGridCuda, OneRankGridAndGtpTrainLikeThePlainPath) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU test skipped";
  const TrainSummary plain = train("plain", nullptr, {});
  const TrainSummary grid = train("grid", "1", {"log.comm_timing=true"});
  EXPECT_EQ(grid.losses, plain.losses);  // NCCL at world size 1 moves no value
  const TrainSummary distributed = train("grid_dist", "1", {"parallel.distributed_optimizer=true"});
  const TrainSummary gtp = train("grid_gtp", "gtp", {"log.comm_timing=true"});
  const TrainSummary gtp_plain =
      train("grid_gtp_plain", "gtp", {"parallel.gtp_symmetric_memory=false"});
  std::printf(
      "worst relative loss difference vs plain: distributed %.3g, GTP %.3g, GTP with plain "
      "send buffers %.3g\n",
      worst_rel(plain, distributed), worst_rel(plain, gtp), worst_rel(plain, gtp_plain));
  EXPECT_LT(worst_rel(plain, distributed), 1e-5);
  EXPECT_LT(worst_rel(plain, gtp), 1e-5);
  EXPECT_EQ(gtp_plain.losses, gtp.losses);
  EXPECT_NEAR(gtp.val_loss, plain.val_loss, 1e-4 * plain.val_loss);
}

}  // namespace
}  // namespace gtron

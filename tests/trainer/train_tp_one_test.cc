// The tensor-parallel code path at TP = 1 on the CPU (issue 17): GTRON_TEST_GRID_OF_ONE=tp builds
// a one-rank Gloo TP group and runs every split layer, the vocab-parallel embedding and
// cross-entropy and the TP ops over it — the plumbing train_tp_cuda_test runs over NCCL. The CPU
// vocab-parallel cross-entropy is its own kernel (not cross_entropy's), so the losses agree to
// float reassociation, not bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "tests/trainer/gpu_train_util.h"

namespace gtron {
namespace {

TEST(TrainTpOne, TpCodeAtOneRankTrainsLikeThePlainPathOnCpu) {
  const std::vector<std::string> sets = {"mtp.depth=2"};
  const TrainSummary plain = testing::train_ok(
      testing::tiny_train_config(testing::fresh_dir("tp_one_plain"), "cpu", "fp32", 10, 5, sets));
  const TrainSummary tp = testing::train_on_grid_of_one(
      testing::tiny_train_config(testing::fresh_dir("tp_one_tp"), "cpu", "fp32", 10, 5, sets),
      "tp");
  ASSERT_EQ(tp.losses.size(), plain.losses.size());
  double worst = 0;
  for (size_t i = 0; i < plain.losses.size(); ++i)
    worst = std::max(worst, std::abs(tp.losses[i] - plain.losses[i]) / std::abs(plain.losses[i]));
  std::printf("worst relative loss difference, TP code at TP = 1 vs plain: %.3g\n", worst);
  EXPECT_LT(worst, 1e-6);
  EXPECT_LT(plain.losses.back(), plain.losses.front() - 0.05);  // it trained
}

}  // namespace
}  // namespace gtron

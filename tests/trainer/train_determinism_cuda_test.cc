// The same seed twice on the GPU gives bit-identical losses: every kernel on the training path is
// deterministic (fixed-order reductions, a stable sort in the embedding backward, a fixed-order
// gradient norm), in bf16 and in fp32.
#include <gtest/gtest.h>

#include "model/device.h"
#include "tests/trainer/gpu_train_util.h"

namespace gtron {
namespace {

void expect_repeats(const std::string& precision) {
  const TrainSummary a = testing::train_ok(testing::tiny_train_config(
      testing::fresh_dir("det_a_" + precision), "cuda", precision, 20, 5));
  const TrainSummary b = testing::train_ok(testing::tiny_train_config(
      testing::fresh_dir("det_b_" + precision), "cuda", precision, 20, 5));
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (size_t i = 0; i < a.losses.size(); ++i) {
    EXPECT_EQ(a.losses[i], b.losses[i]) << precision << " step " << i + 1;  // bit for bit
  }
  EXPECT_EQ(a.val_loss, b.val_loss) << precision;
}

TEST(TrainDeterminismCuda, Bf16SameSeedSameCurve) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU test skipped";
  expect_repeats("bf16");
}

TEST(TrainDeterminismCuda, Fp32SameSeedSameCurve) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU test skipped";
  expect_repeats("fp32");
}

}  // namespace
}  // namespace gtron

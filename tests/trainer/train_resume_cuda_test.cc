// GPU resume is bit-exact: 40 steps straight equal 20 steps + --resume + 20 steps, in bf16, on a
// model whose head size (64) takes the flash-attention and fused-MLP paths; and graphs full
// replays that model bit for bit; both with packed masters too (train.packed_masters), whose
// checkpoints unpack and re-pack without changing a bit; and fp8 with the codes written by AdamW
// (GPU test; skipped without a GPU).
#include <gtest/gtest.h>

#include <filesystem>

#include "model/device.h"
#include "model/mixed_precision.h"
#include "tests/trainer/gpu_train_util.h"

namespace gtron {
namespace {

// The tiny test config widened to C = 128 with 2 heads: HS = 64.
Config flash_config(const std::string& dir, std::vector<std::string> sets) {
  sets.push_back("model.n_embd=128");
  sets.push_back("model.n_head=2");
  return testing::tiny_train_config(dir, "cuda", "bf16", 40, 1, sets);
}

TEST(TrainResumeCuda, FortyStraightEqualTwentyPlusResumedTwenty) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU test skipped";
  const TrainSummary straight = testing::train_ok(flash_config(testing::fresh_dir("straight"), {}));
  const std::string dir = testing::fresh_dir("resumed");
  const Config cfg = flash_config(dir, {"checkpoint.every=20"});
  const TrainSummary first = testing::train_ok(cfg);
  // A run stopped after step 20: only that checkpoint is left.
  std::filesystem::remove_all(dir + "/checkpoints/step_00000040");
  TrainSummary resumed;
  ASSERT_EQ(run_training(cfg, /*resume=*/true, &resumed), kExitOk);
  ASSERT_EQ(resumed.first_step, 21);
  ASSERT_EQ(resumed.losses.size(), 20u);
  for (size_t i = 0; i < 20; ++i) {
    EXPECT_EQ(first.losses[i], straight.losses[i]) << "step " << i + 1;
    EXPECT_EQ(resumed.losses[i], straight.losses[20 + i]) << "step " << 21 + i;  // bit for bit
  }
  EXPECT_EQ(resumed.val_loss, straight.val_loss);
}

TEST(TrainResumeCuda, GraphsFullReplaysTheFlashModelBitForBit) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU test skipped";
  const TrainSummary eager = testing::train_ok(flash_config(testing::fresh_dir("eager"), {}));
  const TrainSummary full =
      testing::train_ok(flash_config(testing::fresh_dir("full"), {"graphs.scope=full"}));
  ASSERT_EQ(eager.losses.size(), full.losses.size());
  for (size_t i = 0; i < eager.losses.size(); ++i) {
    EXPECT_EQ(eager.losses[i], full.losses[i]) << "step " << i + 1;
  }
  EXPECT_EQ(eager.val_loss, full.val_loss);
}

// Note [packed masters] (model/mixed_precision.h) through the trainer.
TEST(TrainResumeCuda, PackedMastersCheckpointResumeAndReplayBitForBit) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU test skipped";
  const std::string packed = "train.packed_masters=true";
  const TrainSummary plain = testing::train_ok(flash_config(testing::fresh_dir("plain"), {}));
  const TrainSummary straight =
      testing::train_ok(flash_config(testing::fresh_dir("packed"), {packed}));
  const std::string dir = testing::fresh_dir("packed_resumed");
  const Config cfg = flash_config(dir, {packed, "checkpoint.every=20"});
  const TrainSummary first = testing::train_ok(cfg);  // saves at 20: an unpack and a re-pack
  std::filesystem::remove_all(dir + "/checkpoints/step_00000040");
  TrainSummary resumed;
  ASSERT_EQ(run_training(cfg, /*resume=*/true, &resumed), kExitOk);
  ASSERT_EQ(resumed.losses.size(), 20u);
  const TrainSummary full = testing::train_ok(
      flash_config(testing::fresh_dir("packed_full"), {packed, "graphs.scope=full"}));
  ASSERT_EQ(straight.losses.size(), 40u);
  for (size_t i = 0; i < 40; ++i) {
    EXPECT_EQ(first.losses[i], straight.losses[i]) << "step " << i + 1;
    EXPECT_EQ(full.losses[i], straight.losses[i]) << "step " << i + 1 << ", graphs full";
    // The shadows differ from the cast's at exact ties only.
    EXPECT_NEAR(straight.losses[i], plain.losses[i], 1e-2 * plain.losses[i]) << "step " << i + 1;
    if (i >= 20) EXPECT_EQ(resumed.losses[i - 20], straight.losses[i]) << "step " << i + 1;
  }
  EXPECT_EQ(resumed.val_loss, straight.val_loss);
  // A packed run's checkpoint resumes unpacked: the same fp32 values.
  std::filesystem::remove_all(dir + "/checkpoints/step_00000040");  // the resumed run's
  const Config unpacked = flash_config(dir, {"train.packed_masters=false", "checkpoint.every=20"});
  TrainSummary after;
  ASSERT_EQ(run_training(unpacked, /*resume=*/true, &after), kExitOk);
  ASSERT_EQ(after.first_step, 21);
  ASSERT_EQ(after.losses.size(), 20u);
  EXPECT_NEAR(after.losses[0], straight.losses[20], 1e-2 * straight.losses[20]);
}

// Note [fp8 codes from the update] (trainer/optimizer_cuda.h): an fp8 run whose AdamW writes the
// weights' codes gives the losses of one that quantizes them at their next use, bit for bit; and
// it resumes bit for bit.
TEST(TrainResumeCuda, Fp8CodesFromTheUpdateChangeNoBit) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU test skipped";
  const std::vector<std::string> wide = {"model.n_embd=256", "model.n_head=4",
                                         "checkpoint.every=20"};
  const std::string dir = testing::fresh_dir("fp8_fused");
  const Config cfg = testing::tiny_train_config(dir, "cuda", "fp8", 40, 1, wide);
  set_fused_fp8_codes(false);
  const TrainSummary requantized = testing::train_ok(
      testing::tiny_train_config(testing::fresh_dir("fp8_plain"), "cuda", "fp8", 40, 1, wide));
  set_fused_fp8_codes(true);
  const TrainSummary fused = testing::train_ok(cfg);
  ASSERT_EQ(fused.losses.size(), requantized.losses.size());
  for (size_t i = 0; i < fused.losses.size(); ++i) {
    EXPECT_EQ(fused.losses[i], requantized.losses[i]) << "step " << i + 1;
  }
  EXPECT_EQ(fused.val_loss, requantized.val_loss);
  std::filesystem::remove_all(dir + "/checkpoints/step_00000040");
  TrainSummary resumed;
  ASSERT_EQ(run_training(cfg, /*resume=*/true, &resumed), kExitOk);
  ASSERT_EQ(resumed.losses.size(), 20u);
  for (size_t i = 0; i < 20; ++i) EXPECT_EQ(resumed.losses[i], fused.losses[20 + i]) << i + 21;
}

}  // namespace
}  // namespace gtron

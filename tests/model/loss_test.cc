#include "model/ops/loss.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include "model/check.h"
#include "model/ops/classifier.h"
#include "tests/model/gradcheck.h"
#include "tests/model/op_check.h"

namespace gtron {
namespace {

TEST(CrossEntropy, KnownLogits) {
  // logits [0, ln 3], target 1: softmax = [1/4, 3/4], loss = −ln(3/4) = ln(4/3).
  Var logits = Var::constant(Tensor::from_vector({0, std::log(3.0)}, {1, 2}, DType::kF64));
  Var loss = cross_entropy(logits, Tensor::from_ints({1}, {1}), 2);
  EXPECT_EQ(loss.shape(), Shape{});
  EXPECT_NEAR(loss.value().item(), std::log(4.0 / 3.0), 1e-15);
}

TEST(CrossEntropy, MaskedRowsAndPaddedTailByHand) {
  // V = 2, Vp = 3. The tail column holds huge values that must be ignored; row 1 is masked.
  //   row 0: [0, ln 3 | 1000], target 1 -> ln(4/3), softmax [1/4, 3/4]
  //   row 1: [5, -5 | 7],      masked
  //   row 2: [ln 2, 0 | -1000], target 0 -> ln(3/2), softmax [2/3, 1/3]
  // Mean over the 2 unmasked rows: (ln(4/3) + ln(3/2)) / 2 = ln(2) / 2.
  Var logits = Var::leaf(Tensor::from_vector(
      {0, std::log(3.0), 1000, 5, -5, 7, std::log(2.0), 0, -1000}, {3, 3}, DType::kF64));
  Var loss = cross_entropy(logits, Tensor::from_ints({1, kMaskedTarget, 0}, {3}), 2);
  EXPECT_NEAR(loss.value().item(), std::log(2.0) / 2, 1e-15);
  backward(loss);
  // d = (softmax − onehot) / 2; masked row and tail column get exactly 0.
  std::vector<double> want = {0.25 / 2, -0.25 / 2, 0, 0, 0, 0, -1.0 / 3 / 2, 1.0 / 3 / 2, 0};
  std::vector<double> got = logits.grad().to_vector();
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-15) << i;
  EXPECT_EQ(got[2], 0.0);
  EXPECT_EQ(got[8], 0.0);
}

TEST(CrossEntropy, AllMaskedGivesZeroLossAndZeroGrad) {
  Var logits = Var::leaf(testing::randn_tensor({2, 4}, 1));
  Tensor targets = Tensor::from_ints({kMaskedTarget, kMaskedTarget}, {2});
  Var loss = cross_entropy(logits, targets, 3);
  EXPECT_EQ(loss.value().item(), 0.0);
  backward(loss);
  for (double g : logits.grad().to_vector()) EXPECT_EQ(g, 0.0);
}

TEST(CrossEntropy, StableForLargeLogits) {
  // Without max-subtraction exp(1000) overflows; the answer is ln(1 + e^{-1}) for target 0.
  Var logits = Var::constant(Tensor::from_vector({1001, 1000}, {1, 2}, DType::kF32));
  Var loss = cross_entropy(logits, Tensor::from_ints({0}, {1}), 2);
  EXPECT_NEAR(loss.value().item(), std::log1p(std::exp(-1.0)), 1e-6);
}

TEST(CrossEntropy, GradCheckWithMaskAndPadding) {
  // [2, 5] positions, Vp = 9, V = 7; three positions masked.
  Tensor targets =
      Tensor::from_ints({3, kMaskedTarget, 0, 6, 6, 1, kMaskedTarget, 2, 5, kMaskedTarget}, {2, 5});
  auto res = testing::gradcheck(
      [&](const std::vector<Var>& in) { return cross_entropy(in[0], targets, 7); },
      {testing::randn_tensor({2, 5, 9}, 2, 2.0)}, {});
  EXPECT_LT(res.worst_error, 1e-6) << res.worst_name;
}

TEST(Scale, ValuesAndGradCheck) {
  Var x = Var::constant(Tensor::from_vector({1, -2, 4}, {3}, DType::kF64));
  EXPECT_EQ(scale(x, 0.5).value().to_vector(), (std::vector<double>{0.5, -1, 2}));
  auto res = testing::gradcheck([](const std::vector<Var>& in) { return scale(in[0], -0.3); },
                                {testing::randn_tensor({3, 5}, 3)}, {});
  EXPECT_LT(res.worst_error, 1e-6) << res.worst_name;
}

TEST(Scale, OfCrossEntropyGradCheck) {
  // The MTP pattern: λ/D · CE_k on a rank-0 loss.
  Tensor targets = Tensor::from_ints({2, kMaskedTarget, 0, 4, 1}, {5});
  auto res = testing::gradcheck(
      [&](const std::vector<Var>& in) { return scale(cross_entropy(in[0], targets, 5), 0.15); },
      {testing::randn_tensor({5, 7}, 4)}, {});
  EXPECT_LT(res.worst_error, 1e-6) << res.worst_name;
}

// Targets for the larger runs: every 5th position masked, the rest spread over [0, V).
Tensor make_targets(int64_t N, int32_t V) {
  std::vector<int32_t> t(static_cast<size_t>(N));
  for (size_t i = 0; i < t.size(); ++i) {
    t[i] = i % 5 == 4 ? kMaskedTarget : static_cast<int32_t>((i * 7919 + 3) % V);
  }
  return Tensor::from_ints(t, {N});
}

TEST(CrossEntropy, F32MatchesF64) {
  Tensor targets = make_targets(256, 120);
  auto f = [&](const std::vector<Var>& in) { return cross_entropy(in[0], targets, 120); };
  std::vector<Tensor> in = {testing::randn_tensor({256, 128}, 5, 3.0)};
  auto r32 = testing::run_op(f, in, DType::kF32);
  auto r64 = testing::run_op(f, in, DType::kF64);
  for (size_t k = 0; k < r64.size(); ++k) EXPECT_LT(testing::rel_diff(r32[k], r64[k]), 1e-5) << k;
}

TEST(CrossEntropy, DeterministicAcrossRunsAndThreadCounts) {
  Tensor targets = make_targets(512, 120);
  auto f = [&](const std::vector<Var>& in) { return cross_entropy(in[0], targets, 120); };
  std::vector<Tensor> in = {testing::randn_tensor({512, 128}, 6, 3.0)};
  auto first = testing::run_op(f, in, DType::kF32);
  EXPECT_EQ(first, testing::run_op(f, in, DType::kF32));
  testing::with_threads(1, [&] { EXPECT_EQ(first, testing::run_op(f, in, DType::kF32)); });
}

TEST(Classifier, BlockRowsAndTheirSwitch) {
  // The fewest blocks of at most 512 MiB of bf16 logits, rows a multiple of 128.
  unsetenv("GTRON_CLASSIFIER_ROWS");
  EXPECT_EQ(classifier_block_rows(16384, 50304), 4096);  // 1.65 GB: 4 blocks
  EXPECT_EQ(classifier_block_rows(8192, 50304), 4096);   // 824 MB: 2 blocks
  EXPECT_EQ(classifier_block_rows(100, 50304), 128);     // one block
  setenv("GTRON_CLASSIFIER_ROWS", "1000", 1);
  EXPECT_EQ(classifier_block_rows(16384, 50304), 1000);
  setenv("GTRON_CLASSIFIER_ROWS", "0", 1);
  EXPECT_EQ(classifier_block_rows(16384, 50304), 0);
  for (const char* bad : {"", "abc", "12x", "-5"}) {
    setenv("GTRON_CLASSIFIER_ROWS", bad, 1);
    EXPECT_THROW(classifier_block_rows(16384, 50304), UserError) << "'" << bad << "'";
  }
  unsetenv("GTRON_CLASSIFIER_ROWS");
}

TEST(CrossEntropyDeathTest, TargetOutOfRangeAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Var logits = Var::constant(Tensor::zeros({2, 8}, DType::kF32));
  EXPECT_DEATH(cross_entropy(logits, Tensor::from_ints({0, 7}, {2}), 7), "target 7 at row 1");
  EXPECT_DEATH(cross_entropy(logits, Tensor::from_ints({-2, 0}, {2}), 7), "target -2 at row 0");
}

}  // namespace
}  // namespace gtron

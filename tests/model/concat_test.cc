#include "model/ops/concat.h"

#include <gtest/gtest.h>

#include "tests/model/gradcheck.h"
#include "tests/model/op_check.h"

namespace gtron {
namespace {

TEST(ConcatFeatures, Layout) {
  // a: [2, 2], b: [2, 3] -> rows [a_i | b_i].
  Var a = Var::constant(Tensor::from_vector({1, 2, 3, 4}, {2, 2}, DType::kF32));
  Var b = Var::constant(Tensor::from_vector({10, 20, 30, 40, 50, 60}, {2, 3}, DType::kF32));
  Var y = concat_features(a, b);
  EXPECT_EQ(y.shape(), (Shape{2, 5}));
  EXPECT_EQ(y.value().to_vector(), (std::vector<double>{1, 2, 10, 20, 30, 3, 4, 40, 50, 60}));
}

TEST(ConcatFeatures, BackwardSplitsColumnBlocks) {
  Var a = Var::leaf(Tensor::zeros({1, 2, 1}, DType::kF64));
  Var b = Var::leaf(Tensor::zeros({1, 2, 2}, DType::kF64));
  Var y = concat_features(a, b);
  EXPECT_EQ(y.shape(), (Shape{1, 2, 3}));
  backward_with(y, Tensor::from_vector({1, 2, 3, 4, 5, 6}, {1, 2, 3}, DType::kF64));
  EXPECT_EQ(a.grad().to_vector(), (std::vector<double>{1, 4}));
  EXPECT_EQ(b.grad().to_vector(), (std::vector<double>{2, 3, 5, 6}));
}

TEST(ConcatFeatures, GradCheck) {
  auto res = testing::gradcheck(
      [](const std::vector<Var>& in) { return concat_features(in[0], in[1]); },
      {testing::randn_tensor({3, 5, 7}, 1), testing::randn_tensor({3, 5, 4}, 2)}, {});
  EXPECT_LT(res.worst_error, 1e-6) << res.worst_name;
}

TEST(ConcatFeatures, GradCheckSameInputTwice) {
  // concat(x, x): both blocks flow back into x, accumulated.
  auto res =
      testing::gradcheck([](const std::vector<Var>& in) { return concat_features(in[0], in[0]); },
                         {testing::randn_tensor({5, 3}, 3)}, {});
  EXPECT_LT(res.worst_error, 1e-6) << res.worst_name;
}

Var concat_of(const std::vector<Var>& in) { return concat_features(in[0], in[1]); }

TEST(ConcatFeatures, F32MatchesF64) {
  std::vector<Tensor> in = {testing::randn_tensor({4, 64, 96}, 4),
                            testing::randn_tensor({4, 64, 96}, 5)};
  auto r32 = testing::run_op(concat_of, in, DType::kF32);
  auto r64 = testing::run_op(concat_of, in, DType::kF64);
  for (size_t k = 0; k < r64.size(); ++k) EXPECT_LT(testing::rel_diff(r32[k], r64[k]), 1e-5) << k;
}

TEST(ConcatFeatures, DeterministicAcrossRunsAndThreadCounts) {
  std::vector<Tensor> in = {testing::randn_tensor({4, 64, 128}, 6),
                            testing::randn_tensor({4, 64, 96}, 7)};
  auto first = testing::run_op(concat_of, in, DType::kF32);
  EXPECT_EQ(first, testing::run_op(concat_of, in, DType::kF32));
  testing::with_threads(1, [&] { EXPECT_EQ(first, testing::run_op(concat_of, in, DType::kF32)); });
}

}  // namespace
}  // namespace gtron

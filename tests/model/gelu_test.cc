#include "model/ops/gelu.h"

#include <gtest/gtest.h>

#include <cmath>

#include "tests/model/gradcheck.h"
#include "tests/model/op_check.h"

namespace gtron {
namespace {

// The closed formula, written out here independently of the kernel.
double gelu_tanh(double x) {
  const double pi = std::acos(-1.0);
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / pi) * (x + 0.044715 * x * x * x)));
}

TEST(Gelu, MatchesClosedFormula) {
  std::vector<double> xs = {-4, -1.5, -1, -0.25, 0, 0.5, 1, 3};
  Var x = Var::constant(Tensor::from_vector(xs, {8}, DType::kF64));
  std::vector<double> got = gelu(x).value().to_vector();
  for (size_t i = 0; i < xs.size(); ++i) EXPECT_NEAR(got[i], gelu_tanh(xs[i]), 1e-15) << xs[i];
  // Landmarks: gelu(0) = 0, gelu(1) ≈ 0.841192, gelu(-4) ≈ 0 (tiny negative), gelu(3) ≈ 3.
  EXPECT_EQ(got[4], 0.0);
  EXPECT_NEAR(got[6], 0.8411920, 1e-6);
  EXPECT_NEAR(got[0], 0.0, 1e-3);
  EXPECT_NEAR(got[7], 3.0, 1e-2);
}

TEST(Gelu, DerivativeAtZeroIsOneHalf) {
  Var x = Var::leaf(Tensor::from_vector({0}, {1}, DType::kF64));
  backward_with(gelu(x), Tensor::from_vector({1}, {1}, DType::kF64));
  EXPECT_NEAR(x.grad().to_vector()[0], 0.5, 1e-15);
}

TEST(Gelu, GradCheck) {
  auto res = testing::gradcheck([](const std::vector<Var>& in) { return gelu(in[0]); },
                                {testing::randn_tensor({3, 5, 7}, 1, 2.0)}, {});
  EXPECT_LT(res.worst_error, 1e-6) << res.worst_name;
}

TEST(Gelu, BackwardAccumulates) {
  // y = gelu(x) used twice through two ops on the same leaf: the grad doubles.
  Tensor x0 = testing::randn_tensor({6}, 2);
  Var x = Var::leaf(x0);
  backward_with(gelu(x), Tensor::from_vector({1, 1, 1, 1, 1, 1}, {6}, DType::kF64));
  std::vector<double> once = x.grad().to_vector();
  backward_with(gelu(x), Tensor::from_vector({1, 1, 1, 1, 1, 1}, {6}, DType::kF64));
  std::vector<double> twice = x.grad().to_vector();
  for (size_t i = 0; i < once.size(); ++i) EXPECT_DOUBLE_EQ(twice[i], 2 * once[i]);
}

TEST(Gelu, ValueDoesNotDependOnPositionInBuffer) {
  // The same values at another offset (another alignment, another split into vector blocks and
  // tail) must give the same bits.
  const int64_t n = 1001;
  Tensor x = testing::randn_tensor({n}, 5, 2.0, DType::kF32);
  std::vector<double> whole = gelu(Var::constant(x)).value().to_vector();
  Tensor shifted = x.view({n, 1}).rows(3, n).view({n - 3});
  std::vector<double> part = gelu(Var::constant(shifted)).value().to_vector();
  for (int64_t i = 0; i < n - 3; ++i) ASSERT_EQ(part[i], whole[i + 3]) << i;
}

Var gelu_of(const std::vector<Var>& in) { return gelu(in[0]); }

TEST(Gelu, F32MatchesF64) {
  std::vector<Tensor> in = {testing::randn_tensor({8, 64, 96}, 3, 2.0)};
  auto r32 = testing::run_op(gelu_of, in, DType::kF32);
  auto r64 = testing::run_op(gelu_of, in, DType::kF64);
  for (size_t k = 0; k < r64.size(); ++k) EXPECT_LT(testing::rel_diff(r32[k], r64[k]), 1e-5) << k;
}

TEST(Gelu, DeterministicAcrossRunsAndThreadCounts) {
  std::vector<Tensor> in = {testing::randn_tensor({8, 64, 96}, 4)};
  auto first = testing::run_op(gelu_of, in, DType::kF32);
  EXPECT_EQ(first, testing::run_op(gelu_of, in, DType::kF32));
  testing::with_threads(1, [&] { EXPECT_EQ(first, testing::run_op(gelu_of, in, DType::kF32)); });
}

}  // namespace
}  // namespace gtron

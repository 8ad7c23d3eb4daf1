#include "model/ops/swiglu.h"

#include <gtest/gtest.h>

#include <cmath>

#include "tests/model/gradcheck.h"
#include "tests/model/op_check.h"

namespace gtron {
namespace {

double silu(double g) { return g / (1 + std::exp(-g)); }

TEST(SwiGlu, KnownRow) {
  // One row, F = 2: gate [0, 1], up [3, -2]. silu(0) = 0, silu(1) = 1/(1 + e^-1) ≈ 0.731059.
  Var x = Var::constant(Tensor::from_vector({0, 1, 3, -2}, {1, 4}, DType::kF64));
  std::vector<double> y = swiglu(x).value().to_vector();
  ASSERT_EQ(y.size(), 2u);
  EXPECT_EQ(y[0], 0.0);
  EXPECT_NEAR(y[1], -2 * 0.7310585786300049, 1e-15);
}

TEST(SwiGlu, MatchesScalarReferenceOnEveryRow) {
  const int64_t N = 3 * 7, F = 13;  // F not a multiple of the 8-lane block
  Tensor x = testing::randn_tensor({3, 7, 2 * F}, 1, 2.0);
  std::vector<double> in = x.to_vector();
  std::vector<double> got = swiglu(Var::constant(x)).value().to_vector();
  ASSERT_EQ(got.size(), static_cast<size_t>(N * F));
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t j = 0; j < F; ++j) {
      const double want = silu(in[n * 2 * F + j]) * in[n * 2 * F + F + j];
      EXPECT_NEAR(got[n * F + j], want, 1e-15 * (1 + std::abs(want))) << n << " " << j;
    }
  }
}

// The gradient against the chain rule through the composition silu(g)·u, written out here:
// d gate = dy·u·(σ + g·σ(1 − σ)), d up = dy·silu(g).
TEST(SwiGlu, GradientMatchesComposedReference) {
  const int64_t F = 5;
  Tensor x0 = testing::randn_tensor({2, 3, 2 * F}, 2, 1.5);
  Tensor dy = testing::randn_tensor({2, 3, F}, 3);
  Var x = Var::leaf(x0);
  backward_with(swiglu(x), dy);
  std::vector<double> got = x.grad().to_vector(), in = x0.to_vector(), d = dy.to_vector();
  for (int64_t n = 0; n < 6; ++n) {
    for (int64_t j = 0; j < F; ++j) {
      const double g = in[n * 2 * F + j], u = in[n * 2 * F + F + j], s = 1 / (1 + std::exp(-g));
      EXPECT_NEAR(got[n * 2 * F + j], d[n * F + j] * u * (s + g * s * (1 - s)), 1e-14);
      EXPECT_NEAR(got[n * 2 * F + F + j], d[n * F + j] * silu(g), 1e-14);
    }
  }
}

TEST(SwiGlu, GradCheck) {
  // F = 5 (odd), rows [2, 7].
  auto res = testing::gradcheck([](const std::vector<Var>& in) { return swiglu(in[0]); },
                                {testing::randn_tensor({2, 7, 10}, 4, 2.0)}, {});
  EXPECT_LT(res.worst_error, 1e-6) << res.worst_name;
}

TEST(SwiGlu, BackwardAccumulates) {
  Var x = Var::leaf(testing::randn_tensor({4, 10}, 5));
  Tensor dy = testing::randn_tensor({4, 5}, 6);
  backward_with(swiglu(x), dy);
  std::vector<double> once = x.grad().to_vector();
  backward_with(swiglu(x), dy);
  std::vector<double> twice = x.grad().to_vector();
  for (size_t i = 0; i < once.size(); ++i) EXPECT_DOUBLE_EQ(twice[i], 2 * once[i]);
}

TEST(SwiGlu, RejectsOddWidth) {
  Var x = Var::constant(testing::randn_tensor({2, 7}, 7));
  EXPECT_DEATH(swiglu(x), "expected \\[..., 2F\\]");
}

Var swiglu_of(const std::vector<Var>& in) { return swiglu(in[0]); }

TEST(SwiGlu, F32MatchesF64) {
  std::vector<Tensor> in = {testing::randn_tensor({8, 64, 2 * 173}, 8, 2.0)};
  auto r32 = testing::run_op(swiglu_of, in, DType::kF32);
  auto r64 = testing::run_op(swiglu_of, in, DType::kF64);
  for (size_t k = 0; k < r64.size(); ++k) EXPECT_LT(testing::rel_diff(r32[k], r64[k]), 1e-5) << k;
}

TEST(SwiGlu, DeterministicAcrossRunsAndThreadCounts) {
  std::vector<Tensor> in = {testing::randn_tensor({8, 64, 2 * 173}, 9)};
  auto first = testing::run_op(swiglu_of, in, DType::kF32);
  EXPECT_EQ(first, testing::run_op(swiglu_of, in, DType::kF32));
  testing::with_threads(1, [&] { EXPECT_EQ(first, testing::run_op(swiglu_of, in, DType::kF32)); });
}

}  // namespace
}  // namespace gtron

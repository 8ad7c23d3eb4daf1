#include "model/ops/attention.h"

#include <gtest/gtest.h>

#include <cmath>

#include "tests/model/gradcheck.h"
#include "tests/model/op_check.h"

namespace gtron {
namespace {

TEST(CausalAttention, TwoTokensOneHeadByHand) {
  // Rows are [q | k | v] with HS = 2.
  //   t = 0: q0 = [1, 0], k0 = [1, 2], v0 = [3, -1]
  //   t = 1: q1 = [0, 2], k1 = [0, 1], v1 = [1, 5]
  Var qkv = Var::constant(
      Tensor::from_vector({1, 0, 1, 2, 3, -1, 0, 2, 0, 1, 1, 5}, {1, 2, 6}, DType::kF64));
  std::vector<double> out = causal_attention(qkv, 1).value().to_vector();
  // Token 0 sees only itself: out0 = v0.
  EXPECT_NEAR(out[0], 3, 1e-15);
  EXPECT_NEAR(out[1], -1, 1e-15);
  // Token 1: scores q1·k0 = 4, q1·k1 = 2, scaled by 1/sqrt(2); w0 = 1 / (1 + e^{-2/sqrt(2)}).
  const double w0 = 1 / (1 + std::exp(-2 / std::sqrt(2.0)));
  const double w1 = 1 - w0;
  EXPECT_NEAR(out[2], w0 * 3 + w1 * 1, 1e-15);
  EXPECT_NEAR(out[3], w0 * -1 + w1 * 5, 1e-15);
  EXPECT_NEAR(w0, 0.8044296, 1e-7);  // softmax([2.828427, 1.414214])[0]
}

void expect_matches_reference(int64_t B, int64_t T, int NH, int64_t HS, uint64_t seed) {
  Tensor qkv = testing::randn_tensor({B, T, 3 * NH * HS}, seed);
  std::vector<double> got = causal_attention(Var::constant(qkv), NH).value().to_vector();
  std::vector<double> want = testing::reference_attention(qkv.to_vector(), B, T, NH, HS);
  EXPECT_LT(testing::rel_diff(got, want), 1e-13) << "B=" << B << " T=" << T << " NH=" << NH;
}

TEST(CausalAttention, MatchesScalarReference) {
  expect_matches_reference(2, 7, 3, 5, 1);
  // Long enough for Eigen's blocked triangular products to take several blocks.
  expect_matches_reference(1, 300, 2, 8, 2);
}

TEST(CausalAttention, GradCheck) {
  // B = 2, T = 5, NH = 2, HS = 3 (odd sizes everywhere).
  auto res =
      testing::gradcheck([](const std::vector<Var>& in) { return causal_attention(in[0], 2); },
                         {testing::randn_tensor({2, 5, 18}, 3)}, {});
  EXPECT_LT(res.worst_error, 1e-6) << res.worst_name;
}

TEST(CausalAttention, GradCheckLongerSequence) {
  auto res =
      testing::gradcheck([](const std::vector<Var>& in) { return causal_attention(in[0], 3); },
                         {testing::randn_tensor({1, 11, 9}, 4)}, {});
  EXPECT_LT(res.worst_error, 1e-6) << res.worst_name;
}

TEST(CausalAttention, GradCheckAcrossGemmPanels) {
  // T = 67 > 64: the score GEMMs split into a full panel and a partial one.
  auto res =
      testing::gradcheck([](const std::vector<Var>& in) { return causal_attention(in[0], 1); },
                         {testing::randn_tensor({1, 67, 6}, 9)}, {});
  EXPECT_LT(res.worst_error, 1e-6) << res.worst_name;
}

TEST(CausalAttention, BackwardAccumulatesIntoDqkv) {
  Var qkv = Var::leaf(testing::randn_tensor({2, 6, 12}, 5));
  Tensor dy = testing::randn_tensor({2, 6, 4}, 6);
  backward_with(causal_attention(qkv, 2), dy);
  std::vector<double> once = qkv.grad().to_vector();
  backward_with(causal_attention(qkv, 2), dy);
  std::vector<double> twice = qkv.grad().to_vector();
  for (size_t i = 0; i < once.size(); ++i) EXPECT_NEAR(twice[i], 2 * once[i], 1e-14) << i;
}

TEST(CausalAttention, F32MatchesF64) {
  auto f = [](const std::vector<Var>& in) { return causal_attention(in[0], 4); };
  std::vector<Tensor> in = {testing::randn_tensor({2, 64, 3 * 64}, 7)};
  auto r32 = testing::run_op(f, in, DType::kF32);
  auto r64 = testing::run_op(f, in, DType::kF64);
  for (size_t k = 0; k < r64.size(); ++k) EXPECT_LT(testing::rel_diff(r32[k], r64[k]), 1e-5) << k;
}

TEST(CausalAttention, DeterministicAcrossRunsAndThreadCounts) {
  auto f = [](const std::vector<Var>& in) { return causal_attention(in[0], 4); };
  std::vector<Tensor> in = {testing::randn_tensor({3, 64, 3 * 64}, 8)};
  auto first = testing::run_op(f, in, DType::kF32);
  EXPECT_EQ(first, testing::run_op(f, in, DType::kF32));
  testing::with_threads(1, [&] { EXPECT_EQ(first, testing::run_op(f, in, DType::kF32)); });
}

}  // namespace
}  // namespace gtron

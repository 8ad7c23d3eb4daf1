#include "model/ops/norm.h"

#include <gtest/gtest.h>

#include <cmath>

#include "tests/model/gradcheck.h"
#include "tests/model/op_check.h"

namespace gtron {
namespace {

TEST(LayerNorm, KnownVector) {
  // x = [1, 2, 3, 4]: mean 2.5, biased variance (2.25 + 0.25 + 0.25 + 2.25) / 4 = 1.25.
  Var x = Var::constant(Tensor::from_vector({1, 2, 3, 4}, {1, 4}, DType::kF64));
  Var ones = Var::constant(Tensor::from_vector({1, 1, 1, 1}, {4}, DType::kF64));
  Var zeros = Var::constant(Tensor::zeros({4}, DType::kF64));
  const double sd = std::sqrt(1.25 + kLayerNormEps);
  std::vector<double> want = {-1.5 / sd, -0.5 / sd, 0.5 / sd, 1.5 / sd};
  std::vector<double> got = layernorm(x, ones, zeros).value().to_vector();
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(got[i], want[i], 1e-15) << i;
  // -1.5 / sqrt(1.25) = -1.341640786...; the eps shifts it by ~5e-6.
  EXPECT_NEAR(got[0], -1.3416407865, 1e-5);
}

TEST(LayerNorm, GammaAndBetaApplyPerColumn) {
  // Two rows; the second is constant, so it normalizes to 0 and outputs beta.
  Var x = Var::constant(Tensor::from_vector({1, 2, 3, 4, 7, 7, 7, 7}, {2, 4}, DType::kF64));
  Var g = Var::constant(Tensor::from_vector({2, -1, 0, 1}, {4}, DType::kF64));
  Var b = Var::constant(Tensor::from_vector({0.5, 0, 1, -2}, {4}, DType::kF64));
  const double sd = std::sqrt(1.25 + kLayerNormEps);
  std::vector<double> want = {2 * -1.5 / sd + 0.5, -1 * -0.5 / sd, 1, 1.5 / sd - 2, 0.5, 0, 1, -2};
  std::vector<double> got = layernorm(x, g, b).value().to_vector();
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(got[i], want[i], 1e-15) << i;
}

TEST(RMSNorm, KnownVector) {
  // x = [1, 2, 3, 4]: mean(x²) = 30 / 4 = 7.5; gamma scales per column.
  Var x = Var::constant(Tensor::from_vector({1, 2, 3, 4}, {4}, DType::kF64));
  Var g = Var::constant(Tensor::from_vector({1, 2, 0.5, -1}, {4}, DType::kF64));
  const double rms = std::sqrt(7.5 + kRMSNormEps);
  std::vector<double> want = {1 / rms, 4 / rms, 1.5 / rms, -4 / rms};
  std::vector<double> got = rmsnorm(x, g).value().to_vector();
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(got[i], want[i], 1e-15) << i;
  EXPECT_NEAR(got[0], 0.3651483717, 1e-7);  // 1 / sqrt(7.5)
}

TEST(LayerNorm, GradCheck) {
  Parameter g("ln.weight", testing::randn_tensor({7}, 1));
  Parameter b("ln.bias", testing::randn_tensor({7}, 2));
  auto res = testing::gradcheck(
      [&](const std::vector<Var>& in) { return layernorm(in[0], Var::param(g), Var::param(b)); },
      {testing::randn_tensor({3, 5, 7}, 3)}, {&g, &b});
  EXPECT_LT(res.worst_error, 1e-6) << res.worst_name;
}

TEST(RMSNorm, GradCheck) {
  Parameter g("norm.weight", testing::randn_tensor({7}, 4));
  auto res =
      testing::gradcheck([&](const std::vector<Var>& in) { return rmsnorm(in[0], Var::param(g)); },
                         {testing::randn_tensor({3, 5, 7}, 5)}, {&g});
  EXPECT_LT(res.worst_error, 1e-6) << res.worst_name;
}

TEST(Norms, GammaReusedAccumulatesBothUses) {
  // The same gamma in two norms of one graph: main_grad must hold both contributions.
  Parameter g("g", testing::randn_tensor({5}, 6));
  Parameter b("b", testing::randn_tensor({5}, 7));
  auto res = testing::gradcheck(
      [&](const std::vector<Var>& in) {
        Var gv = Var::param(g);
        return rmsnorm(layernorm(in[0], gv, Var::param(b)), gv);
      },
      {testing::randn_tensor({4, 5}, 8)}, {&g, &b});
  EXPECT_LT(res.worst_error, 1e-6) << res.worst_name;
}

Var layernorm_of(const std::vector<Var>& in) { return layernorm(in[0], in[1], in[2]); }
Var rmsnorm_of(const std::vector<Var>& in) { return rmsnorm(in[0], in[1]); }

TEST(Norms, F32MatchesF64) {
  std::vector<Tensor> ln_in = {testing::randn_tensor({4, 64, 96}, 9, 2.0),
                               testing::randn_tensor({96}, 10), testing::randn_tensor({96}, 11)};
  auto a32 = testing::run_op(layernorm_of, ln_in, DType::kF32);
  auto a64 = testing::run_op(layernorm_of, ln_in, DType::kF64);
  for (size_t k = 0; k < a64.size(); ++k) EXPECT_LT(testing::rel_diff(a32[k], a64[k]), 1e-5) << k;

  std::vector<Tensor> rms_in = {ln_in[0], ln_in[1]};
  auto b32 = testing::run_op(rmsnorm_of, rms_in, DType::kF32);
  auto b64 = testing::run_op(rmsnorm_of, rms_in, DType::kF64);
  for (size_t k = 0; k < b64.size(); ++k) EXPECT_LT(testing::rel_diff(b32[k], b64[k]), 1e-5) << k;
}

TEST(Norms, DeterministicAcrossRunsAndThreadCounts) {
  std::vector<Tensor> in = {testing::randn_tensor({4, 64, 128}, 12),
                            testing::randn_tensor({128}, 13), testing::randn_tensor({128}, 14)};
  auto ln = testing::run_op(layernorm_of, in, DType::kF32);
  EXPECT_EQ(ln, testing::run_op(layernorm_of, in, DType::kF32));
  auto rms = testing::run_op(rmsnorm_of, {in[0], in[1]}, DType::kF32);
  EXPECT_EQ(rms, testing::run_op(rmsnorm_of, {in[0], in[1]}, DType::kF32));
  testing::with_threads(1, [&] {
    EXPECT_EQ(ln, testing::run_op(layernorm_of, in, DType::kF32));
    EXPECT_EQ(rms, testing::run_op(rmsnorm_of, {in[0], in[1]}, DType::kF32));
  });
}

}  // namespace
}  // namespace gtron

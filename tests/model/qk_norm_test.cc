#include "model/ops/qk_norm.h"

#include <gtest/gtest.h>

#include <cmath>

#include "model/ops/norm.h"
#include "tests/model/gradcheck.h"

namespace gtron {
namespace {

constexpr double kEps = 1e-6;

// Each q and k head equals rmsnorm of that head alone with its gamma; v heads pass unchanged.
TEST(QkRmsNorm, EachHeadIsAnRmsNormAndValuesPass) {
  const int NH = 4, NKV = 2;
  const int64_t HS = 6, N = 5, W = (NH + 2 * NKV) * HS;
  const Tensor x = testing::randn_tensor({N, W}, 1);
  const Tensor gq = testing::randn_tensor({HS}, 2);
  const Tensor gk = testing::randn_tensor({HS}, 3);
  const std::vector<double> got =
      qk_rmsnorm(Var::constant(x), NH, NKV, HS, Var::constant(gq), Var::constant(gk), kEps)
          .value()
          .to_vector();
  const std::vector<double> xv = x.to_vector();
  for (int64_t i = 0; i < N; ++i) {
    for (int h = 0; h < NH + 2 * NKV; ++h) {
      std::vector<double> head(xv.begin() + i * W + h * HS, xv.begin() + i * W + (h + 1) * HS);
      std::vector<double> want = head;
      if (h < NH + NKV) {
        want = rmsnorm(Var::constant(Tensor::from_vector(head, {HS}, DType::kF64)),
                       Var::constant(h < NH ? gq : gk), kEps)
                   .value()
                   .to_vector();
      }
      for (int64_t c = 0; c < HS; ++c) {
        EXPECT_NEAR(got[i * W + h * HS + c], want[c], 1e-14) << "row " << i << " head " << h;
      }
    }
  }
}

TEST(QkRmsNorm, GradCheck) {
  for (int NKV : {1, 2, 4}) {
    const int NH = 4;
    const int64_t HS = 6;
    Parameter gq("q_norm.weight", testing::randn_tensor({HS}, 4));
    Parameter gk("k_norm.weight", testing::randn_tensor({HS}, 5));
    auto res = testing::gradcheck(
        [&](const std::vector<Var>& in) {
          return qk_rmsnorm(in[0], NH, NKV, HS, Var::param(gq), Var::param(gk), kEps);
        },
        {testing::randn_tensor({2, 3, (NH + 2 * NKV) * HS}, 6)}, {&gq, &gk});
    EXPECT_LT(res.worst_error, 1e-6) << "NKV " << NKV << ": " << res.worst_name;
  }
}

}  // namespace
}  // namespace gtron

#include "model/ops/rope.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "tests/model/gradcheck.h"
#include "tests/model/op_check.h"

namespace gtron {
namespace {

constexpr double kTheta = 10000.0;

// An independent reference: scalar loops straight from the rotate-half definition, in double.
std::vector<double> reference_rope(const std::vector<double>& x, const std::vector<double>& f,
                                   int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS,
                                   int64_t pos0) {
  const int64_t W = (NH + 2 * NKV) * HS, H = HS / 2;
  std::vector<double> y = x;  // v heads pass through
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t head = 0; head < NH + NKV; ++head) {
        const int64_t base = (b * T + t) * W + head * HS;
        for (int64_t i = 0; i < H; ++i) {
          const double a = static_cast<double>(pos0 + t) * f[i];
          y[base + i] = x[base + i] * std::cos(a) - x[base + H + i] * std::sin(a);
          y[base + H + i] = x[base + H + i] * std::cos(a) + x[base + i] * std::sin(a);
        }
      }
    }
  }
  return y;
}

Var rope_of(const Var& x, int NH, int NKV, int HS, int64_t pos0) {
  return rope(x, rope_table(rope_inv_freq(HS, kTheta), x.device(), x.dtype()), NH, NKV, HS, pos0);
}

TEST(RopeInvFreq, DefaultIsThetaPower) {
  const std::vector<double> f = rope_inv_freq(8, kTheta);
  ASSERT_EQ(f.size(), 4u);
  EXPECT_EQ(f[0], 1.0);
  EXPECT_NEAR(f[1], 0.1, 1e-16);  // 10000^(-2/8)
  EXPECT_NEAR(f[2], 0.01, 1e-17);
  EXPECT_NEAR(f[3], 0.001, 1e-18);
}

TEST(RopeInvFreq, Llama3MatchesIndependentFormula) {
  // Llama 3.1's published configuration: head_dim 128, theta 500000, factor 8, low 1, high 4,
  // original 8192. The rewrite is restated here as one clamped blend, s = clamp((original/λ −
  // low)/(high − low), 0, 1) and f' = (1 − s)·f/factor + s·f, which reduces to the three bands.
  RopeLlama3Scaling sc;
  const int64_t HS = 128;
  const double theta = 500000.0;
  const std::vector<double> got = rope_inv_freq(HS, theta, &sc);
  const double pi = std::acos(-1.0);
  int divided = 0, kept = 0, blended = 0;
  for (int64_t i = 0; i < HS / 2; ++i) {
    const double f = std::exp(-std::log(theta) * static_cast<double>(2 * i) / HS);
    const double ratio = 8192.0 * f / (2 * pi);  // original / wavelength
    const double s = std::clamp((ratio - 1.0) / (4.0 - 1.0), 0.0, 1.0);
    const double want = (1 - s) * f / 8.0 + s * f;
    EXPECT_NEAR(got[i], want, 1e-15 * f) << i;
    divided += s == 0.0;
    kept += s == 1.0;
    blended += s > 0.0 && s < 1.0;
  }
  // All three bands occur in this configuration.
  EXPECT_GT(divided, 0);
  EXPECT_GT(kept, 0);
  EXPECT_GT(blended, 0);
  EXPECT_EQ(got[0], 1.0);                                          // wavelength 2π: kept
  EXPECT_NEAR(got[63], std::pow(theta, -126.0 / 128) / 8, 1e-20);  // the longest: divided
}

TEST(Rope, MatchesScalarReference) {
  for (int NKV : {1, 2, 4}) {
    const int64_t B = 2, T = 7, NH = 4, HS = 8, pos0 = 5;
    Tensor x = testing::randn_tensor({B, T, (NH + 2 * NKV) * HS}, 1);
    std::vector<double> got = rope_of(Var::constant(x), NH, NKV, HS, pos0).value().to_vector();
    std::vector<double> want =
        reference_rope(x.to_vector(), rope_inv_freq(HS, kTheta), B, T, NH, NKV, HS, pos0);
    EXPECT_LT(testing::rel_diff(got, want), 1e-15) << "NKV=" << NKV;
  }
}

TEST(Rope, PositionZeroIsIdentityAndPairsKeepTheirNorm) {
  const int NH = 4, NKV = 2, HS = 6, H = HS / 2;
  const int64_t T = 5, W = (NH + 2 * NKV) * HS;
  Tensor x = testing::randn_tensor({1, T, W}, 2);
  std::vector<double> in = x.to_vector();
  std::vector<double> out = rope_of(Var::constant(x), NH, NKV, HS, 9).value().to_vector();
  std::vector<double> at0 = rope_of(Var::constant(x), NH, NKV, HS, 0).value().to_vector();
  for (int64_t t = 0; t < T; ++t) {
    for (int head = 0; head < NH + NKV; ++head) {
      for (int i = 0; i < H; ++i) {
        const int64_t a = t * W + head * HS + i, b = a + H;
        const double before = std::hypot(in[a], in[b]), after = std::hypot(out[a], out[b]);
        EXPECT_NEAR(after, before, 1e-15 * (1 + before)) << t << " " << head << " " << i;
      }
    }
    for (int64_t c = (NH + NKV) * HS; c < W; ++c) EXPECT_EQ(out[t * W + c], in[t * W + c]);
  }
  // Row t = 0 at pos0 = 0 has angle 0 everywhere: bit-identical to its input.
  for (int64_t c = 0; c < W; ++c) EXPECT_EQ(at0[c], in[c]) << c;
}

TEST(Rope, Pos0ShiftsPositions) {
  // Rows 3.. of a sequence at pos0 = 0 equal the same rows fed alone at pos0 = 3 (generation).
  const int NH = 4, NKV = 1, HS = 8;
  const int64_t T = 7, W = (NH + 2 * NKV) * HS;
  Tensor x = testing::randn_tensor({T, W}, 3);
  std::vector<double> whole =
      rope_of(Var::constant(x.view({1, T, W})), NH, NKV, HS, 0).value().to_vector();
  std::vector<double> tail =
      rope_of(Var::constant(x.rows(3, T).view({1, T - 3, W})), NH, NKV, HS, 3).value().to_vector();
  for (int64_t k = 0; k < (T - 3) * W; ++k) ASSERT_EQ(tail[k], whole[3 * W + k]) << k;
}

TEST(Rope, GradCheck) {
  for (int NKV : {1, 2, 4}) {
    const int NH = 4, HS = 6;
    auto res = testing::gradcheck(
        [&](const std::vector<Var>& in) { return rope_of(in[0], NH, NKV, HS, 3); },
        {testing::randn_tensor({2, 5, (NH + 2 * NKV) * HS}, 4)}, {});
    EXPECT_LT(res.worst_error, 1e-6) << res.worst_name << " NKV=" << NKV;
  }
}

TEST(Rope, BackwardAccumulates) {
  Var x = Var::leaf(testing::randn_tensor({2, 5, 48}, 5));
  Tensor dy = testing::randn_tensor({2, 5, 48}, 6);
  backward_with(rope_of(x, 4, 2, 6, 1), dy);
  std::vector<double> once = x.grad().to_vector();
  backward_with(rope_of(x, 4, 2, 6, 1), dy);
  std::vector<double> twice = x.grad().to_vector();
  for (size_t i = 0; i < once.size(); ++i) EXPECT_NEAR(twice[i], 2 * once[i], 1e-15) << i;
}

TEST(Rope, RejectsOddHeadSize) {
  Var x = Var::constant(testing::randn_tensor({1, 2, 35}, 7));
  Tensor f = Tensor::zeros({2}, DType::kF64);
  EXPECT_DEATH(rope(x, f, 4, 1, 5, 0), "HS even");
}

Var rope_gqa(const std::vector<Var>& in) { return rope_of(in[0], 8, 2, 64, 17); }

TEST(Rope, F32MatchesF64) {
  std::vector<Tensor> in = {testing::randn_tensor({2, 33, 12 * 64}, 8)};
  auto r32 = testing::run_op(rope_gqa, in, DType::kF32);
  auto r64 = testing::run_op(rope_gqa, in, DType::kF64);
  for (size_t k = 0; k < r64.size(); ++k) EXPECT_LT(testing::rel_diff(r32[k], r64[k]), 1e-5) << k;
}

TEST(Rope, DeterministicAcrossRunsAndThreadCounts) {
  std::vector<Tensor> in = {testing::randn_tensor({4, 64, 12 * 64}, 9)};
  auto first = testing::run_op(rope_gqa, in, DType::kF32);
  EXPECT_EQ(first, testing::run_op(rope_gqa, in, DType::kF32));
  testing::with_threads(1, [&] { EXPECT_EQ(first, testing::run_op(rope_gqa, in, DType::kF32)); });
}

}  // namespace
}  // namespace gtron

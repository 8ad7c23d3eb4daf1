// The FP8 recipe on the CPU (model/ops/fp8.h): e4m3 rounding and saturation, power-of-two tile
// scales, both scale layouts, round trips, the emulated products against an f64 reference, and the
// straight-through backward of linear(..., fp8 = true).
#include "model/ops/fp8.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "model/cuda/gemm.h"
#include "model/ops/concat.h"
#include "model/ops/gelu.h"
#include "model/ops/linear.h"
#include "model/ops/norm.h"
#include "model/ops/swiglu.h"
#include "tests/model/gradcheck.h"

namespace gtron {
namespace {

std::vector<float> random_floats(size_t n, uint64_t seed, float std = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, std);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

TEST(Fp8, EveryCodeDecodesAndEncodesBack) {
  for (int c = 0; c < 256; ++c) {
    const uint8_t q = static_cast<uint8_t>(c);
    const float v = fp8::decode_e4m3(q);
    if ((c & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(v)) << c;
      continue;
    }
    if (c == 0x80) {  // -0 encodes back to -0
      EXPECT_EQ(fp8::encode_e4m3(v), 0x80);
      continue;
    }
    EXPECT_EQ(fp8::encode_e4m3(v), q) << c << " = " << v;
  }
  EXPECT_EQ(fp8::decode_e4m3(0x7e), 448.0f);
  EXPECT_EQ(fp8::decode_e4m3(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(fp8::decode_e4m3(0x08), std::ldexp(1.0f, -6));
}

TEST(Fp8, RoundsToNearestEvenAndSaturates) {
  std::vector<float> grid;
  for (int c = 0; c < 0x7f; ++c) grid.push_back(fp8::decode_e4m3(static_cast<uint8_t>(c)));
  for (float x : random_floats(20000, 1, 60.0f)) {
    const float a = std::fabs(x);
    const float got = std::fabs(fp8::decode_e4m3(fp8::encode_e4m3(x)));
    float best = grid[0];
    for (float g : grid)
      if (std::fabs(g - a) < std::fabs(best - a)) best = g;
    if (a >= 448.0f) best = 448.0f;
    EXPECT_EQ(got, best) << x;
    EXPECT_EQ(std::signbit(fp8::decode_e4m3(fp8::encode_e4m3(x))), std::signbit(x));
  }
  // Ties go to the even code: in [2, 4) the step is 0.25, so 2.125 sits between 2 (code 0x40)
  // and 2.25 (0x41), 2.375 between 2.25 and 2.5 (0x42).
  EXPECT_EQ(fp8::encode_e4m3(2.25f), 0x41);
  EXPECT_EQ(fp8::encode_e4m3(2.125f), 0x40);
  EXPECT_EQ(fp8::encode_e4m3(2.375f), 0x42);
  EXPECT_EQ(fp8::encode_e4m3(std::ldexp(1.0f, -10)), 0x00);  // half the smallest subnormal
  EXPECT_EQ(fp8::encode_e4m3(std::ldexp(3.0f, -10)), 0x02);  // 1.5 quanta -> 2
  EXPECT_EQ(fp8::encode_e4m3(1e6f), 0x7e);
  EXPECT_EQ(fp8::encode_e4m3(-std::numeric_limits<float>::infinity()), 0xfe);
  EXPECT_EQ(fp8::encode_e4m3(std::numeric_limits<float>::quiet_NaN()) & 0x7f, 0x7f);
}

TEST(Fp8, ScaleIsTheSmallestPowerOfTwoThatFits) {
  EXPECT_EQ(fp8::scale_exponent(0.0f), 0);
  EXPECT_EQ(fp8::scale_exponent(448.0f), 0);
  EXPECT_EQ(fp8::scale_exponent(448.5f), 1);
  EXPECT_EQ(fp8::scale_exponent(224.0f), -1);
  for (float x : random_floats(5000, 2, 1e3f)) {
    const float amax = std::fabs(x) * std::exp2(static_cast<float>(static_cast<int>(x) % 40));
    if (amax == 0.0f || !std::isfinite(amax)) continue;
    const int e = fp8::scale_exponent(amax);
    EXPECT_LE(std::ldexp(amax, -e), 448.0f) << amax;
    if (e > -126) {
      EXPECT_GT(std::ldexp(amax, 1 - e), 448.0f) << amax;
    }
  }
}

// |x - dequant(quant(x))| <= 2^-4 |x| in e4m3's normal range, else half a subnormal quantum.
void expect_close_to_source(const std::vector<float>& x, const std::vector<float>& back,
                            const std::vector<float>& scale_of) {
  for (size_t i = 0; i < x.size(); ++i) {
    const float bound = std::max(std::ldexp(std::fabs(x[i]), -4), std::ldexp(scale_of[i], -10));
    EXPECT_LE(std::fabs(back[i] - x[i]), bound) << i;
  }
}

TEST(Fp8, RowTilesRoundTripAndLayout) {
  const int64_t R = 6, K = 300;  // a tail tile of 44
  std::vector<float> x = random_floats(R * K, 3);
  for (int64_t k = 128; k < 256; ++k) x[2 * K + k] = 0.0f;   // an all-zero tile
  for (int64_t k = 256; k < K; ++k) x[4 * K + k] *= 1e-30f;  // a tiny one
  std::vector<uint8_t> q(R * K);
  std::vector<float> s(fp8::row_scale_floats(R, K)), back(R * K), scale_of(R * K);
  fp8::quantize_rows(x.data(), R, K, q.data(), s.data());
  fp8::dequantize_rows(q.data(), s.data(), R, K, back.data());
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t kb = 0; kb < fp8::tiles(K); ++kb) {
      float amax = 0.0f;
      for (int64_t k = kb * 128; k < std::min(K, kb * 128 + 128); ++k) {
        amax = std::max(amax, std::fabs(x[r * K + k]));
        scale_of[r * K + k] = s[kb * R + r];
      }
      EXPECT_EQ(s[kb * R + r], std::ldexp(1.0f, fp8::scale_exponent(amax))) << r << " " << kb;
    }
  }
  EXPECT_EQ(s[1 * R + 2], 1.0f);  // the zero tile
  expect_close_to_source(x, back, scale_of);
}

TEST(Fp8, BlocksQuantizeTheSameEitherWayRound) {
  const int64_t N = 200, K = 260;
  const std::vector<float> w = random_floats(N * K, 4, 0.02f);
  std::vector<float> wt(N * K);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) wt[k * N + n] = w[n * K + k];
  std::vector<uint8_t> q(N * K), qt(N * K);
  std::vector<float> s(fp8::block_scale_floats(N, K)), st(fp8::block_scale_floats(K, N));
  fp8::quantize_blocks(w.data(), N, K, q.data(), s.data());
  fp8::quantize_blocks(wt.data(), K, N, qt.data(), st.data());
  const int64_t ld = fp8::block_scale_ld(K), ldt = fp8::block_scale_ld(N);
  EXPECT_EQ(ld, 4);
  EXPECT_EQ(ldt, 4);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) ASSERT_EQ(q[n * K + k], qt[k * N + n]) << n << " " << k;
  for (int64_t nb = 0; nb < fp8::tiles(N); ++nb)
    for (int64_t kb = 0; kb < fp8::tiles(K); ++kb) EXPECT_EQ(s[nb * ld + kb], st[kb * ldt + nb]);
  std::vector<float> back(N * K), scale_of(N * K);
  fp8::dequantize_blocks(q.data(), s.data(), N, K, back.data());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) scale_of[n * K + k] = s[n / 128 * ld + k / 128];
  expect_close_to_source(w, back, scale_of);
}

TEST(Fp8, NonFiniteValuesPoisonTheirTileOnly) {
  const int64_t R = 2, K = 256;
  std::vector<float> x = random_floats(R * K, 5);
  x[1 * K + 3] = std::numeric_limits<float>::infinity();
  std::vector<uint8_t> q(R * K);
  std::vector<float> s(fp8::row_scale_floats(R, K));
  fp8::quantize_rows(x.data(), R, K, q.data(), s.data());
  EXPECT_TRUE(std::isnan(s[0 * R + 1]));
  EXPECT_FALSE(std::isnan(s[0 * R + 0]));
  EXPECT_FALSE(std::isnan(s[1 * R + 1]));
}

// The emulated forward against an f64 product of the unquantized operands: each operand is within
// 2^-4 (relative) of its source, so |y - y64| <= (2^-3 + 2^-8) Σ_k |x||w| (+ fp32 rounding).
TEST(Fp8, EmulatedProductWithinTheE4M3Bound) {
  const int64_t N = 16, Cin = 384, Cout = 130;
  const std::vector<float> x = random_floats(N * Cin, 6), w = random_floats(Cout * Cin, 7, 0.05f);
  std::vector<float> y(N * Cout);
  fp8::emulate_forward<float>(x.data(), w.data(), nullptr, y.data(), N, Cin, Cout);
  double worst = 0.0;
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t o = 0; o < Cout; ++o) {
      double ref = 0.0, mag = 0.0;
      for (int64_t k = 0; k < Cin; ++k) {
        ref += static_cast<double>(x[n * Cin + k]) * w[o * Cin + k];
        mag += std::fabs(static_cast<double>(x[n * Cin + k]) * w[o * Cin + k]);
      }
      const double err = std::fabs(y[n * Cout + o] - ref);
      EXPECT_LE(err, (0.125 + 1.0 / 256) * mag + 1e-5 * mag) << n << " " << o;
      worst = std::max(worst, err / mag);
    }
  }
  // Quantization errors are unbiased: the typical error is far below the worst-case bound.
  EXPECT_LT(worst, 0.05);
  EXPECT_GT(worst, 0.0);  // and it is really quantized
}

TEST(Fp8, LinearGradCheckWithIdentityQuantizers) {
  fp8::set_quantize_for_testing(false);
  Parameter w("w", testing::randn_tensor({5, 7}, 1));
  Parameter b("b", testing::randn_tensor({5}, 2));
  auto res = testing::gradcheck(
      [&](const std::vector<Var>& in) {
        return linear(in[0], Var::param(w), Var::param(b), Var(), /*fp8=*/true);
      },
      {testing::randn_tensor({2, 3, 7}, 3)}, {&w, &b});
  fp8::set_quantize_for_testing(true);
  EXPECT_LT(res.worst_error, 1e-6) << res.worst_name;
}

// Straight-through: dx = Q(dy)·Q(w) with dy in tiles along Cout; dw = Q'(dy)ᵀ·Q'(x) with both in
// tiles along the rows; db = Σ dy unquantized. Checked against the quantizers called by hand.
TEST(Fp8, LinearBackwardIsStraightThrough) {
  const int64_t N = 130, Cin = 140, Cout = 129;
  const std::vector<float> xs = random_floats(N * Cin, 8), ws = random_floats(Cout * Cin, 9, 0.1f);
  const std::vector<float> dys = random_floats(N * Cout, 10);
  std::vector<double> xd(xs.begin(), xs.end()), wd(ws.begin(), ws.end());
  Var x = Var::leaf(Tensor::from_vector(xd, {N, Cin}, DType::kF32));
  Parameter w("w", Tensor::from_vector(wd, {Cout, Cin}, DType::kF32));
  Parameter b("b", Tensor::from_vector(std::vector<double>(Cout, 0.5), {Cout}, DType::kF32));
  Var y = linear(x, Var::param(w), Var::param(b), Var(), /*fp8=*/true);
  std::vector<double> dyd(dys.begin(), dys.end());
  backward_with(y, Tensor::from_vector(dyd, {N, Cout}, DType::kF32));

  std::vector<float> dyq = dys, wq = ws;
  fp8::round_trip_rows(dyq.data(), N, Cout);
  fp8::round_trip_blocks(wq.data(), Cout, Cin);
  std::vector<float> dx(N * Cin, 0.0f);
  cpu::linear_backward<float>(xs.data(), wq.data(), dyq.data(), dx.data(), nullptr, nullptr, N, Cin,
                              Cout);
  EXPECT_EQ(x.grad().to_vector(), std::vector<double>(dx.begin(), dx.end()));

  auto cols = [&](std::vector<float> v, int64_t R, int64_t C) {  // tiles along R
    std::vector<float> t(R * C);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c) t[c * R + r] = v[r * C + c];
    fp8::round_trip_rows(t.data(), C, R);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c) v[r * C + c] = t[c * R + r];
    return v;
  };
  const std::vector<float> dyc = cols(dys, N, Cout), xc = cols(xs, N, Cin);
  std::vector<float> dw(Cout * Cin, 0.0f);
  cpu::linear_backward<float>(xc.data(), ws.data(), dyc.data(), nullptr, dw.data(), nullptr, N, Cin,
                              Cout);
  // db into aligned memory, as b's gradient is: Eigen's vectorized column sum peels columns by the
  // destination's alignment, so the order of each column's sum (its last bits) follows where a
  // std::vector happens to land on the heap.
  Tensor db = Tensor::zeros({Cout}, DType::kF32, Device::cpu());
  cpu::linear_backward<float>(xs.data(), ws.data(), dys.data(), nullptr, nullptr, db.data<float>(),
                              N, Cin, Cout);
  EXPECT_EQ(w.grad().to_vector(), std::vector<double>(dw.begin(), dw.end()));
  EXPECT_EQ(b.grad().to_vector(), db.to_vector());
}

// Note [fp8 fused producers]: the producers write FP8 codes on CUDA in bf16 only (the codes
// themselves: tests/model/fp8_fused_cuda_test.cc); asked for them on the CPU, each refuses by
// name instead of handing back no codes. The process-wide switch is on unless a test turns it off.
TEST(Fp8DeathTest, ProducersRefuseCodesOffCuda) {
  const Var x = Var::constant(testing::randn_tensor({4, 256}, 1, 1.0, DType::kF32));
  const Var g = Var::constant(testing::randn_tensor({256}, 2, 1.0, DType::kF32));
  fp8::QuantizedRows codes;
  EXPECT_DEATH(rmsnorm(x, g, 1e-5, &codes), "rmsnorm: fp8 codes of the output on CUDA");
  EXPECT_DEATH(layernorm(x, g, g, 1e-5, &codes), "layernorm: fp8 codes of the output on CUDA");
  EXPECT_DEATH(swiglu(x, &codes), "swiglu: fp8 codes of the output on CUDA");
  EXPECT_DEATH(gelu(x, &codes), "gelu: fp8 codes of the output on CUDA");
  EXPECT_DEATH(concat_features(x, x, &codes), "concat_features: fp8 codes of the output on CUDA");
  EXPECT_FALSE(codes.q.defined());
  EXPECT_TRUE(fp8::fused_producers());
  fp8::set_fused_producers_for_testing(false);
  EXPECT_FALSE(fp8::fused_producers());
  fp8::set_fused_producers_for_testing(true);
}

// The FP8 linear hands a biased layer's bias (GPT-2's) to its forward product: gemm's argument
// check takes it, in the output's type or f32 (an empty problem returns before touching a GPU).
// It once refused any bias with fp8, so every biased FP8 linear aborted on its first forward.
TEST(Fp8, GemmArgumentsTakeTheLinearsBias) {
  float scale = 1.0f;
  uint8_t codes[16] = {};
  cuda::GemmArgs g;
  g.fp8 = true;
  g.a = codes;
  g.b = codes;
  g.trans_b = true;
  g.scale_a = &scale;
  g.scale_b = &scale;
  g.b_scales = cuda::Fp8Scales::kBlocks;
  g.c = codes;
  g.c_type = DType::kBF16;
  g.m = 0;
  g.n = 128;
  g.k = 128;
  g.bias = &scale;
  for (DType bias_type : {DType::kBF16, DType::kF32}) {
    g.bias_type = bias_type;
    EXPECT_TRUE(cuda::try_gemm(g, nullptr)) << dtype_name(bias_type);
  }
}

}  // namespace
}  // namespace gtron

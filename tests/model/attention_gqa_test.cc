// Grouped-query attention (causal_attention_gqa) on the CPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "model/ops/attention.h"
#include "tests/model/gradcheck.h"
#include "tests/model/op_check.h"

namespace gtron {
namespace {

int64_t width(int NH, int NKV, int HS) { return (NH + 2 * int64_t{NKV}) * HS; }

// The GQA rows [B·T, (NH + 2·NKV)·HS] rewritten as GPT-2 rows [B·T, 3·NH·HS] in which every query
// head h gets its own copy of k/v head h / (NH / NKV).
std::vector<double> repeat_kv(const std::vector<double>& x, int64_t rows, int NH, int NKV, int HS) {
  const int64_t W = width(NH, NKV, HS), C = int64_t{NH} * HS, G = NH / NKV;
  std::vector<double> out(static_cast<size_t>(rows * 3 * C));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t h = 0; h < NH; ++h) {
      for (int64_t i = 0; i < HS; ++i) {
        const double* in = x.data() + r * W;
        double* o = out.data() + r * 3 * C;
        o[h * HS + i] = in[h * HS + i];
        o[C + h * HS + i] = in[C + (h / G) * HS + i];
        o[2 * C + h * HS + i] = in[C + (NKV + h / G) * HS + i];
      }
    }
  }
  return out;
}

TEST(CausalAttentionGqa, MatchesRepeatedKvReference) {
  const int64_t B = 2, T = 7;
  const int NH = 4, HS = 8;
  for (int NKV : {1, 2, 4}) {
    Tensor qkv = testing::randn_tensor({B, T, width(NH, NKV, HS)}, 1);
    std::vector<double> got =
        causal_attention_gqa(Var::constant(qkv), NH, NKV, HS).value().to_vector();
    std::vector<double> want =
        testing::reference_attention(repeat_kv(qkv.to_vector(), B * T, NH, NKV, HS), B, T, NH, HS);
    EXPECT_LT(testing::rel_diff(got, want), 1e-13) << "NKV=" << NKV;
  }
}

TEST(CausalAttentionGqa, GradientIsTheRepeatedHeadsGradientSummed) {
  // Through the repetition, a shared k/v head's gradient is the sum of its copies' gradients; the
  // copies' gradients come from causal_attention on the repeated rows.
  const int64_t B = 2, T = 5;
  const int NH = 4, NKV = 2, HS = 6, G = NH / NKV;
  const int64_t C = int64_t{NH} * HS, W = width(NH, NKV, HS);
  Tensor x = testing::randn_tensor({B, T, W}, 2);
  Tensor dy = testing::randn_tensor({B, T, C}, 3);
  Var gqa = Var::leaf(x);
  backward_with(causal_attention_gqa(gqa, NH, NKV, HS), dy);
  Var mha = Var::leaf(Tensor::from_vector(repeat_kv(x.to_vector(), B * T, NH, NKV, HS),
                                          {B, T, 3 * C}, DType::kF64));
  backward_with(causal_attention(mha, NH), dy);
  std::vector<double> got = gqa.grad().to_vector(), rep = mha.grad().to_vector();
  std::vector<double> want(got.size(), 0.0);
  for (int64_t r = 0; r < B * T; ++r) {
    for (int64_t h = 0; h < NH; ++h) {
      for (int64_t i = 0; i < HS; ++i) {
        const double* d = rep.data() + r * 3 * C;
        double* w = want.data() + r * W;
        w[h * HS + i] = d[h * HS + i];
        w[C + (h / G) * HS + i] += d[C + h * HS + i];
        w[C + (NKV + h / G) * HS + i] += d[2 * C + h * HS + i];
      }
    }
  }
  EXPECT_LT(testing::rel_diff(got, want), 1e-13);
}

TEST(CausalAttentionGqa, AllHeadsDistinctIsCausalAttentionBitForBit) {
  const int NH = 4, HS = 6;
  std::vector<Tensor> in = {testing::randn_tensor({2, 7, width(NH, NH, HS)}, 4)};
  for (DType dt : {DType::kF64, DType::kF32}) {
    auto gqa = testing::run_op(
        [&](const std::vector<Var>& v) { return causal_attention_gqa(v[0], NH, NH, HS); }, in, dt);
    auto mha = testing::run_op(
        [&](const std::vector<Var>& v) { return causal_attention(v[0], NH); }, in, dt);
    EXPECT_EQ(gqa, mha) << dtype_name(dt);
  }
}

TEST(CausalAttentionGqa, GradCheck) {
  for (int NKV : {1, 2, 4}) {
    const int NH = 4, HS = 6;
    auto res = testing::gradcheck(
        [&](const std::vector<Var>& in) { return causal_attention_gqa(in[0], NH, NKV, HS); },
        {testing::randn_tensor({2, 5, width(NH, NKV, HS)}, 5)}, {});
    EXPECT_LT(res.worst_error, 1e-6) << res.worst_name << " NKV=" << NKV;
  }
}

TEST(CausalAttentionGqa, GradCheckLongerSequence) {
  auto res = testing::gradcheck(
      [](const std::vector<Var>& in) { return causal_attention_gqa(in[0], 4, 1, 8); },
      {testing::randn_tensor({2, 7, width(4, 1, 8)}, 6)}, {});
  EXPECT_LT(res.worst_error, 1e-6) << res.worst_name;
}

TEST(CausalAttentionGqa, BackwardAccumulatesIntoDqkv) {
  Var qkv = Var::leaf(testing::randn_tensor({2, 6, width(4, 2, 6)}, 7));
  Tensor dy = testing::randn_tensor({2, 6, 24}, 8);
  backward_with(causal_attention_gqa(qkv, 4, 2, 6), dy);
  std::vector<double> once = qkv.grad().to_vector();
  backward_with(causal_attention_gqa(qkv, 4, 2, 6), dy);
  std::vector<double> twice = qkv.grad().to_vector();
  for (size_t i = 0; i < once.size(); ++i) EXPECT_NEAR(twice[i], 2 * once[i], 1e-14) << i;
}

TEST(CausalAttentionGqa, RejectsBadHeadCounts) {
  Var qkv = Var::constant(testing::randn_tensor({1, 3, width(4, 3, 6)}, 9));
  EXPECT_DEATH(causal_attention_gqa(qkv, 4, 3, 6), "must divide NH = 4");
  Var odd = Var::constant(testing::randn_tensor({1, 3, width(4, 2, 5)}, 9));
  EXPECT_DEATH(causal_attention_gqa(odd, 4, 2, 5), "must be even");
}

Var gqa_of(const std::vector<Var>& in) { return causal_attention_gqa(in[0], 8, 2, 32); }

TEST(CausalAttentionGqa, F32MatchesF64) {
  std::vector<Tensor> in = {testing::randn_tensor({2, 64, width(8, 2, 32)}, 10)};
  auto r32 = testing::run_op(gqa_of, in, DType::kF32);
  auto r64 = testing::run_op(gqa_of, in, DType::kF64);
  for (size_t k = 0; k < r64.size(); ++k) EXPECT_LT(testing::rel_diff(r32[k], r64[k]), 1e-5) << k;
}

TEST(CausalAttentionGqa, DeterministicAcrossRunsAndThreadCounts) {
  std::vector<Tensor> in = {testing::randn_tensor({3, 64, width(8, 2, 32)}, 11)};
  auto first = testing::run_op(gqa_of, in, DType::kF32);
  EXPECT_EQ(first, testing::run_op(gqa_of, in, DType::kF32));
  testing::with_threads(1, [&] { EXPECT_EQ(first, testing::run_op(gqa_of, in, DType::kF32)); });
}

}  // namespace
}  // namespace gtron

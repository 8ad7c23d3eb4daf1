// MoE dispatch and combine (model/ops/moe_dispatch.h): the plan's stable (expert, token) order,
// values against a scalar reference, f64 gradient checks, accumulation, reruns.
#include "model/ops/moe_dispatch.h"

#include <gtest/gtest.h>

#include "tests/model/gradcheck.h"
#include "tests/model/op_check.h"

namespace gtron {
namespace {

// N = 4 tokens, k = 2, E = 3 (expert 1 receives nothing).
Tensor example_ids() { return Tensor::from_ints({2, 0, 0, 2, 2, 0, 0, 2}, {4, 2}); }

TEST(MoePlan, StableByExpertThenToken) {
  int64_t load[3] = {10, 20, 30};
  MoePlan p = moe_plan(example_ids(), 3, load);
  // Expert 0: slots 1, 2, 5, 6 (tokens 0, 1, 2, 3); expert 2: slots 0, 3, 4, 7.
  EXPECT_EQ(p.offsets.to_vector(), (std::vector<double>{0, 4, 4, 8}));
  EXPECT_EQ(p.src.to_vector(), (std::vector<double>{1, 2, 5, 6, 0, 3, 4, 7}));
  EXPECT_EQ(p.pos.to_vector(), (std::vector<double>{4, 0, 1, 5, 6, 2, 3, 7}));
  EXPECT_EQ(load[0], 14);
  EXPECT_EQ(load[1], 20);
  EXPECT_EQ(load[2], 34);
}

TEST(MoeCombine, MatchesScalarReference) {
  const int64_t C = 3;
  MoePlan p = moe_plan(example_ids(), 3);
  Tensor yp = testing::randn_tensor({8, C}, 1);
  Tensor g = testing::randn_tensor({4, 2}, 2);
  std::vector<double> y =
      moe_combine(Var::constant(yp), Var::constant(g), p, Shape{2, 2, C}).value().to_vector();
  std::vector<double> ypv = yp.to_vector(), gv = g.to_vector(), pos = p.pos.to_vector();
  for (int n = 0; n < 4; ++n) {
    for (int c = 0; c < C; ++c) {
      double want = 0;
      for (int j = 0; j < 2; ++j)
        want += gv[n * 2 + j] * ypv[static_cast<int>(pos[n * 2 + j]) * C + c];
      EXPECT_NEAR(y[n * C + c], want, 1e-15);
    }
  }
  std::vector<double> xp = moe_dispatch(Var::constant(yp.rows(0, 4)), p).value().to_vector();
  for (int r = 0; r < 8; ++r) {
    const int token = static_cast<int>(p.src.to_vector()[r]) / 2;
    for (int c = 0; c < C; ++c) EXPECT_EQ(xp[r * C + c], ypv[token * C + c]);
  }
}

TEST(MoeDispatchCombine, GradCheck) {
  MoePlan p = moe_plan(example_ids(), 3);
  auto dispatch = [&](const std::vector<Var>& in) { return moe_dispatch(in[0], p); };
  auto r1 = testing::gradcheck(dispatch, {testing::randn_tensor({2, 2, 5}, 3)}, {});
  EXPECT_LT(r1.worst_error, 1e-8) << r1.worst_name;
  auto combine = [&](const std::vector<Var>& in) {
    return moe_combine(in[0], in[1], p, Shape{4, 5});
  };
  auto r2 = testing::gradcheck(
      combine, {testing::randn_tensor({8, 5}, 4), testing::randn_tensor({4, 2}, 5)}, {});
  EXPECT_LT(r2.worst_error, 1e-8) << r2.worst_name;
  // The two around an elementwise op, as the MoE MLP composes them (x reaches y through k paths).
  auto round_trip = [&](const std::vector<Var>& in) {
    return moe_combine(moe_dispatch(in[0], p), in[1], p, Shape{4, 5});
  };
  auto r3 = testing::gradcheck(
      round_trip, {testing::randn_tensor({4, 5}, 6), testing::randn_tensor({4, 2}, 7)}, {});
  EXPECT_LT(r3.worst_error, 1e-8) << r3.worst_name;
}

TEST(MoeDispatchCombine, BackwardAccumulates) {
  MoePlan p = moe_plan(example_ids(), 3);
  Var x = Var::leaf(testing::randn_tensor({4, 5}, 8));
  Var g = Var::leaf(testing::randn_tensor({4, 2}, 9));
  Tensor dy = testing::randn_tensor({4, 5}, 10);
  backward_with(moe_combine(moe_dispatch(x, p), g, p, Shape{4, 5}), dy);
  std::vector<double> x1 = x.grad().to_vector(), g1 = g.grad().to_vector();
  backward_with(moe_combine(moe_dispatch(x, p), g, p, Shape{4, 5}), dy);
  std::vector<double> x2 = x.grad().to_vector(), g2 = g.grad().to_vector();
  for (size_t i = 0; i < x1.size(); ++i) EXPECT_DOUBLE_EQ(x2[i], 2 * x1[i]);
  for (size_t i = 0; i < g1.size(); ++i) EXPECT_DOUBLE_EQ(g2[i], 2 * g1[i]);
}

TEST(MoeDispatchCombine, DeterministicAcrossRunsAndThreadCounts) {
  const int64_t N = 1024, C = 64;
  std::vector<int32_t> ids(static_cast<size_t>(N * 2));
  for (int64_t n = 0; n < N; ++n) {
    ids[static_cast<size_t>(2 * n)] = static_cast<int32_t>((n * 7) % 8);
    ids[static_cast<size_t>(2 * n + 1)] = static_cast<int32_t>((n * 7 + 3) % 8);
  }
  MoePlan p = moe_plan(Tensor::from_ints(ids, {N, 2}), 8);
  auto f = [&](const std::vector<Var>& in) {
    return moe_combine(moe_dispatch(in[0], p), in[1], p, Shape{N, C});
  };
  std::vector<Tensor> in = {testing::randn_tensor({N, C}, 11), testing::randn_tensor({N, 2}, 12)};
  auto first = testing::run_op(f, in, DType::kF32);
  EXPECT_EQ(first, testing::run_op(f, in, DType::kF32));
  testing::with_threads(1, [&] { EXPECT_EQ(first, testing::run_op(f, in, DType::kF32)); });
}

}  // namespace
}  // namespace gtron

#include "model/ops/linear.h"

#include <gtest/gtest.h>

#include "model/ops/add.h"
#include "tests/model/gradcheck.h"

namespace gtron {
namespace {

TEST(Linear, KnownValues) {
  // x = [[1, 2]], W = [[1, 0], [0, 1], [1, 1]], b = [0.5, -1, 0] -> y = [[1.5, 1, 3]]
  Var x = Var::constant(Tensor::from_vector({1, 2}, {1, 2}, DType::kF32));
  Var w = Var::constant(Tensor::from_vector({1, 0, 0, 1, 1, 1}, {3, 2}, DType::kF32));
  Var b = Var::constant(Tensor::from_vector({0.5, -1, 0}, {3}, DType::kF32));
  std::vector<double> y = linear(x, w, b).value().to_vector();
  EXPECT_EQ(y, (std::vector<double>{1.5, 1, 3}));
}

TEST(Linear, GradCheck) {
  Parameter w("w", testing::randn_tensor({5, 7}, 1));
  Parameter b("b", testing::randn_tensor({5}, 2));
  auto res = testing::gradcheck(
      [&](const std::vector<Var>& in) { return linear(in[0], Var::param(w), Var::param(b)); },
      {testing::randn_tensor({2, 3, 7}, 3)}, {&w, &b});
  EXPECT_LT(res.worst_error, 1e-6) << res.worst_name;
}

TEST(Linear, RepeatedUseAccumulatesEveryUse) {
  // y = W(W x): the weight is used twice, so main_grad must hold both contributions.
  Parameter w("w", testing::randn_tensor({4, 4}, 5));
  auto res = testing::gradcheck(
      [&](const std::vector<Var>& in) {
        Var wv = Var::param(w);
        return linear(linear(in[0], wv, Var()), wv, Var());
      },
      {testing::randn_tensor({3, 4}, 6)}, {&w});
  EXPECT_LT(res.worst_error, 1e-6) << res.worst_name;
}

TEST(Add, GradCheckAndValues) {
  Var a = Var::constant(Tensor::from_vector({1, 2, 3}, {3}, DType::kF64));
  Var b = Var::constant(Tensor::from_vector({10, 20, 30}, {3}, DType::kF64));
  EXPECT_EQ(add(a, b).value().to_vector(), (std::vector<double>{11, 22, 33}));
  auto res =
      testing::gradcheck([&](const std::vector<Var>& in) { return add(in[0], add(in[0], in[1])); },
                         {testing::randn_tensor({4, 3}, 8), testing::randn_tensor({4, 3}, 9)}, {});
  EXPECT_LT(res.worst_error, 1e-6) << res.worst_name;
}

TEST(NoGrad, RecordsNothing) {
  Parameter w("w", testing::randn_tensor({2, 2}, 1));
  clear_tape();
  {
    NoGradGuard ng;
    linear(Var::constant(testing::randn_tensor({1, 2}, 2)), Var::param(w), Var());
  }
  EXPECT_EQ(tape_size(), 0u);
  linear(Var::constant(testing::randn_tensor({1, 2}, 2)), Var::param(w), Var());
  EXPECT_EQ(tape_size(), 2u);  // the weight's use accounting, then linear's backward
  clear_tape();
}

}  // namespace
}  // namespace gtron

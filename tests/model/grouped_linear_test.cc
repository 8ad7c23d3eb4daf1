// grouped_linear (model/ops/grouped_linear.h): each group is linear's product over its rows
// (bit for bit, FP8 emulation included), empty groups, f64 gradient checks, accumulation.
#include "model/ops/grouped_linear.h"

#include <gtest/gtest.h>

#include "model/ops/linear.h"
#include "tests/model/gradcheck.h"
#include "tests/model/op_check.h"

namespace gtron {
namespace {

// 9 rows in groups of 4, 0 and 5.
Tensor example_offsets() { return Tensor::from_ints({0, 4, 4, 9}, {4}); }

TEST(GroupedLinear, EachGroupIsLinearBitForBit) {
  for (bool fp8 : {false, true}) {
    SCOPED_TRACE(fp8 ? "fp8" : "fp32");
    Tensor x = testing::randn_tensor({9, 6}, 1, 1.0, DType::kF32);
    std::vector<Var> ws;
    for (uint64_t g = 0; g < 3; ++g) {
      ws.push_back(Var::constant(testing::randn_tensor({5, 6}, 2 + g, 1.0, DType::kF32)));
    }
    std::vector<double> y =
        grouped_linear(Var::constant(x), ws, example_offsets(), fp8).value().to_vector();
    std::vector<double> a =
        linear(Var::constant(x.rows(0, 4)), ws[0], Var(), Var(), fp8).value().to_vector();
    std::vector<double> b =
        linear(Var::constant(x.rows(4, 9)), ws[2], Var(), Var(), fp8).value().to_vector();
    a.insert(a.end(), b.begin(), b.end());
    EXPECT_EQ(y, a);
  }
}

TEST(GroupedLinear, GradCheck) {
  auto f = [](const std::vector<Var>& in) {
    return grouped_linear(in[0], {in[1], in[2], in[3]}, example_offsets());
  };
  auto res =
      testing::gradcheck(f,
                         {testing::randn_tensor({9, 6}, 3), testing::randn_tensor({5, 6}, 4),
                          testing::randn_tensor({5, 6}, 5), testing::randn_tensor({5, 6}, 6)},
                         {});
  EXPECT_LT(res.worst_error, 1e-8) << res.worst_name;
}

TEST(GroupedLinear, BackwardAccumulatesAndLeavesEmptyGroupsAlone) {
  Var x = Var::leaf(testing::randn_tensor({9, 6}, 7));
  std::vector<Var> ws;
  for (uint64_t g = 0; g < 3; ++g) ws.push_back(Var::leaf(testing::randn_tensor({5, 6}, 8 + g)));
  Tensor dy = testing::randn_tensor({9, 5}, 11);
  backward_with(grouped_linear(x, ws, example_offsets()), dy);
  std::vector<double> x1 = x.grad().to_vector(), w1 = ws[2].grad().to_vector();
  for (double v : ws[1].grad().to_vector()) EXPECT_EQ(v, 0.0);
  backward_with(grouped_linear(x, ws, example_offsets()), dy);
  std::vector<double> x2 = x.grad().to_vector(), w2 = ws[2].grad().to_vector();
  for (size_t i = 0; i < x1.size(); ++i) EXPECT_DOUBLE_EQ(x2[i], 2 * x1[i]);
  for (size_t i = 0; i < w1.size(); ++i) EXPECT_DOUBLE_EQ(w2[i], 2 * w1[i]);
}

TEST(GroupedLinear, RejectsOffsetsThatDoNotSpanTheRows) {
  Var x = Var::constant(testing::randn_tensor({9, 6}, 12));
  Var w = Var::constant(testing::randn_tensor({5, 6}, 13));
  EXPECT_DEATH(grouped_linear(x, {w, w}, Tensor::from_ints({0, 4, 8}, {3})), "offsets span");
}

}  // namespace
}  // namespace gtron

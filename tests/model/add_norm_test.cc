// add_layernorm on the CPU: the composed ops (add, then layernorm), checked by finite differences
// in f64 through both outputs, and against add and layernorm called by hand.
#include "model/ops/add_norm.h"

#include <gtest/gtest.h>

#include "model/ops/add.h"
#include "model/ops/gelu.h"
#include "tests/model/gradcheck.h"

namespace gtron {
namespace {

TEST(AddLayerNorm, GradCheckThroughBothOutputs) {
  // h feeds the residual path and y a GELU, as in the block: every input's gradient sums both.
  Parameter g("ln.weight", testing::randn_tensor({7}, 1));
  Parameter b("ln.bias", testing::randn_tensor({7}, 2));
  auto res = testing::gradcheck(
      [&](const std::vector<Var>& in) {
        const AddNorm r = add_layernorm(in[0], in[1], Var::param(g), Var::param(b));
        return add(r.h, gelu(r.y));
      },
      {testing::randn_tensor({3, 5, 7}, 3), testing::randn_tensor({3, 5, 7}, 4)}, {&g, &b});
  EXPECT_LT(res.worst_error, 1e-6) << res.worst_name;
}

TEST(AddLayerNorm, EqualsAddThenLayerNorm) {
  Var x = Var::constant(testing::randn_tensor({4, 9}, 5, 1.0, DType::kF32));
  Var a = Var::constant(testing::randn_tensor({4, 9}, 6, 1.0, DType::kF32));
  Var g = Var::constant(testing::randn_tensor({9}, 7, 1.0, DType::kF32));
  Var b = Var::constant(testing::randn_tensor({9}, 8, 1.0, DType::kF32));
  const AddNorm r = add_layernorm(x, a, g, b);
  const Var h = add(x, a);
  EXPECT_EQ(r.h.value().to_vector(), h.value().to_vector());
  EXPECT_EQ(r.y.value().to_vector(), layernorm(h, g, b).value().to_vector());
}

}  // namespace
}  // namespace gtron

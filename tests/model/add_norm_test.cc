// add_layernorm and add_rmsnorm on the CPU: the composed ops (add, then the norm), checked by
// finite differences in f64 through both outputs, and against add and the norm called by hand
// (the same tape: one node each for the add and the norm).
#include "model/ops/add_norm.h"

#include <gtest/gtest.h>

#include "model/ops/add.h"
#include "model/ops/gelu.h"
#include "model/ops/norm.h"
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

TEST(AddRMSNorm, GradCheckThroughBothOutputs) {
  // As the llama block: h feeds the residual path, y the MLP (here a GELU).
  Parameter g("mlp_norm.weight", testing::randn_tensor({7}, 1));
  for (double eps : {kRMSNormEps, 1e-5}) {
    auto res = testing::gradcheck(
        [&](const std::vector<Var>& in) {
          const AddNorm r = add_rmsnorm(in[0], in[1], Var::param(g), eps);
          return add(r.h, gelu(r.y));
        },
        {testing::randn_tensor({3, 5, 7}, 3), testing::randn_tensor({3, 5, 7}, 4)}, {&g});
    EXPECT_LT(res.worst_error, 1e-6) << res.worst_name << " eps " << eps;
  }
  // Only the norm consumes (h's residual gradient starts from nothing), and add_rmsnorm(x, x).
  auto norm_only = testing::gradcheck(
      [&](const std::vector<Var>& in) { return gelu(add_rmsnorm(in[0], in[1], Var::param(g)).y); },
      {testing::randn_tensor({4, 7}, 5), testing::randn_tensor({4, 7}, 6)}, {&g});
  EXPECT_LT(norm_only.worst_error, 1e-6) << norm_only.worst_name;
  auto same = testing::gradcheck(
      [&](const std::vector<Var>& in) {
        const AddNorm r = add_rmsnorm(in[0], in[0], Var::param(g));
        return add(r.h, gelu(r.y));
      },
      {testing::randn_tensor({4, 7}, 7)}, {&g});
  EXPECT_LT(same.worst_error, 1e-6) << same.worst_name;
}

// The CPU op is add then rmsnorm: outputs, and the gradients of x, a and gamma, bit for bit in
// f32 (the llama block's CPU tape, and so the CPU goldens, do not move).
TEST(AddRMSNorm, EqualsAddThenRMSNormBitForBit) {
  const Tensor xv = testing::randn_tensor({4, 9}, 5, 1.0, DType::kF32);
  const Tensor av = testing::randn_tensor({4, 9}, 6, 1.0, DType::kF32);
  const Tensor dy = testing::randn_tensor({4, 9}, 9, 1.0, DType::kF32);
  Parameter g("g", testing::randn_tensor({9}, 7, 1.0, DType::kF32));
  auto run = [&](bool fused) {
    g.zero_grad();
    Var x = Var::leaf(xv.clone());
    Var a = Var::leaf(av.clone());
    Var h, y;
    if (fused) {
      const AddNorm r = add_rmsnorm(x, a, Var::param(g), 1e-5);
      h = r.h;
      y = r.y;
    } else {
      h = add(x, a);
      y = rmsnorm(h, Var::param(g), 1e-5);
    }
    Var out = add(h, gelu(y));
    backward_with(out, dy);
    return std::vector<std::vector<double>>{h.value().to_vector(), y.value().to_vector(),
                                            x.grad().to_vector(), a.grad().to_vector(),
                                            g.main_grad.to_vector()};
  };
  const auto fused = run(true);
  const auto composed = run(false);
  const char* names[] = {"h", "y", "dx", "da", "dgamma"};
  for (size_t i = 0; i < fused.size(); ++i) EXPECT_EQ(fused[i], composed[i]) << names[i];
}

}  // namespace
}  // namespace gtron

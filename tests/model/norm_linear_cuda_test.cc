// layernorm_linear (model/ops/norm_linear.h) against layernorm → linear on the GPU: the output and
// every gradient bit for bit, in f32 and bf16 (GPU test; skipped without a GPU).
#include <gtest/gtest.h>

#include <vector>

#include "model/ops/linear.h"
#include "model/ops/norm.h"
#include "model/ops/norm_linear.h"
#include "tests/model/cuda_op_check.h"
#include "tests/model/gradcheck.h"

namespace gtron {
namespace {

// A value on the GPU in `act`; parameters carry f32 gradient slots (main_grad-like), and the
// input's slot starts non-zero so the accumulate contract is checked too.
Var gpu_var(const std::vector<int64_t>& shape, uint64_t seed, double std, DType act, bool param) {
  Tensor v =
      testing::randn_tensor(Shape(shape), seed, std, DType::kF32).to(act).to(Device::cuda(0));
  Var x = param ? Var::external(v) : Var::leaf(v);
  const DType g = param ? DType::kF32 : act;
  x.set_grad(
      testing::randn_tensor(Shape(shape), seed + 100, 0.01, DType::kF32).to(g).to(Device::cuda(0)));
  return x;
}

std::vector<std::vector<double>> run(DType act, bool fused) {
  const int64_t N = 45, C = 64, Cout = 192;
  Var x = gpu_var({N, C}, 1, 1.0, act, false);
  Var gamma = gpu_var({C}, 2, 0.2, DType::kF32, true);
  Var beta = gpu_var({C}, 3, 0.2, DType::kF32, true);
  Var w = gpu_var({Cout, C}, 4, 0.1, act, true);
  Var b = gpu_var({Cout}, 5, 0.1, act, true);
  Var y = fused ? layernorm_linear(x, gamma, beta, w, b) : linear(layernorm(x, gamma, beta), w, b);
  backward_with(y,
                testing::randn_tensor(y.shape(), 6, 1.0, DType::kF32).to(act).to(Device::cuda(0)));
  std::vector<std::vector<double>> out;
  const std::vector<const Tensor*> results = {&y.value(),   &x.grad(), &gamma.grad(),
                                              &beta.grad(), &w.grad(), &b.grad()};
  for (const Tensor* t : results) {
    Tensor h = t->to(Device::cpu()).to(DType::kF64);
    out.emplace_back(h.data<double>(), h.data<double>() + h.numel());
  }
  return out;
}

TEST(NormLinearCuda, EqualsLayerNormThenLinearBitForBit) {
  GTRON_REQUIRE_GPU();
  for (DType act : {DType::kF32, DType::kBF16}) {
    const auto fused = run(act, true);
    const auto composed = run(act, false);
    const char* names[] = {"y", "dx", "dgamma", "dbeta", "dw", "db"};
    for (size_t i = 0; i < fused.size(); ++i) {
      EXPECT_EQ(fused[i], composed[i]) << names[i] << " " << dtype_name(act);
    }
  }
}

}  // namespace
}  // namespace gtron

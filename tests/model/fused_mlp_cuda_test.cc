// The fused GELU MLP (model/ops/fused_mlp.h) against the composed linear → gelu → linear on the
// GPU in bf16: output and every gradient, plus bit-identical reruns (GPU test; skipped without a
// GPU).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "model/ops/add.h"
#include "model/ops/fused_mlp.h"
#include "model/ops/gelu.h"
#include "model/ops/linear.h"
#include "tests/model/cuda_op_check.h"
#include "tests/model/gradcheck.h"

namespace gtron {
namespace {

struct Mlp {
  Var x, w1, b1, w2, b2, r;  // r: the residual [N, C]
};

// bf16 values on the GPU; weights and biases carry f32 gradient slots (main_grad-like).
Var gpu_input(const std::vector<int64_t>& shape, uint64_t seed, double std, bool f32_grad) {
  Tensor v = testing::randn_tensor(Shape(shape), seed, std, DType::kF32)
                 .to(DType::kBF16)
                 .to(Device::cuda(0));
  if (!f32_grad) return Var::leaf(v);
  Var p = Var::external(v);
  p.set_grad(Tensor::zeros(Shape(shape), DType::kF32, Device::cuda(0)));
  return p;
}

Mlp make(int64_t N, int64_t C) {
  return {gpu_input({N, C}, 1, 1.0, false),  gpu_input({4 * C, C}, 2, 0.05, true),
          gpu_input({4 * C}, 3, 0.05, true), gpu_input({C, 4 * C}, 4, 0.05, true),
          gpu_input({C}, 5, 0.05, true),     gpu_input({N, C}, 7, 1.0, false)};
}

// residual: y = r + mlp(x), the residual in mlp_proj's epilogue (fused) or added after it.
std::vector<std::vector<double>> run(int64_t N, int64_t C, bool fused, bool residual = false) {
  Mlp m = make(N, C);
  Var y;
  if (fused) {
    y = linear_after_gelu(linear_gelu_up(m.x, m.w1, m.b1), m.w2, m.b2, residual ? m.r : Var());
  } else {
    y = linear(gelu(linear(m.x, m.w1, m.b1)), m.w2, m.b2);
    if (residual) y = add(m.r, y);
  }
  const Tensor dy =
      testing::randn_tensor(y.shape(), 6, 1.0, DType::kF32).to(DType::kBF16).to(Device::cuda(0));
  backward_with(y, dy);
  std::vector<std::vector<double>> out;
  const std::vector<const Tensor*> results = {&y.value(),   &m.x.grad(),  &m.w1.grad(),
                                              &m.b1.grad(), &m.w2.grad(), &m.b2.grad()};
  std::vector<const Tensor*> all = results;
  if (residual) all.push_back(&m.r.grad());
  for (const Tensor* t : all) {
    Tensor h = t->to(Device::cpu()).to(DType::kF64);
    out.emplace_back(h.data<double>(), h.data<double>() + h.numel());
  }
  return out;
}

double rel(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / den);
}

TEST(FusedMlpCuda, MatchesComposedOpsAndRepeats) {
  GTRON_REQUIRE_GPU();
  const char* names[] = {"y", "dx", "dw_up", "db_up", "dw_down", "db_down"};
  for (int64_t N : {37, 256}) {
    const auto fused = run(N, 64, true);
    const auto composed = run(N, 64, false);
    for (size_t i = 0; i < fused.size(); ++i) {
      EXPECT_LT(rel(fused[i], composed[i]), testing::kBF16Tol) << names[i] << ", N = " << N;
    }
    EXPECT_EQ(run(N, 64, true), fused) << "rerun, N = " << N;
  }
}

TEST(FusedMlpCuda, ResidualInTheEpilogueMatchesAddingItAfter) {
  GTRON_REQUIRE_GPU();
  const char* names[] = {"y", "dx", "dw_up", "db_up", "dw_down", "db_down", "dr"};
  for (int64_t N : {37, 256}) {
    const auto fused = run(N, 64, true, true);
    const auto composed = run(N, 64, false, true);
    ASSERT_EQ(fused.size(), 7u);
    for (size_t i = 0; i < fused.size(); ++i) {
      EXPECT_LT(rel(fused[i], composed[i]), testing::kBF16Tol) << names[i] << ", N = " << N;
    }
    EXPECT_EQ(fused.back(), composed.back()) << "dr is dy itself, N = " << N;
    EXPECT_EQ(run(N, 64, true, true), fused) << "rerun, N = " << N;
  }
}

}  // namespace
}  // namespace gtron

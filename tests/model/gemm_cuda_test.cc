// The cuBLASLt GEMM (model/cuda/gemm.h) against a float64 host product: every transpose pair,
// batches, beta = 1 accumulation and the bias epilogue (GPU test; skipped without a GPU).
#include <gtest/gtest.h>

#include "model/cuda/gemm.h"
#include "model/stream.h"
#include "tests/model/cuda_op_check.h"
#include "tests/model/gradcheck.h"
#include "tests/model/op_check.h"

namespace gtron {
namespace {

struct Problem {
  int64_t m, n, k, batch;
  bool ta, tb;
  DType ab, c_type;
  float beta;
  bool bias;
};

std::vector<double> rounded(std::vector<double> v, DType t) {
  if (t == DType::kBF16) {
    for (double& x : v) x = bf16_to_float(float_to_bf16(static_cast<float>(x)));
  }
  return v;
}

Tensor on_gpu(const std::vector<double>& v, DType t) {
  return Tensor::from_vector(v, Shape{static_cast<int64_t>(v.size())}, t).to(Device::cuda(0));
}

// Runs `p` on the GPU and returns C, with the float64 reference in `want`.
std::vector<double> run(const Problem& p, std::vector<double>* want) {
  const int64_t sa = p.m * p.k, sb = p.k * p.n, sc = p.m * p.n;
  const std::vector<double> a = rounded(testing::randn(p.batch * sa, 1), p.ab);
  const std::vector<double> b = rounded(testing::randn(p.batch * sb, 2), p.ab);
  const std::vector<double> c0 = rounded(testing::randn(p.batch * sc, 3), p.c_type);
  const std::vector<double> bias = rounded(testing::randn(p.n, 4), p.c_type);
  want->assign(c0.size(), 0.0);
  for (int64_t q = 0; q < p.batch; ++q) {
    for (int64_t i = 0; i < p.m; ++i) {
      for (int64_t j = 0; j < p.n; ++j) {
        double s = 0;
        for (int64_t l = 0; l < p.k; ++l) {
          const double x = p.ta ? a[q * sa + l * p.m + i] : a[q * sa + i * p.k + l];
          const double y = p.tb ? b[q * sb + j * p.k + l] : b[q * sb + l * p.n + j];
          s += x * y;
        }
        const int64_t at = q * sc + i * p.n + j;
        (*want)[at] = s + p.beta * c0[at] + (p.bias ? bias[j] : 0.0);
      }
    }
  }
  Tensor ta = on_gpu(a, p.ab), tb = on_gpu(b, p.ab), tc = on_gpu(c0, p.c_type);
  Tensor tbias = on_gpu(bias, p.c_type);
  cuda::GemmArgs g;
  g.a = ta.raw();
  g.trans_a = p.ta;
  g.b = tb.raw();
  g.trans_b = p.tb;
  g.c = tc.raw();
  g.m = p.m;
  g.n = p.n;
  g.k = p.k;
  g.ab = p.ab;
  g.c_type = p.c_type;
  g.beta = p.beta;
  g.bias = p.bias ? tbias.raw() : nullptr;
  g.bias_type = p.c_type;
  g.batch = p.batch;
  g.stride_a = sa;
  g.stride_b = sb;
  g.stride_c = sc;
  cuda::gemm(g, default_stream(Device::cuda(0)).native());
  return tc.to_vector();
}

void check(const Problem& p, double tol) {
  std::vector<double> want;
  const std::vector<double> got = run(p, &want);
  EXPECT_LT(testing::rel_diff(got, want), tol)
      << "m " << p.m << " n " << p.n << " k " << p.k << " batch " << p.batch << " trans " << p.ta
      << p.tb << " " << dtype_name(p.ab) << "->" << dtype_name(p.c_type);
  std::vector<double> again_want;
  EXPECT_TRUE(run(p, &again_want) == got) << "GEMM not bit-identical across runs";
}

TEST(GemmCuda, EveryTransposeInF32) {
  GTRON_REQUIRE_GPU();
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      check({37, 53, 67, 1, ta, tb, DType::kF32, DType::kF32, 0.0f, false}, testing::kF32Tol);
    }
  }
}

TEST(GemmCuda, Bf16InputsIntoF32AccumulateExactly) {
  // Products of bf16 values are exact in fp32, so only fp32 summation error remains.
  GTRON_REQUIRE_GPU();
  for (bool ta : {false, true}) {
    check({37, 53, 67, 1, ta, false, DType::kBF16, DType::kF32, 1.0f, false}, testing::kF32Tol);
  }
}

TEST(GemmCuda, Bf16OutputWithBiasAndBatches) {
  GTRON_REQUIRE_GPU();
  check({37, 53, 67, 3, false, true, DType::kBF16, DType::kBF16, 0.0f, true}, testing::kBF16Tol);
  check({64, 96, 64, 3, true, false, DType::kBF16, DType::kBF16, 1.0f, false}, testing::kBF16Tol);
  check({37, 53, 67, 3, false, true, DType::kF32, DType::kF32, 1.0f, true}, testing::kF32Tol);
}

}  // namespace
}  // namespace gtron

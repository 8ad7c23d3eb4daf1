// causal_attention on CUDA against the CPU kernel (GPU test; skipped without a GPU).
#include <gtest/gtest.h>

#include "model/ops/attention.h"
#include "tests/model/cuda_op_check.h"
#include "tests/model/gradcheck.h"

namespace gtron {
namespace {

testing::OpCase attention_case(int64_t B, int64_t T, int NH, int64_t HS) {
  testing::OpCase c;
  c.f = [NH](const std::vector<Var>& in, const std::vector<Var>&) {
    return causal_attention(in[0], NH);
  };
  c.inputs = {testing::randn_tensor({B, T, 3 * NH * HS}, 1)};
  return c;
}

TEST(AttentionCuda, OddSizesMatchCpu) {
  // T = 53, NH = 3, HS = 23: no dimension is a multiple of a GEMM tile or a 16-byte pack.
  GTRON_REQUIRE_GPU();
  testing::OpCase c = attention_case(2, 53, 3, 23);
  testing::expect_cuda_matches_cpu(c, DType::kF32, testing::kF32Tol);
  testing::expect_cuda_matches_cpu(c, DType::kBF16, testing::kBF16Tol);
}

TEST(AttentionCuda, AlignedSizesMatchCpu) {
  GTRON_REQUIRE_GPU();
  testing::OpCase c = attention_case(2, 64, 2, 64);
  testing::expect_cuda_matches_cpu(c, DType::kF32, testing::kF32Tol);
  testing::expect_cuda_matches_cpu(c, DType::kBF16, testing::kBF16Tol);
}

TEST(AttentionCuda, SharpScoresStayFinite) {
  // Scaled scores with std ~9 give peaked softmax rows: the max subtraction must hold. Both
  // sides rebuild P as exp(scale·S − lse) with |lse| ~ 20, so each carries a relative error of
  // ~20 ulps in P; hence 1e-4 here rather than kF32Tol.
  GTRON_REQUIRE_GPU();
  testing::OpCase c = attention_case(1, 37, 2, 16);
  c.inputs = {testing::randn_tensor({1, 37, 96}, 2, 3.0)};
  testing::expect_cuda_matches_cpu(c, DType::kF32, 1e-4);
}

}  // namespace
}  // namespace gtron

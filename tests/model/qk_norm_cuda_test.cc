// qk_rmsnorm on CUDA against the CPU kernels (GPU test; skipped without a GPU).
#include <gtest/gtest.h>

#include <string>
#include <tuple>

#include "model/ops/qk_norm.h"
#include "tests/model/cuda_op_check.h"
#include "tests/model/gradcheck.h"

namespace gtron {
namespace {

using testing::OpCase;
using testing::ParamDtype;

OpCase qk_case(int NH, int NKV, int64_t HS, int64_t N, ParamDtype pd) {
  OpCase c;
  c.f = [NH, NKV, HS](const std::vector<Var>& in, const std::vector<Var>& p) {
    return qk_rmsnorm(in[0], NH, NKV, HS, p[0], p[1], 1e-6);
  };
  c.inputs = {testing::randn_tensor({N, (NH + 2 * NKV) * HS}, 1, 2.0)};
  c.params = {testing::randn_tensor({HS}, 2, 0.5), testing::randn_tensor({HS}, 3, 0.5)};
  c.param_dtypes = {pd, pd};
  return c;
}

TEST(QkRmsNormCuda, MatchesCpu) {
  GTRON_REQUIRE_GPU();
  // Odd sizes (HS 6: lanes idle; 130 rows: a partial chunk), MQA, GQA, and head size 128.
  for (auto [NH, NKV, HS, N] :
       {std::tuple<int, int, int64_t, int64_t>{4, 1, 6, 130}, {4, 2, 10, 37}, {2, 2, 128, 67}}) {
    testing::expect_cuda_matches_cpu(qk_case(NH, NKV, HS, N, ParamDtype::kAct), DType::kF32,
                                     testing::kF32Tol);
    testing::expect_cuda_matches_cpu(qk_case(NH, NKV, HS, N, ParamDtype::kF32), DType::kBF16,
                                     testing::kBF16Tol);
  }
}

// The packed kernels (Note [packed q/k norm]): HS = 32·kPer with kPer = 1, 2, 4 and 8, GQA and
// equal heads, a row count that leaves some warps of the fused backward's grid without a task,
// gamma in f32 and in the activation dtype.
TEST(QkRmsNormCuda, PackedKernelsMatchCpu) {
  GTRON_REQUIRE_GPU();
  for (auto [NH, NKV, HS, N] : {std::tuple<int, int, int64_t, int64_t>{4, 2, 64, 74},
                                {4, 4, 128, 37},
                                {2, 1, 32, 9},
                                {2, 1, 256, 5},
                                {16, 8, 128, 300}}) {
    SCOPED_TRACE("NH " + std::to_string(NH) + " NKV " + std::to_string(NKV) + " HS " +
                 std::to_string(HS) + " N " + std::to_string(N));
    for (ParamDtype pd : {ParamDtype::kAct, ParamDtype::kF32}) {
      testing::expect_cuda_matches_cpu(qk_case(NH, NKV, HS, N, pd), DType::kF32, testing::kF32Tol);
      testing::expect_cuda_matches_cpu(qk_case(NH, NKV, HS, N, pd), DType::kBF16,
                                       testing::kBF16Tol);
    }
  }
}

}  // namespace
}  // namespace gtron

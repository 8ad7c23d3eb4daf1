// qk_rmsnorm on CUDA against the CPU kernels (GPU test; skipped without a GPU).
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace gtron

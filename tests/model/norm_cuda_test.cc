// layernorm and rmsnorm on CUDA against the CPU kernels (GPU test; skipped without a GPU).
#include <gtest/gtest.h>

#include "model/ops/norm.h"
#include "tests/model/cuda_op_check.h"
#include "tests/model/gradcheck.h"

namespace gtron {
namespace {

using testing::OpCase;
using testing::ParamDtype;

// x: [37, C] with a non-zero mean (so centring matters); gamma around 1.
Tensor activations(int64_t C) {
  std::vector<double> v = testing::randn(static_cast<size_t>(37 * C), 1, 2.0);
  for (double& x : v) x += 0.5;
  return Tensor::from_vector(v, {37, C}, DType::kF64);
}

Tensor around_one(int64_t C, uint64_t seed) {
  std::vector<double> v = testing::randn(static_cast<size_t>(C), seed, 0.3);
  for (double& x : v) x += 1.0;
  return Tensor::from_vector(v, {C}, DType::kF64);
}

OpCase layernorm_case(int64_t C, ParamDtype pd) {
  OpCase c;
  c.f = [](const std::vector<Var>& in, const std::vector<Var>& p) {
    return layernorm(in[0], p[0], p[1]);
  };
  c.inputs = {activations(C)};
  c.params = {around_one(C, 2), testing::randn_tensor({C}, 3, 0.3)};
  c.param_dtypes = {pd, pd};
  return c;
}

OpCase rmsnorm_case(int64_t C, ParamDtype pd) {
  OpCase c;
  c.f = [](const std::vector<Var>& in, const std::vector<Var>& p) { return rmsnorm(in[0], p[0]); };
  c.inputs = {activations(C)};
  c.params = {around_one(C, 4)};
  c.param_dtypes = {pd};
  return c;
}

TEST(LayerNormCuda, MatchesCpu) {
  GTRON_REQUIRE_GPU();
  for (int64_t C : {67, 64}) {  // scalar path, 16-byte pack path
    testing::expect_cuda_matches_cpu(layernorm_case(C, ParamDtype::kAct), DType::kF32,
                                     testing::kF32Tol);
    testing::expect_cuda_matches_cpu(layernorm_case(C, ParamDtype::kAct), DType::kBF16,
                                     testing::kBF16Tol);
    testing::expect_cuda_matches_cpu(layernorm_case(C, ParamDtype::kF32), DType::kBF16,
                                     testing::kBF16Tol);
  }
}

TEST(RMSNormCuda, MatchesCpu) {
  GTRON_REQUIRE_GPU();
  for (int64_t C : {67, 64}) {
    testing::expect_cuda_matches_cpu(rmsnorm_case(C, ParamDtype::kAct), DType::kF32,
                                     testing::kF32Tol);
    testing::expect_cuda_matches_cpu(rmsnorm_case(C, ParamDtype::kAct), DType::kBF16,
                                     testing::kBF16Tol);
    testing::expect_cuda_matches_cpu(rmsnorm_case(C, ParamDtype::kF32), DType::kBF16,
                                     testing::kBF16Tol);
  }
}

TEST(LayerNormCuda, ManyRowsUseSeveralColumnChunks) {
  // 2000 rows: the parameter-gradient reduction runs over many row chunks.
  GTRON_REQUIRE_GPU();
  OpCase c = layernorm_case(67, ParamDtype::kAct);
  c.inputs = {testing::randn_tensor({2000, 67}, 5)};
  testing::expect_cuda_matches_cpu(c, DType::kF32, testing::kF32Tol);
}

}  // namespace
}  // namespace gtron

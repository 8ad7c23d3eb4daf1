// layernorm and rmsnorm on CUDA against the CPU kernels (GPU test; skipped without a GPU).
#include <gtest/gtest.h>

#include <string>

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

// x: [N, C] with a non-zero mean.
Tensor activations(int64_t N, int64_t C) {
  std::vector<double> v = testing::randn(static_cast<size_t>(N * C), 6, 2.0);
  for (double& x : v) x += 0.5;
  return Tensor::from_vector(v, {N, C}, DType::kF64);
}

// Note [one-pass norm backward]: the rows-per-block choice, the ragged last block, the warp tree
// and the partial finish, at the GPT-2 width (3 packs a lane) and at C = 1000 (4 packs, the last
// one partly past C), bf16 and f32 (f32 C = 768 and 1000 are past the one-pass limit: the two-pass
// fallback); C = 250 is the one-element path (not a multiple of the pack), C = 1536 (and bf16
// C = 300, one element a lane) the fallback for wide rows.
TEST(LayerNormCuda, OnePassAndFallbackShapesMatchCpu) {
  GTRON_REQUIRE_GPU();
  struct Shape2 {
    int64_t N, C;
  };
  for (const Shape2 sh : {Shape2{4101, 768}, Shape2{16384, 768}, Shape2{1029, 1000},
                          Shape2{333, 250}, Shape2{517, 1536}, Shape2{517, 300}}) {
    SCOPED_TRACE("N = " + std::to_string(sh.N) + ", C = " + std::to_string(sh.C));
    OpCase c = layernorm_case(sh.C, ParamDtype::kF32);
    c.inputs = {activations(sh.N, sh.C)};
    testing::expect_cuda_matches_cpu(c, DType::kBF16, testing::kBF16Tol);
    if (sh.N <= 4101) {
      c.param_dtypes = {ParamDtype::kAct, ParamDtype::kAct};
      testing::expect_cuda_matches_cpu(c, DType::kF32, testing::kF32Tol);
    }
  }
}

TEST(RMSNormCuda, OnePassAndFallbackShapesMatchCpu) {
  GTRON_REQUIRE_GPU();
  for (int64_t C : {768, 1000, 250, 1536}) {
    SCOPED_TRACE("C = " + std::to_string(C));
    OpCase c = rmsnorm_case(C, ParamDtype::kF32);
    c.inputs = {activations(2053, C)};
    testing::expect_cuda_matches_cpu(c, DType::kBF16, testing::kBF16Tol);
    c.param_dtypes = {ParamDtype::kAct};
    testing::expect_cuda_matches_cpu(c, DType::kF32, testing::kF32Tol);
  }
}

TEST(LayerNormCuda, ParameterGradientsWithoutDx) {
  // x needs no gradient: the one-pass kernel runs with a null dx (dgamma and dbeta only).
  GTRON_REQUIRE_GPU();
  for (int64_t C : {768, 67}) {
    OpCase c = layernorm_case(C, ParamDtype::kF32);
    c.f = [](const std::vector<Var>& in, const std::vector<Var>& p) {
      return layernorm(Var::constant(in[0].value()), p[0], p[1]);
    };
    c.inputs = {activations(1500, C)};
    testing::expect_cuda_matches_cpu(c, DType::kBF16, testing::kBF16Tol);
    testing::expect_cuda_matches_cpu(c, DType::kF32, testing::kF32Tol);
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

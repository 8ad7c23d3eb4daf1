// linear and add on CUDA against the CPU kernels (GPU test; skipped without a GPU).
#include <gtest/gtest.h>

#include "model/ops/add.h"
#include "model/ops/linear.h"
#include "tests/model/cuda_op_check.h"
#include "tests/model/gradcheck.h"

namespace gtron {
namespace {

using testing::OpCase;
using testing::ParamDtype;

// x [N, Cin] -> [N, Cout] with a bias whose GPU value is in `bias_dtype`.
OpCase linear_case(int64_t N, int64_t Cin, int64_t Cout, ParamDtype bias_dtype) {
  OpCase c;
  c.f = [](const std::vector<Var>& in, const std::vector<Var>& p) {
    return linear(in[0], p[0], p[1]);
  };
  c.inputs = {testing::randn_tensor({N, Cin}, 1)};
  c.params = {testing::randn_tensor({Cout, Cin}, 2, 0.2), testing::randn_tensor({Cout}, 3)};
  c.param_dtypes = {ParamDtype::kAct, bias_dtype};
  return c;
}

TEST(LinearCuda, OddSizesMatchCpu) {
  GTRON_REQUIRE_GPU();
  OpCase c = linear_case(37, 67, 53, ParamDtype::kAct);
  testing::expect_cuda_matches_cpu(c, DType::kF32, testing::kF32Tol);
  testing::expect_cuda_matches_cpu(c, DType::kBF16, testing::kBF16Tol);
}

TEST(LinearCuda, AlignedSizesMatchCpu) {
  GTRON_REQUIRE_GPU();
  OpCase c = linear_case(40, 64, 96, ParamDtype::kAct);
  testing::expect_cuda_matches_cpu(c, DType::kF32, testing::kF32Tol);
  testing::expect_cuda_matches_cpu(c, DType::kBF16, testing::kBF16Tol);
}

TEST(LinearCuda, Fp32BiasWithBf16Activations) {
  // The bias is added after the GEMM (cuBLASLt's epilogue reads the bias in the output type).
  GTRON_REQUIRE_GPU();
  testing::expect_cuda_matches_cpu(linear_case(37, 67, 53, ParamDtype::kF32), DType::kBF16,
                                   testing::kBF16Tol);
}

TEST(LinearCuda, ConstantInputAndNoBias) {
  // dx is not wanted (null on the launcher) and there is no bias: dW alone.
  GTRON_REQUIRE_GPU();
  OpCase c;
  c.f = [](const std::vector<Var>& in, const std::vector<Var>& p) {
    return linear(Var::constant(in[0].value()), p[0], Var());
  };
  c.inputs = {testing::randn_tensor({3, 11, 67}, 4)};
  c.params = {testing::randn_tensor({29, 67}, 5, 0.2)};
  testing::expect_cuda_matches_cpu(c, DType::kF32, testing::kF32Tol);
  testing::expect_cuda_matches_cpu(c, DType::kBF16, testing::kBF16Tol);
}

TEST(LinearCuda, RepeatedWeightUseAccumulates) {
  // y = W(W x): main_grad must receive both uses.
  GTRON_REQUIRE_GPU();
  OpCase c;
  c.f = [](const std::vector<Var>& in, const std::vector<Var>& p) {
    return linear(linear(in[0], p[0], Var()), p[0], Var());
  };
  c.inputs = {testing::randn_tensor({37, 41}, 6)};
  c.params = {testing::randn_tensor({41, 41}, 7, 0.2)};
  testing::expect_cuda_matches_cpu(c, DType::kF32, testing::kF32Tol);
  testing::expect_cuda_matches_cpu(c, DType::kBF16, testing::kBF16Tol);
}

TEST(AddCuda, MatchesCpuBitForBitInF32) {
  GTRON_REQUIRE_GPU();
  for (int64_t C : {67, 64}) {  // a scalar tail, and whole 16-byte packs
    OpCase c;
    c.f = [](const std::vector<Var>& in, const std::vector<Var>&) { return add(in[0], in[1]); };
    c.inputs = {testing::randn_tensor({37, C}, 8), testing::randn_tensor({37, C}, 9)};
    testing::expect_cuda_matches_cpu(c, DType::kF32, testing::kF32Tol, /*exact=*/true);
    testing::expect_cuda_matches_cpu(c, DType::kBF16, testing::kBF16Tol);
  }
}

}  // namespace
}  // namespace gtron

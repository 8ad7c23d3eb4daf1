// linear and add on CUDA against the CPU kernels (GPU test; skipped without a GPU).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/ops/add.h"
#include "model/ops/device_util.h"
#include "model/ops/linear.h"
#include "model/stream.h"
#include "tests/model/cuda_op_check.h"
#include "tests/model/gradcheck.h"
#include "tests/model/op_check.h"

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

TEST(LinearCuda, ResidualInTheEpilogueMatchesCpu) {
  // y = r + x·Wᵀ + b: on CUDA the residual is read in the GEMM's epilogue (f32 and bf16, with an
  // f32 bias on bf16 too), on the CPU it is add(r, linear); r's gradient is dy.
  GTRON_REQUIRE_GPU();
  for (ParamDtype bias : {ParamDtype::kAct, ParamDtype::kF32}) {
    OpCase c = linear_case(37, 67, 53, bias);
    c.f = [](const std::vector<Var>& in, const std::vector<Var>& p) {
      return linear(in[0], p[0], p[1], in[1]);
    };
    c.inputs.push_back(testing::randn_tensor({37, 53}, 6));
    if (bias == ParamDtype::kAct)
      testing::expect_cuda_matches_cpu(c, DType::kF32, testing::kF32Tol);
    testing::expect_cuda_matches_cpu(c, DType::kBF16, testing::kBF16Tol);
  }
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

// Note [one-pass column sums]: several row chunks with a ragged last one, column tiles with a tail
// (Cout = 1000 bf16: 125 packs), and the one-element path (Cout = 53).
TEST(LinearCuda, BiasGradientOnePassMatchesCpu) {
  GTRON_REQUIRE_GPU();
  for (int64_t Cout : {768, 1000, 53}) {
    SCOPED_TRACE("Cout = " + std::to_string(Cout));
    OpCase c = linear_case(4101, 24, Cout, ParamDtype::kF32);
    testing::expect_cuda_matches_cpu(c, DType::kBF16, testing::kBF16Tol);
    c.param_dtypes = {ParamDtype::kAct, ParamDtype::kAct};
    testing::expect_cuda_matches_cpu(c, DType::kF32, testing::kF32Tol);
  }
}

// The launcher alone at GPT-2 124M's shapes (B·T = 16384 rows; qkv and fc widths): db accumulates
// Σ_rows dy onto its previous value, within fp32 summation error of an f64 sum, and repeats bit
// for bit.
TEST(LinearCuda, BiasGradientAtGpt2Shapes) {
  GTRON_REQUIRE_GPU();
  const Device dev = Device::cuda(0);
  Stream& s = current_stream(dev);
  constexpr int64_t N = 16384;
  for (int64_t C : {2304, 3072, 768}) {
    SCOPED_TRACE("C = " + std::to_string(C));
    const Tensor dy_host = testing::randn_tensor({N, C}, 20, 1.0, DType::kF32).to(DType::kBF16);
    const Tensor dy = dy_host.to(dev, &s);
    const std::vector<double> init = testing::randn(static_cast<size_t>(C), 21);
    const std::vector<double> dyv = dy_host.to_vector();
    std::vector<double> want = init;
    for (int64_t r = 0; r < N; ++r)
      for (int64_t c = 0; c < C; ++c) want[c] += dyv[r * C + c];
    std::vector<std::vector<double>> got;
    for (int run = 0; run < 2; ++run) {
      Tensor db = Tensor::from_vector(init, {C}, DType::kF32).to(dev, &s);
      Tensor scratch = scratch_floats(cuda::linear_backward_scratch_floats(N, C), s);
      cuda::linear_backward(nullptr, nullptr, dy.raw(), nullptr, nullptr, DType::kF32,
                            db.data<float>(), scratch.data<float>(), N, /*Cin=*/1, C, DType::kBF16,
                            s.native());
      got.push_back(db.to_vector());
    }
    EXPECT_LT(testing::rel_diff(got[0], want), 1e-5);
    EXPECT_EQ(got[0], got[1]) << "a rerun changed the bits";
  }
}

TEST(LinearCuda, WeightGradientWrittenOverEqualsAddedIntoZeros) {
  GTRON_REQUIRE_GPU();
  // Note [first gradient write] (parallel/ddp.h): a gradient's first write runs the dw GEMM with
  // beta = 0 over whatever the memory held; it must give the bits of adding into zeros, and with
  // no rows it writes zeros.
  const Device dev = Device::cuda(0);
  Stream& s = current_stream(dev);
  constexpr int64_t N = 37, Cin = 67, Cout = 29;
  const Tensor x =
      testing::randn_tensor({N, Cin}, 30, 1.0, DType::kF32).to(DType::kBF16).to(dev, &s);
  const Tensor dy =
      testing::randn_tensor({N, Cout}, 31, 1.0, DType::kF32).to(DType::kBF16).to(dev, &s);
  const std::vector<double> garbage(static_cast<size_t>(Cout * Cin), 1e30);
  Tensor added = Tensor::zeros({Cout, Cin}, DType::kF32, dev);
  cuda::linear_backward(x.raw(), nullptr, dy.raw(), nullptr, added.raw(), DType::kF32, nullptr,
                        nullptr, N, Cin, Cout, DType::kBF16, s.native());
  Tensor written = Tensor::from_vector(garbage, {Cout, Cin}, DType::kF32).to(dev, &s);
  cuda::linear_backward(x.raw(), nullptr, dy.raw(), nullptr, written.raw(), DType::kF32, nullptr,
                        nullptr, N, Cin, Cout, DType::kBF16, s.native(), /*dx_overwrite=*/false,
                        /*dw_overwrite=*/true);
  const std::vector<double> want = added.to_vector();
  EXPECT_NE(want, std::vector<double>(want.size(), 0.0));
  EXPECT_EQ(written.to_vector(), want);
  Tensor no_rows = Tensor::from_vector(garbage, {Cout, Cin}, DType::kF32).to(dev, &s);
  cuda::linear_backward(x.raw(), nullptr, dy.raw(), nullptr, no_rows.raw(), DType::kF32, nullptr,
                        nullptr, /*N=*/0, Cin, Cout, DType::kBF16, s.native(),
                        /*dx_overwrite=*/false, /*dw_overwrite=*/true);
  EXPECT_EQ(no_rows.to_vector(), std::vector<double>(want.size(), 0.0));
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

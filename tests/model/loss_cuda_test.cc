// cross_entropy and scale on CUDA against the CPU kernels, and the fused cross-entropy launcher
// against the unfused pair (GPU test; skipped without a GPU).
#include <gtest/gtest.h>

#include <cmath>

#include "model/ops/loss.h"
#include "model/stream.h"
#include "tests/model/cuda_op_check.h"
#include "tests/model/gradcheck.h"
#include "tests/model/op_check.h"

namespace gtron {
namespace {

constexpr int64_t kN = 37, kV = 97, kVp = 128;

// [kN] targets in [0, kV), every 6th masked.
Tensor targets() {
  std::vector<int32_t> t;
  for (int64_t i = 0; i < kN; ++i) t.push_back(i % 6 == 5 ? kMaskedTarget : (i * 31) % kV);
  return Tensor::from_ints(t, {kN});
}

// Logits whose padded tail [V, Vp) holds huge values: they must never reach loss or gradient.
Tensor logits_with_loud_tail() {
  std::vector<double> v = testing::randn(static_cast<size_t>(kN * kVp), 1, 2.0);
  for (int64_t i = 0; i < kN; ++i) {
    for (int64_t j = kV; j < kVp; ++j) v[i * kVp + j] = 1000.0;
  }
  return Tensor::from_vector(v, {kN, kVp}, DType::kF64);
}

testing::OpCase cross_entropy_case(bool targets_on_device) {
  const Tensor t = targets();
  testing::OpCase c;
  c.f = [t, targets_on_device](const std::vector<Var>& in, const std::vector<Var>&) {
    const bool gpu = in[0].device().is_cuda() && targets_on_device;
    return cross_entropy(in[0], gpu ? t.to(in[0].device()) : t, kV);
  };
  c.inputs = {logits_with_loud_tail()};
  return c;
}

TEST(CrossEntropyCuda, MatchesCpuWithMaskAndPaddedVocab) {
  GTRON_REQUIRE_GPU();
  for (bool on_device : {false, true}) {
    testing::OpCase c = cross_entropy_case(on_device);
    testing::expect_cuda_matches_cpu(c, DType::kF32, testing::kF32Tol);
    testing::expect_cuda_matches_cpu(c, DType::kBF16, testing::kBF16Tol);
  }
}

TEST(CrossEntropyCuda, OverwritingTheLogitsGivesTheSameGradientInTheirBuffer) {
  // overwrite_logits with an empty gradient slot: the gradient lands in the logits' own buffer
  // (masked rows and the loud padded tail become zeros), equal to the accumulating path's.
  GTRON_REQUIRE_GPU();
  for (DType act : {DType::kF32, DType::kBF16}) {
    const Tensor host = logits_with_loud_tail().to(act);
    Var a = Var::leaf(host.to(Device::cuda(0)));
    Var b = Var::leaf(host.to(Device::cuda(0)));
    const void* b_buffer = b.value().raw();
    Var la = cross_entropy(a, targets(), kV);
    backward(la, 0.75);  // runs (and clears) the tape: one loss at a time
    Var lb = cross_entropy(b, targets(), kV, /*overwrite_logits=*/true);
    EXPECT_EQ(la.value().item(), lb.value().item());
    backward(lb, 0.75);
    EXPECT_EQ(b.grad().raw(), b_buffer);
    const Tensor ga = a.grad().to(Device::cpu()).to(DType::kF64);
    const Tensor gb = b.grad().to(Device::cpu()).to(DType::kF64);
    for (int64_t i = 0; i < ga.numel(); ++i) {
      ASSERT_EQ(ga.data<double>()[i], gb.data<double>()[i]) << dtype_name(act) << " at " << i;
    }
  }
}

TEST(CrossEntropyCuda, AllMaskedGivesZeroLossAndGradient) {
  GTRON_REQUIRE_GPU();
  Var logits = Var::leaf(testing::randn_tensor({3, 8}, 2, 1.0, DType::kF32).to(Device::cuda(0)));
  Var loss = cross_entropy(
      logits, Tensor::from_ints({kMaskedTarget, kMaskedTarget, kMaskedTarget}, {3}), 5);
  EXPECT_EQ(loss.dtype(), DType::kF32);
  EXPECT_EQ(loss.value().item(), 0.0);
  backward(loss);
  for (double g : logits.grad().to_vector()) EXPECT_EQ(g, 0.0);
}

TEST(ScaleCuda, MatchesCpu) {
  GTRON_REQUIRE_GPU();
  for (int64_t C : {67, 64}) {
    testing::OpCase c;
    c.f = [](const std::vector<Var>& in, const std::vector<Var>&) { return scale(in[0], 0.37); };
    c.inputs = {testing::randn_tensor({37, C}, 3)};
    testing::expect_cuda_matches_cpu(c, DType::kF32, testing::kF32Tol);
    testing::expect_cuda_matches_cpu(c, DType::kBF16, testing::kBF16Tol);
  }
}

TEST(CrossEntropyCuda, FusedGradientEqualsForwardThenBackward) {
  // The fused forward forms each probability from the same statistics that the unfused forward
  // stores: loss and gradient agree to rounding (the two kernels may contract multiply-adds
  // differently, so not necessarily bit for bit); masked rows and the padded tail stay zero.
  GTRON_REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  void* stream = default_stream(gpu).native();
  const Tensor tg = targets().to(gpu);
  const Tensor dloss = Tensor::from_vector({0.7}, {1}, DType::kF32).to(gpu);
  for (DType act : {DType::kF32, DType::kBF16}) {
    const Tensor logits = logits_with_loud_tail().to(act).to(gpu);
    struct Out {
      Tensor rmax, rlse, count, loss, dlogits;
    };
    auto make = [&] {
      return Out{Tensor::empty({kN}, DType::kF32, gpu), Tensor::empty({kN}, DType::kF32, gpu),
                 Tensor::empty({1}, DType::kI32, gpu), Tensor::empty({1}, DType::kF32, gpu),
                 Tensor::zeros({kN, kVp}, act, gpu)};
    };
    Out fused = make(), split = make();
    cuda::cross_entropy_forward(logits.raw(), tg.data<int32_t>(), fused.rmax.data<float>(),
                                fused.rlse.data<float>(), fused.count.data<int32_t>(),
                                fused.loss.data<float>(), fused.dlogits.raw(), dloss.data<float>(),
                                kN, kV, kVp, act, stream);
    cuda::cross_entropy_forward(logits.raw(), tg.data<int32_t>(), split.rmax.data<float>(),
                                split.rlse.data<float>(), split.count.data<int32_t>(),
                                split.loss.data<float>(), nullptr, nullptr, kN, kV, kVp, act,
                                stream);
    cuda::cross_entropy_backward(logits.raw(), tg.data<int32_t>(), split.rmax.data<float>(),
                                 split.rlse.data<float>(), split.count.data<int32_t>(),
                                 dloss.data<float>(), split.dlogits.raw(), kN, kV, kVp, act,
                                 stream);
    EXPECT_EQ(fused.count.item(), 31.0);  // 37 rows, 6 masked
    EXPECT_NEAR(fused.loss.item(), split.loss.item(), 1e-6 * std::abs(split.loss.item()));
    const std::vector<double> g = fused.dlogits.to_vector();
    EXPECT_LT(testing::rel_diff(g, split.dlogits.to_vector()), testing::kF32Tol);
    for (int64_t i = 0; i < kN; ++i) {
      for (int64_t j = 0; j < kVp; ++j) {
        if (i % 6 == 5 || j >= kV) {
          EXPECT_EQ(g[i * kVp + j], 0.0) << i << ", " << j;
        }
      }
    }
  }
}

}  // namespace
}  // namespace gtron

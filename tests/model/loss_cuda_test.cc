// cross_entropy and scale on CUDA against the CPU kernels, the fused cross-entropy launcher
// against the unfused pair, and the one-pass cross-entropy (a known upstream gradient) against the
// two-pass kernels, bit for bit (GPU test; skipped without a GPU).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

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

// One-pass vs two-pass at one size: rows of N(0, 2²) logits with a loud padded tail, every 6th
// row masked (row 0 too), targets spread over [0, V).
struct OnePassCase {
  int64_t N, V, Vp;
};

Tensor case_targets(const OnePassCase& c) {
  std::vector<int32_t> t;
  for (int64_t i = 0; i < c.N; ++i) {
    t.push_back(i % 6 == 0 ? kMaskedTarget : static_cast<int32_t>((i * 7919 + 3) % c.V));
  }
  return Tensor::from_ints(t, {c.N});
}

Tensor case_logits(const OnePassCase& c, DType act) {
  std::vector<double> v = testing::randn(static_cast<size_t>(c.N * c.Vp), 11, 2.0);
  for (int64_t i = 0; i < c.N; ++i) {
    for (int64_t j = c.V; j < c.Vp; ++j) v[i * c.Vp + j] = 1000.0;
  }
  return Tensor::from_vector(v, {c.N, c.Vp}, DType::kF64).to(act);
}

struct CeOut {
  Tensor logits, rmax, rlse, count, loss;  // logits: the gradient once the kernels ran
};

CeOut ce_buffers(const Tensor& host_logits, int64_t N, Device gpu) {
  return CeOut{host_logits.to(gpu), Tensor::empty({N}, DType::kF32, gpu),
               Tensor::empty({N}, DType::kF32, gpu), Tensor::empty({1}, DType::kI32, gpu),
               Tensor::empty({1}, DType::kF32, gpu)};
}

// The one-pass kernel for an upstream gradient seed·w.
CeOut run_onepass(const OnePassCase& c, DType act, const Tensor& tg, const Tensor& seed, float w) {
  const Device gpu = Device::cuda(0);
  CeOut o = ce_buffers(case_logits(c, act), c.N, gpu);
  Tensor tlogit = Tensor::empty({c.N}, DType::kF32, gpu);
  cuda::cross_entropy_onepass(o.logits.raw(), tg.data<int32_t>(), o.rmax.data<float>(),
                              o.rlse.data<float>(), tlogit.data<float>(), o.count.data<int32_t>(),
                              o.loss.data<float>(), seed.data<float>(), w, c.N, c.V, c.Vp, act,
                              default_stream(gpu).native());
  return o;
}

// The two-pass kernels (forward, then the in-place backward) for dloss = seed·w.
CeOut run_twopass(const OnePassCase& c, DType act, const Tensor& tg, const Tensor& dloss) {
  const Device gpu = Device::cuda(0);
  void* stream = default_stream(gpu).native();
  CeOut o = ce_buffers(case_logits(c, act), c.N, gpu);
  cuda::cross_entropy_forward(o.logits.raw(), tg.data<int32_t>(), o.rmax.data<float>(),
                              o.rlse.data<float>(), o.count.data<int32_t>(), o.loss.data<float>(),
                              nullptr, nullptr, c.N, c.V, c.Vp, act, stream);
  cuda::cross_entropy_backward_inplace(o.logits.raw(), tg.data<int32_t>(), o.rmax.data<float>(),
                                       o.rlse.data<float>(), o.count.data<int32_t>(),
                                       dloss.data<float>(), c.N, c.V, c.Vp, act, stream);
  return o;
}

void expect_same_bits(const std::vector<double>& got, const std::vector<double>& want,
                      const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int64_t bad = 0;
  for (size_t k = 0; k < got.size(); ++k) {
    if (got[k] != want[k] && ++bad <= 3) {
      ADD_FAILURE() << what << " at " << k << ": " << got[k] << " vs " << want[k];
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

TEST(CrossEntropyCuda, OnePassEqualsTwoPassBitForBit) {
  // The one-pass kernel runs the rows kernel's statistics code (same block size and order) and
  // the in-place backward's gradient code, with g = (seed·w)/count as the backward's dloss/count:
  // loss, statistics and gradient agree bit for bit. Sizes: 16-byte packs staged in shared
  // memory (V odd, padded); rows of 1-element packs (Vp odd, unpadded); GPT-2's vocabulary
  // (staged for both dtypes); a row too long to stage in f32 (read twice from global).
  GTRON_REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  const float seed_v = 1.0f / 3.0f, w = static_cast<float>(0.3 / 2);
  const Tensor seed = Tensor::from_vector({seed_v}, {1}, DType::kF32).to(gpu);
  const Tensor dloss = Tensor::from_vector({seed_v * w}, {1}, DType::kF32).to(gpu);
  for (const OnePassCase& c : {OnePassCase{37, 97, 128}, OnePassCase{23, 101, 101},
                               OnePassCase{7, 50257, 50304}, OnePassCase{5, 70001, 70016}}) {
    const Tensor tg = case_targets(c).to(gpu);
    for (DType act : {DType::kBF16}) {  // f32 logits keep the two-pass kernels (loss.cc)
      const std::string what = std::string(dtype_name(act)) + " V=" + std::to_string(c.V) +
                               " Vp=" + std::to_string(c.Vp);
      const CeOut one = run_onepass(c, act, tg, seed, w);
      const CeOut two = run_twopass(c, act, tg, dloss);
      EXPECT_EQ(one.count.item(), two.count.item()) << what;
      EXPECT_EQ(one.loss.item(), two.loss.item()) << what;
      EXPECT_GT(one.loss.item(), 1.0) << what;  // about log V: the loud tail never entered
      const std::vector<double> g = one.logits.to_vector();
      expect_same_bits(g, two.logits.to_vector(), "gradient " + what);
      const std::vector<double> m1 = one.rmax.to_vector(), m2 = two.rmax.to_vector();
      const std::vector<double> l1 = one.rlse.to_vector(), l2 = two.rlse.to_vector();
      for (int64_t i = 0; i < c.N; ++i) {
        if (i % 6 == 0) continue;  // masked rows: statistics unspecified
        EXPECT_EQ(m1[i], m2[i]) << what << " row " << i;
        EXPECT_EQ(l1[i], l2[i]) << what << " row " << i;
      }
      for (int64_t i = 0; i < c.N; ++i) {  // masked rows and the padded tail: zero gradient
        for (int64_t j = 0; j < c.Vp; ++j) {
          if (i % 6 == 0 || j >= c.V)
            ASSERT_EQ(g[i * c.Vp + j], 0.0) << what << " " << i << "," << j;
        }
      }
      // A rerun gives the same bits.
      const CeOut again = run_onepass(c, act, tg, seed, w);
      EXPECT_EQ(again.loss.item(), one.loss.item()) << what;
      expect_same_bits(again.logits.to_vector(), g, "rerun " + what);
    }
  }
}

// A loss through the op: overwrite_logits, then scale(·, w) when w != 1, then backward_with(seed).
struct OpRun {
  double loss;
  std::vector<double> grad;
  bool grad_in_logits_buffer;
};

OpRun run_op(DType act, double w, float promised, float seeded, bool promise) {
  const Device gpu = Device::cuda(0);
  Var x = Var::leaf(logits_with_loud_tail().to(act).to(gpu));
  const void* buffer = x.value().raw();
  const KnownLossGrad known{Tensor::from_vector({promised}, Shape{}, DType::kF32).to(gpu), w};
  Var ce = cross_entropy(x, targets(), kV, /*overwrite_logits=*/true, promise ? &known : nullptr);
  Var total = w == 1.0 ? ce : scale(ce, w);
  backward_with(total, Tensor::from_vector({seeded}, Shape{}, DType::kF32).to(gpu));
  return OpRun{ce.value().item(), x.grad().to_vector(), x.grad().raw() == buffer};
}

TEST(CrossEntropyCuda, KnownGradientGivesTheSameLossAndGradient) {
  // The promise kept (the gradient that arrives is seed·w, through scale or directly): the op's
  // one-pass forward gives the two-pass path's loss and gradient, in the logits' own buffer
  // (f32 logits keep the two-pass kernels under a promise: model/ops/loss.cc).
  GTRON_REQUIRE_GPU();
  for (DType act : {DType::kF32, DType::kBF16}) {
    for (double w : {1.0, 0.15}) {
      const OpRun two = run_op(act, w, 0.25f, 0.25f, false);
      const OpRun one = run_op(act, w, 0.25f, 0.25f, true);
      const std::string what = std::string(dtype_name(act)) + " w=" + std::to_string(w);
      EXPECT_EQ(one.loss, two.loss) << what;
      expect_same_bits(one.grad, two.grad, what);
      EXPECT_TRUE(one.grad_in_logits_buffer) << what;
      EXPECT_TRUE(two.grad_in_logits_buffer) << what;
    }
  }
}

TEST(CrossEntropyCuda, BrokenPromiseIsRescaledOnTheDevice) {
  // Promised 0.25, seeded 0.7: the check rescales the written gradient by 0.7/0.25 — the
  // two-pass gradient for 0.7 up to one more rounding of each value (bf16: 2^-9 relative).
  GTRON_REQUIRE_GPU();
  for (DType act : {DType::kF32, DType::kBF16}) {
    const OpRun two = run_op(act, 0.15, 0.7f, 0.7f, false);
    const OpRun one = run_op(act, 0.15, 0.25f, 0.7f, true);
    EXPECT_EQ(one.loss, two.loss);
    const double tol = act == DType::kF32 ? testing::kF32Tol : testing::kBF16Tol;
    EXPECT_LT(testing::rel_diff(one.grad, two.grad), tol) << dtype_name(act);
    EXPECT_GT(testing::rel_diff(one.grad, run_op(act, 0.15, 0.25f, 0.25f, false).grad), 0.5)
        << "the rescale did not happen";
  }
}

}  // namespace
}  // namespace gtron

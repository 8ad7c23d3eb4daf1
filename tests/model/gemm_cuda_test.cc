// The cuBLASLt GEMM (model/cuda/gemm.h) against a float64 host product: every transpose pair,
// batches, beta = 1 accumulation and the bias epilogue; pinned algorithm choices and tune mode
// (GTRON_GEMM_TUNE) leaving the caller's outputs alone (GPU test; skipped without a GPU).
#include <gtest/gtest.h>

#include <cmath>

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

// A problem's operands on the GPU, its arguments and its float64 reference C (before any
// epilogue).
struct Prepared {
  Tensor a, b, c, bias;
  cuda::GemmArgs args;
  std::vector<double> want;
};

Prepared prepare(const Problem& p) {
  const int64_t sa = p.m * p.k, sb = p.k * p.n, sc = p.m * p.n;
  const std::vector<double> a = rounded(testing::randn(p.batch * sa, 1), p.ab);
  const std::vector<double> b = rounded(testing::randn(p.batch * sb, 2), p.ab);
  const std::vector<double> c0 = rounded(testing::randn(p.batch * sc, 3), p.c_type);
  const std::vector<double> bias = rounded(testing::randn(p.n, 4), p.c_type);
  Prepared out;
  std::vector<double>& want = out.want;
  want.assign(c0.size(), 0.0);
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
        want[at] = s + p.beta * c0[at] + (p.bias ? bias[j] : 0.0);
      }
    }
  }
  out.a = on_gpu(a, p.ab);
  out.b = on_gpu(b, p.ab);
  out.c = on_gpu(c0, p.c_type);
  out.bias = on_gpu(bias, p.c_type);
  cuda::GemmArgs& g = out.args;
  g.a = out.a.raw();
  g.trans_a = p.ta;
  g.b = out.b.raw();
  g.trans_b = p.tb;
  g.c = out.c.raw();
  g.m = p.m;
  g.n = p.n;
  g.k = p.k;
  g.ab = p.ab;
  g.c_type = p.c_type;
  g.beta = p.beta;
  g.bias = p.bias ? out.bias.raw() : nullptr;
  g.bias_type = p.c_type;
  g.batch = p.batch;
  g.stride_a = sa;
  g.stride_b = sb;
  g.stride_c = sc;
  return out;
}

void* stream() { return default_stream(Device::cuda(0)).native(); }

// Runs `p` on the GPU and returns C, with the float64 reference in `want`.
std::vector<double> run(const Problem& p, std::vector<double>* want) {
  Prepared q = prepare(p);
  cuda::gemm(q.args, stream());
  *want = q.want;
  return q.c.to_vector();
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

// Note [pinned GEMM algorithms]: a pinned entry makes the problem run that heuristic result, and
// the product stays right. Fresh caches first, so these problems choose here.
TEST(GemmCuda, PinnedEntryRunsItsHeuristicResult) {
  GTRON_REQUIRE_GPU();
  cuda::reset_gemm_algos_for_testing();
  struct Case {
    Problem p;
    int index, requested;
    double tol;
  };
  const Case cases[] = {
      {{256, 384, 512, 1, false, true, DType::kBF16, DType::kBF16, 0.0f, true},
       1,
       2,
       testing::kBF16Tol},
      {{384, 256, 512, 1, true, false, DType::kBF16, DType::kF32, 1.0f, false},
       2,
       cuda::kGemmTuneCandidates,
       testing::kF32Tol},
  };
  for (const Case& c : cases) {
    Prepared q = prepare(c.p);
    cuda::pin_gemm_algo_for_testing(q.args, c.index, c.requested);
    cuda::gemm(q.args, stream());
    EXPECT_EQ(cuda::gemm_algo_index(q.args), c.index) << "m " << c.p.m << " n " << c.p.n;
    EXPECT_LT(testing::rel_diff(q.c.to_vector(), q.want), c.tol) << "m " << c.p.m;
  }
  cuda::reset_gemm_algos_for_testing();
}

TEST(GemmCuda, PinnedIndexPastTheResultsFallsBackToTheFirst) {
  GTRON_REQUIRE_GPU();
  cuda::reset_gemm_algos_for_testing();
  const Problem p{128, 192, 256, 1, false, true, DType::kBF16, DType::kBF16, 0.0f, false};
  Prepared q = prepare(p);
  cuda::pin_gemm_algo_for_testing(q.args, 999, 1000);
  cuda::gemm(q.args, stream());
  EXPECT_EQ(cuda::gemm_algo_index(q.args), 0);
  EXPECT_LT(testing::rel_diff(q.c.to_vector(), q.want), testing::kBF16Tol);
  cuda::reset_gemm_algos_for_testing();
}

double gelu_tanh(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

// C and, for a GELU_AUX problem, aux after one GEMM of `p`, in tune mode or pinned to `index`.
struct Outputs {
  std::vector<double> c, aux, want;
  int index;
};

Outputs run_tuned_or_pinned(const Problem& p, bool gelu_aux, bool tune, int index) {
  cuda::reset_gemm_algos_for_testing();
  Prepared q = prepare(p);
  Tensor aux = Tensor::zeros({p.m * p.n}, p.c_type, Device::cuda(0));
  if (gelu_aux) {
    q.args.epilogue = cuda::Epilogue::kGeluAux;
    q.args.aux = aux.raw();
    q.args.aux_ld = p.n;
  }
  if (!tune) cuda::pin_gemm_algo_for_testing(q.args, index, cuda::kGemmTuneCandidates);
  cuda::set_gemm_tune_for_testing(tune);
  cuda::gemm(q.args, stream());
  cuda::set_gemm_tune_for_testing(false);
  Outputs out{q.c.to_vector(), aux.to_vector(), q.want, cuda::gemm_algo_index(q.args)};
  cuda::reset_gemm_algos_for_testing();
  return out;
}

// Tune mode times every candidate on the caller's operands but into scratch outputs: C (an input
// when beta = 1) and GELU_AUX's aux come out exactly as from a plain GEMM with the chosen
// algorithm, and right.
TEST(GemmCuda, TuneModeLeavesTheOutputsOfAPlainGemm) {
  GTRON_REQUIRE_GPU();
  const Problem accumulate{384, 256, 512, 1, true, false, DType::kBF16, DType::kF32, 1.0f, false};
  const Outputs tuned = run_tuned_or_pinned(accumulate, false, true, 0);
  ASSERT_GE(tuned.index, 0);
  EXPECT_LT(tuned.index, cuda::kGemmTuneCandidates);
  EXPECT_LT(testing::rel_diff(tuned.c, tuned.want), testing::kF32Tol);
  const Outputs plain = run_tuned_or_pinned(accumulate, false, false, tuned.index);
  EXPECT_EQ(plain.index, tuned.index);
  EXPECT_TRUE(plain.c == tuned.c) << "tune mode changed an accumulating GEMM's C";

  const Problem fc{256, 512, 384, 1, false, true, DType::kBF16, DType::kBF16, 0.0f, true};
  const Outputs tuned_fc = run_tuned_or_pinned(fc, true, true, 0);
  ASSERT_GE(tuned_fc.index, 0);
  EXPECT_LT(testing::rel_diff(tuned_fc.aux, tuned_fc.want), testing::kBF16Tol);
  std::vector<double> gelu = tuned_fc.want;
  for (double& x : gelu) x = gelu_tanh(x);
  EXPECT_LT(testing::rel_diff(tuned_fc.c, gelu), testing::kBF16Tol);
  const Outputs plain_fc = run_tuned_or_pinned(fc, true, false, tuned_fc.index);
  EXPECT_EQ(plain_fc.index, tuned_fc.index);
  EXPECT_TRUE(plain_fc.c == tuned_fc.c) << "tune mode changed a GELU_AUX GEMM's C";
  EXPECT_TRUE(plain_fc.aux == tuned_fc.aux) << "tune mode changed a GELU_AUX GEMM's aux";
}

}  // namespace
}  // namespace gtron

// The MoE router ops (model/ops/moe_router.h): affinities, the top-k choice and its gates, the
// balance loss; values against scalar references, f64 gradient checks, accumulation, reruns.
#include "model/ops/moe_router.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "tests/model/gradcheck.h"
#include "tests/model/op_check.h"

namespace gtron {
namespace {

// Router logits [N, E] whose rows are a random permutation of 0, 0.4, 0.8, ... plus noise of
// std 0.01: every score (and score + a small bias) is at least ~0.1 from every other, so the
// top-k choice does not move under the gradient checks' 1e-6 steps.
Tensor separated_logits(int64_t N, int64_t E, uint64_t seed) {
  std::vector<double> noise = testing::randn(static_cast<size_t>(N * E), seed, 0.01);
  std::vector<double> v(static_cast<size_t>(N * E));
  uint64_t s = seed;
  for (int64_t n = 0; n < N; ++n) {
    std::vector<int> perm(static_cast<size_t>(E));
    std::iota(perm.begin(), perm.end(), 0);
    for (int64_t i = E - 1; i > 0; --i) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      std::swap(perm[static_cast<size_t>(i)], perm[(s >> 33) % static_cast<uint64_t>(i + 1)]);
    }
    for (int64_t e = 0; e < E; ++e) {
      v[static_cast<size_t>(n * E + e)] =
          0.4 * perm[static_cast<size_t>(e)] - 1.2 + noise[static_cast<size_t>(n * E + e)];
    }
  }
  return Tensor::from_vector(v, {N, E}, DType::kF64);
}

TEST(RouterScores, SoftmaxAndSigmoidMatchScalarReference) {
  Tensor z = testing::randn_tensor({3, 5}, 1, 2.0);
  std::vector<double> in = z.to_vector();
  std::vector<double> sm =
      router_scores(Var::constant(z), MoeRouterKind::kSoftmax).value().to_vector();
  std::vector<double> sg =
      router_scores(Var::constant(z), MoeRouterKind::kSigmoid).value().to_vector();
  for (int n = 0; n < 3; ++n) {
    double sum = 0;
    for (int e = 0; e < 5; ++e) sum += std::exp(in[n * 5 + e]);
    for (int e = 0; e < 5; ++e) {
      EXPECT_NEAR(sm[n * 5 + e], std::exp(in[n * 5 + e]) / sum, 1e-15);
      EXPECT_NEAR(sg[n * 5 + e], 1 / (1 + std::exp(-in[n * 5 + e])), 1e-15);
    }
  }
}

TEST(RouterScores, GradCheck) {
  for (MoeRouterKind kind : {MoeRouterKind::kSoftmax, MoeRouterKind::kSigmoid}) {
    auto res = testing::gradcheck(
        [kind](const std::vector<Var>& in) { return router_scores(in[0], kind); },
        {testing::randn_tensor({2, 3, 7}, 2, 1.5)}, {});
    EXPECT_LT(res.worst_error, 1e-7) << res.worst_name;
  }
}

TEST(TopKGates, ChoosesLargestAndBreaksTiesByLowerIndex) {
  // Row 0: experts 1 and 3 tie at 0.5 above the rest: slot 0 = 1, slot 1 = 3.
  // Row 1: all equal: experts 0, 1. Row 2: the bias moves the choice but not the gates.
  Tensor s = Tensor::from_vector({0.1, 0.5, 0.2, 0.5, 0.3, 0.3, 0.3, 0.3, 0.9, 0.8, 0.1, 0.2},
                                 {3, 4}, DType::kF64);
  TopKGates plain = topk_gates(Var::constant(s), Tensor(), 2, /*normalize=*/false);
  EXPECT_EQ(plain.ids.to_vector(), (std::vector<double>{1, 3, 0, 1, 0, 1}));
  EXPECT_EQ(plain.gates.value().to_vector(), (std::vector<double>{0.5, 0.5, 0.3, 0.3, 0.9, 0.8}));
  Tensor bias = Tensor::from_vector({0, 0, 1, 0}, {4}, DType::kF64);
  TopKGates biased = topk_gates(Var::constant(s), bias, 2, /*normalize=*/true);
  EXPECT_EQ(biased.ids.to_vector(), (std::vector<double>{2, 1, 2, 0, 2, 0}));
  std::vector<double> g = biased.gates.value().to_vector();
  EXPECT_NEAR(g[0], 0.2 / 0.7, 1e-15);  // from the affinities, without the bias
  EXPECT_NEAR(g[1], 0.5 / 0.7, 1e-15);
  EXPECT_NEAR(g[4], 0.1 / 1.0, 1e-15);
  EXPECT_NEAR(g[5], 0.9 / 1.0, 1e-15);
}

// The router through its gates: logits -> affinities -> top-k gates, both routers, with and
// without renormalization, with a bias on the sigmoid's choice.
TEST(TopKGates, RouterGradCheckThroughTheGates) {
  const int64_t N = 9, E = 6;
  Tensor bias = Tensor::from_vector({0.02, -0.03, 0, 0.01, 0, -0.02}, {E}, DType::kF64);
  for (MoeRouterKind kind : {MoeRouterKind::kSoftmax, MoeRouterKind::kSigmoid}) {
    for (bool normalize : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "sigmoid " << (kind == MoeRouterKind::kSigmoid)
                                        << " normalize " << normalize);
      auto f = [&](const std::vector<Var>& in) {
        const Tensor b = kind == MoeRouterKind::kSigmoid ? bias : Tensor();
        return topk_gates(router_scores(in[0], kind), b, 2, normalize).gates;
      };
      auto res = testing::gradcheck(f, {separated_logits(N, E, 3)}, {});
      EXPECT_LT(res.worst_error, 1e-7) << res.worst_name;
    }
  }
}

TEST(TopKGates, BackwardAccumulates) {
  Var s = Var::leaf(
      router_scores(Var::constant(separated_logits(5, 4, 4)), MoeRouterKind::kSigmoid).value());
  Tensor dg = testing::randn_tensor({5, 2}, 5);
  backward_with(topk_gates(s, Tensor(), 2, true).gates, dg);
  std::vector<double> once = s.grad().to_vector();
  backward_with(topk_gates(s, Tensor(), 2, true).gates, dg);
  std::vector<double> twice = s.grad().to_vector();
  for (size_t i = 0; i < once.size(); ++i) EXPECT_DOUBLE_EQ(twice[i], 2 * once[i]);
}

TEST(MoeAuxLoss, MatchesSwitchFormula) {
  const int64_t N = 6, E = 4;
  const int k = 2;
  for (bool sigmoid : {false, true}) {
    Tensor z = separated_logits(N, E, 6);
    Var s = router_scores(Var::constant(z),
                          sigmoid ? MoeRouterKind::kSigmoid : MoeRouterKind::kSoftmax);
    TopKGates top = topk_gates(s, Tensor(), k, true);
    const double loss = moe_aux_loss(s, top.ids, 0.01, sigmoid).value().item();
    std::vector<double> sv = s.value().to_vector(), ids = top.ids.to_vector();
    double want = 0;
    for (int64_t e = 0; e < E; ++e) {
      double f = 0, P = 0;
      for (double id : ids) f += id == static_cast<double>(e);
      f /= N * k;
      for (int64_t n = 0; n < N; ++n) {
        double row = 0;
        for (int64_t i = 0; i < E; ++i) row += sv[n * E + i];
        P += sv[n * E + e] / (sigmoid ? row : 1.0);
      }
      want += f * P / N;
    }
    EXPECT_NEAR(loss, 0.01 * E * want, 1e-15);
  }
}

TEST(MoeAuxLoss, GradCheck) {
  for (bool sigmoid : {false, true}) {
    const MoeRouterKind kind = sigmoid ? MoeRouterKind::kSigmoid : MoeRouterKind::kSoftmax;
    auto f = [&](const std::vector<Var>& in) {
      Var s = router_scores(in[0], kind);
      return moe_aux_loss(s, topk_gates(s, Tensor(), 3, true).ids, 0.1, sigmoid);
    };
    auto res = testing::gradcheck(f, {separated_logits(7, 5, 7)}, {});
    EXPECT_LT(res.worst_error, 1e-7) << res.worst_name;
  }
}

Var router_chain(const std::vector<Var>& in) {
  Var s = router_scores(in[0], MoeRouterKind::kSoftmax);
  return topk_gates(s, Tensor(), 2, true).gates;
}

TEST(TopKGates, DeterministicAcrossRunsAndThreadCounts) {
  std::vector<Tensor> in = {testing::randn_tensor({512, 16}, 8)};
  auto first = testing::run_op(router_chain, in, DType::kF32);
  EXPECT_EQ(first, testing::run_op(router_chain, in, DType::kF32));
  testing::with_threads(1,
                        [&] { EXPECT_EQ(first, testing::run_op(router_chain, in, DType::kF32)); });
}

}  // namespace
}  // namespace gtron

// The mixture-of-experts ops on CUDA against their CPU kernels (GPU test; skipped without a GPU):
// router scores, the top-k choice (ids and gates equal to the CPU's, ties included), the balance
// loss, the plan (pos, src, offsets and load equal to the CPU's), dispatch and combine (with f32
// gates next to bf16 rows), and the grouped expert GEMMs on both kernels (tensor cores and the
// fp32 twin) with empty, one-row and multi-tile groups, accumulating and first-write gradients.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "model/ops/grouped_linear.h"
#include "model/ops/grouped_wgmma.h"
#include "model/ops/moe_dispatch.h"
#include "model/ops/moe_router.h"
#include "tests/model/cuda_op_check.h"
#include "tests/model/gradcheck.h"
#include "tests/model/op_check.h"

namespace gtron {
namespace {

uint64_t lcg(uint64_t& s) {
  s = s * 6364136223846793005ull + 1442695040888963407ull;
  return s >> 33;
}

// ids [N, k] (CPU i32), k distinct experts a row. `hot` > 0: every row takes expert hot − 1
// first (a skewed router); `span` < E: the rows use experts [0, span) only (the rest get none).
Tensor random_ids(int64_t N, int k, int64_t E, uint64_t seed, int hot = 0, int64_t span = 0) {
  const int64_t range = span > 0 ? span : E;
  std::vector<int32_t> ids;
  for (int64_t n = 0; n < N; ++n) {
    std::vector<int32_t> row;
    if (hot > 0) row.push_back(hot - 1);
    while (static_cast<int>(row.size()) < k) {
      const auto e = static_cast<int32_t>(lcg(seed) % static_cast<uint64_t>(range));
      bool seen = false;
      for (int32_t r : row) seen = seen || r == e;
      if (!seen) row.push_back(e);
    }
    ids.insert(ids.end(), row.begin(), row.end());
  }
  return Tensor::from_ints(ids, {N, k});
}

// `ids` where `dev` can read it.
Tensor ids_on(const Tensor& ids, Device dev) { return dev.is_cpu() ? ids : ids.to(dev); }

std::vector<double> host(const Tensor& t) { return t.to_vector(); }

TEST(MoeRouterCuda, ScoresMatchCpu) {
  GTRON_REQUIRE_GPU();
  for (MoeRouterKind kind : {MoeRouterKind::kSoftmax, MoeRouterKind::kSigmoid}) {
    for (int64_t E : {5, 70, 512}) {
      SCOPED_TRACE(std::string(kind == MoeRouterKind::kSigmoid ? "sigmoid" : "softmax") + ", E " +
                   std::to_string(E));
      testing::OpCase c;
      c.f = [kind](const std::vector<Var>& in, const std::vector<Var>&) {
        return router_scores(in[0], kind);
      };
      c.inputs = {testing::randn_tensor({3, 11, E}, 1, 2.0)};
      testing::expect_cuda_matches_cpu(c, DType::kF32, testing::kF32Tol);
      testing::expect_cuda_matches_cpu(c, DType::kBF16, testing::kBF16Tol);
    }
  }
}

// Note [router determinism]: from the same f32 values the GPU chooses the CPU's experts and
// forms its gates bit for bit, ties (scores on a grid of 1/8, biases on 1/16) included.
TEST(MoeRouterCuda, TopKIdsAndGatesEqualTheCpu) {
  GTRON_REQUIRE_GPU();
  NoGradGuard no_grad;
  const int64_t N = 300;
  for (int64_t E : {6, 64, 200, 512}) {
    for (int k : {1, 2, 8}) {
      if (k > E) continue;
      for (bool normalize : {false, true}) {
        for (bool with_bias : {false, true}) {
          SCOPED_TRACE("E " + std::to_string(E) + ", k " + std::to_string(k) +
                       (normalize ? ", normalized" : "") + (with_bias ? ", bias" : ""));
          uint64_t seed = static_cast<uint64_t>(E * 31 + k);
          std::vector<double> s(static_cast<size_t>(N * E)), b(static_cast<size_t>(E));
          for (double& v : s) v = static_cast<double>(1 + lcg(seed) % 8) / 8;  // many ties
          for (double& v : b) v = (static_cast<double>(lcg(seed) % 5) - 2) / 16;
          const Tensor sc = Tensor::from_vector(s, {N, E}, DType::kF32);
          const Tensor bc = with_bias ? Tensor::from_vector(b, {E}, DType::kF32) : Tensor();
          const TopKGates cpu = topk_gates(Var::constant(sc), bc, k, normalize);
          const Device g = Device::cuda(0);
          const TopKGates gpu =
              topk_gates(Var::constant(sc.to(g)), with_bias ? bc.to(g) : Tensor(), k, normalize);
          EXPECT_EQ(host(gpu.ids), host(cpu.ids));
          EXPECT_EQ(host(gpu.gates.value()), host(cpu.gates.value()));
        }
      }
    }
  }
}

// The gates' backward (plain and normalized) into f32 scores, accumulating.
TEST(MoeRouterCuda, TopKBackwardMatchesCpu) {
  GTRON_REQUIRE_GPU();
  const int64_t E = 37;
  std::vector<double> s = testing::randn(static_cast<size_t>(29 * E), 4);
  for (double& v : s) v = 0.1 + std::fabs(v);  // affinities are positive
  const Tensor bias = testing::randn_tensor({E}, 5, 0.1, DType::kF32);
  for (int k : {1, 3}) {
    for (bool normalize : {false, true}) {
      SCOPED_TRACE("k " + std::to_string(k) + (normalize ? ", normalized" : ""));
      testing::OpCase c;
      c.f = [&bias, k, normalize](const std::vector<Var>& in, const std::vector<Var>&) {
        const Device d = in[0].device();
        return topk_gates(in[0], d.is_cpu() ? bias : bias.to(d), k, normalize).gates;
      };
      c.inputs = {Tensor::from_vector(s, {29, E}, DType::kF32)};
      testing::expect_cuda_matches_cpu(c, DType::kF32, testing::kF32Tol);
    }
  }
}

// logits -> scores -> top-k -> the balance loss, both routers; in bf16 the logits are bf16 and
// the rest f32 (Note [fp32 routing on CUDA]).
TEST(MoeRouterCuda, BalanceLossMatchesCpu) {
  GTRON_REQUIRE_GPU();
  for (MoeRouterKind kind : {MoeRouterKind::kSoftmax, MoeRouterKind::kSigmoid}) {
    SCOPED_TRACE(kind == MoeRouterKind::kSigmoid ? "sigmoid" : "softmax");
    testing::OpCase c;
    c.f = [kind](const std::vector<Var>& in, const std::vector<Var>&) {
      const bool sigmoid = kind == MoeRouterKind::kSigmoid;
      const Var scores = router_scores(in[0], kind);
      const TopKGates top = topk_gates(scores, Tensor(), 3, true);
      return moe_aux_loss(scores, top.ids, 0.01, sigmoid);
    };
    c.inputs = {testing::randn_tensor({41, 9}, 6, 1.5)};
    testing::expect_cuda_matches_cpu(c, DType::kF32, testing::kF32Tol);
    testing::expect_cuda_matches_cpu(c, DType::kBF16, testing::kBF16Tol);
  }
}

// Note [MoE plan on CUDA]: pos, src and offsets equal the CPU's; the load counters advance by
// each plan's counts (twice: they accumulate).
TEST(MoeDispatchCuda, PlanEqualsTheCpu) {
  GTRON_REQUIRE_GPU();
  struct Case {
    int64_t N;
    int k;
    int64_t E;
    int hot;
    int64_t span;
  };
  for (const Case& c :
       {Case{1, 1, 1, 0, 0}, Case{7, 2, 4, 0, 0}, Case{3000, 8, 64, 0, 0}, Case{2500, 4, 16, 4, 0},
        Case{1000, 1, 512, 0, 0}, Case{5000, 2, 300, 0, 10}}) {
    SCOPED_TRACE("N " + std::to_string(c.N) + ", k " + std::to_string(c.k) + ", E " +
                 std::to_string(c.E));
    const Tensor ids = random_ids(c.N, c.k, c.E, static_cast<uint64_t>(c.N + c.E), c.hot, c.span);
    std::vector<int64_t> load(static_cast<size_t>(c.E), 0);
    const MoePlan cpu = moe_plan(ids, c.E, load.data());
    const Device g = Device::cuda(0);
    const Tensor dev_load = Tensor::zeros({c.E}, DType::kI32, g);
    const MoePlan gpu = moe_plan(ids.to(g), c.E, nullptr, dev_load);
    EXPECT_EQ(host(gpu.pos), host(cpu.pos));
    EXPECT_EQ(host(gpu.src), host(cpu.src));
    EXPECT_EQ(host(gpu.offsets), host(cpu.offsets));
    moe_plan(ids.to(g), c.E, nullptr, dev_load);
    const std::vector<double> got = host(dev_load);
    for (int64_t e = 0; e < c.E; ++e) {
      EXPECT_EQ(got[static_cast<size_t>(e)],
                2.0 * static_cast<double>(load[static_cast<size_t>(e)]))
          << "expert " << e;
    }
  }
}

TEST(MoeDispatchCuda, DispatchAndCombineMatchCpu) {
  GTRON_REQUIRE_GPU();
  const int64_t N = 45, E = 6;
  const int k = 3;
  const Tensor ids = random_ids(N, k, E, 8);
  auto plan_on = [&ids, E](Device d) { return moe_plan(ids_on(ids, d), E); };
  for (int64_t C : {5, 64}) {  // one element a thread, then 16-byte packs
    SCOPED_TRACE("C " + std::to_string(C));
    testing::OpCase dispatch;
    dispatch.f = [&](const std::vector<Var>& in, const std::vector<Var>&) {
      return moe_dispatch(in[0], plan_on(in[0].device()));
    };
    dispatch.inputs = {testing::randn_tensor({N, C}, 2)};
    // Gathers and ordered sums: the CPU's f32 bits.
    testing::expect_cuda_matches_cpu(dispatch, DType::kF32, testing::kF32Tol, /*exact=*/true);
    testing::expect_cuda_matches_cpu(dispatch, DType::kBF16, testing::kBF16Tol);
    testing::OpCase combine;
    combine.f = [&](const std::vector<Var>& in, const std::vector<Var>&) {
      return moe_combine(in[0], in[1], plan_on(in[0].device()), Shape{N, C});
    };
    combine.inputs = {testing::randn_tensor({N * k, C}, 3), testing::randn_tensor({N, k}, 4)};
    testing::expect_cuda_matches_cpu(combine, DType::kF32, testing::kF32Tol);
    testing::expect_cuda_matches_cpu(combine, DType::kBF16, testing::kBF16Tol);
  }
}

// The routing chain as the layer runs it: bf16 logits, f32 scores and gates, combine of bf16 rows
// with f32 gates, and every backward back to the logits and the rows.
TEST(MoeDispatchCuda, RoutedCombineTakesFp32Gates) {
  GTRON_REQUIRE_GPU();
  const int64_t N = 33, E = 7, C = 24;
  const int k = 2;
  testing::OpCase c;
  c.f = [&](const std::vector<Var>& in, const std::vector<Var>&) {
    const Var scores = router_scores(in[0], MoeRouterKind::kSoftmax);
    const TopKGates top = topk_gates(scores, Tensor(), k, true);
    return moe_combine(in[1], top.gates, moe_plan(top.ids, E), Shape{N, C});
  };
  c.inputs = {testing::randn_tensor({N, E}, 9, 2.0), testing::randn_tensor({N * k, C}, 10)};
  testing::expect_cuda_matches_cpu(c, DType::kF32, testing::kF32Tol);
  testing::expect_cuda_matches_cpu(c, DType::kBF16, testing::kBF16Tol);
}

// offsets of groups of the given row counts.
Tensor offsets_of(const std::vector<int32_t>& rows) {
  std::vector<int32_t> off{0};
  for (int32_t r : rows) off.push_back(off.back() + r);
  return Tensor::from_ints(off, {static_cast<int64_t>(off.size())});
}

int64_t total(const std::vector<int32_t>& rows) {
  int64_t t = 0;
  for (int32_t r : rows) t += r;
  return t;
}

struct GroupedCase {
  int64_t Cin, Cout;
  std::vector<int32_t> rows;
  std::string what;
};

std::vector<GroupedCase> grouped_cases() {
  std::vector<int32_t> many;
  uint64_t s = 17;
  for (int g = 0; g < 300; ++g) many.push_back(static_cast<int32_t>(lcg(s) % 4));
  return {
      // Tensor cores (bf16): an empty group, a one-row group, groups of 2 and 3 row tiles, Cout
      // not a multiple of the 128-column tile; dgrad's K (Cout) ends mid-tile.
      {64, 136, {0, 1, 130, 7, 300}, "tensor cores, tails"},
      // Cin = 72: the forward's K ends 8 into its second 64-wide step; trailing empty groups.
      {72, 40, {129, 0, 0, 64, 0}, "tensor cores, K tail"},
      // 300 groups (the tile search splits them over the CTA's threads), many empty.
      {16, 16, many, "tensor cores, 300 groups"},
      // Rows of 13 and 7: the fp32 tiled kernel in bf16 too.
      {13, 7, {5, 0, 40, 1}, "odd sizes"},
      // Several 64-deep k steps (more than the wgmma kernels' stages) in every product, and
      // groups spanning several row tiles.
      {320, 264, {0, 1, 257, 130, 515}, "several k steps"},
  };
}

void expect_grouped_cases_match_cpu() {
  for (const GroupedCase& gc : grouped_cases()) {
    SCOPED_TRACE(gc.what);
    const Tensor offsets = offsets_of(gc.rows);
    testing::OpCase c;
    c.f = [offsets](const std::vector<Var>& in, const std::vector<Var>& params) {
      return grouped_linear(in[0], params, offsets);
    };
    c.inputs = {testing::randn_tensor({total(gc.rows), gc.Cin}, 21)};
    for (size_t g = 0; g < gc.rows.size(); ++g) {
      c.params.push_back(testing::randn_tensor({gc.Cout, gc.Cin}, 100 + g, 0.2));
    }
    testing::expect_cuda_matches_cpu(c, DType::kF32, testing::kF32Tol);
    testing::expect_cuda_matches_cpu(c, DType::kBF16, testing::kBF16Tol);
  }
}

TEST(GroupedLinearCuda, MatchesCpu) {
  GTRON_REQUIRE_GPU();
  cuda::set_grouped_kernel(cuda::GroupedKernel::kMma);
  expect_grouped_cases_match_cpu();
}

// Note [first gradient write]: with every weight gradient unwritten (garbage in main_grad) and no
// gradient yet on x, the kernels write instead of adding: the results equal the CPU's from zero,
// and an empty group's gradient is exactly zero.
void expect_first_writes_overwrite() {
  const std::vector<int32_t> rows = {33, 0, 140, 2};
  const int64_t Cin = 24, Cout = 48, M = total(rows);
  const Tensor offsets = offsets_of(rows);
  const Tensor x = testing::randn_tensor({M, Cin}, 31, 1.0, DType::kF32);
  const Tensor dy = testing::randn_tensor({M, Cout}, 32, 1.0, DType::kF32);
  for (DType act : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(dtype_name(act));
    auto round = [act](const Tensor& t) {
      return act == DType::kBF16 ? t.to(DType::kBF16).to(DType::kF32) : t;
    };
    std::vector<std::unique_ptr<Parameter>> cpu_p, gpu_p;
    std::vector<Var> cpu_w, gpu_w;
    for (size_t g = 0; g < rows.size(); ++g) {
      const Tensor w = round(testing::randn_tensor({Cout, Cin}, 40 + g, 0.2, DType::kF32));
      cpu_p.push_back(std::make_unique<Parameter>("w" + std::to_string(g), w));
      cpu_p.back()->main_grad = Tensor::zeros({Cout, Cin}, DType::kF32);
      cpu_w.push_back(Var::param(*cpu_p.back()));
      const Device d = Device::cuda(0);
      gpu_p.push_back(std::make_unique<Parameter>("w" + std::to_string(g),
                                                  act == DType::kF32 ? w.to(d) : w.to(act).to(d)));
      Parameter& p = *gpu_p.back();
      const std::vector<double> nan(static_cast<size_t>(Cout * Cin),
                                    std::numeric_limits<double>::quiet_NaN());
      p.main_grad = Tensor::from_vector(nan, {Cout, Cin}, DType::kF32).to(d);
      p.grad_unwritten = true;
      gpu_w.push_back(Var::param(p));
    }
    const Var xc = Var::leaf(round(x));
    backward_with(grouped_linear(xc, cpu_w, offsets), round(dy));
    const Device d = Device::cuda(0);
    const Var xg = Var::leaf(act == DType::kF32 ? x.to(d) : x.to(act).to(d));
    backward_with(grouped_linear(xg, gpu_w, offsets),
                  act == DType::kF32 ? dy.to(d) : dy.to(act).to(d));
    const double tol = act == DType::kF32 ? testing::kF32Tol : testing::kBF16Tol;
    EXPECT_LT(testing::rel_diff(host(xg.grad()), host(xc.grad())), tol) << "dx";
    for (size_t g = 0; g < rows.size(); ++g) {
      const std::vector<double> got = host(gpu_p[g]->main_grad);
      EXPECT_LT(testing::rel_diff(got, host(cpu_p[g]->main_grad)), tol) << "dW " << g;
      if (rows[g] == 0) {
        EXPECT_EQ(got, std::vector<double>(got.size(), 0.0)) << "dW " << g;
      }
    }
  }
}

TEST(GroupedLinearCuda, FirstWritesOverwrite) {
  GTRON_REQUIRE_GPU();
  cuda::set_grouped_kernel(cuda::GroupedKernel::kMma);
  expect_first_writes_overwrite();
}

// Note [grouped GEMM on wgmma]: the sm_90a kernels (3 and 4 stages) take the same cases, and
// rerun bit-identically (no atomics, one summation order).
TEST(GroupedLinearCuda, WgmmaKernelsMatchCpu) {
  GTRON_REQUIRE_GPU();
  if (!cuda::grouped_wgmma_usable()) GTEST_SKIP() << "needs a compute-capability 9.0 GPU";
  for (cuda::GroupedKernel k : {cuda::GroupedKernel::kWgmma3, cuda::GroupedKernel::kWgmma4}) {
    SCOPED_TRACE(k == cuda::GroupedKernel::kWgmma3 ? "wgmma3" : "wgmma4");
    cuda::set_grouped_kernel(k);
    expect_grouped_cases_match_cpu();
    expect_first_writes_overwrite();
  }
  cuda::set_grouped_kernel(cuda::GroupedKernel::kMma);
}

TEST(GroupedLinearCuda, WgmmaKernelRerunsBitIdentically) {
  GTRON_REQUIRE_GPU();
  if (!cuda::grouped_wgmma_usable()) GTEST_SKIP() << "needs a compute-capability 9.0 GPU";
  cuda::set_grouped_kernel(cuda::GroupedKernel::kWgmma4);
  const std::vector<int32_t> rows = {3, 0, 300, 129, 64};
  const int64_t Cin = 192, Cout = 136, M = total(rows);
  const Device d = Device::cuda(0);
  const Tensor offsets = offsets_of(rows);
  const Tensor x = testing::randn_tensor({M, Cin}, 51, 1.0, DType::kF32).to(DType::kBF16).to(d);
  const Tensor dy = testing::randn_tensor({M, Cout}, 52, 1.0, DType::kF32).to(DType::kBF16).to(d);
  std::vector<std::unique_ptr<Parameter>> ps;
  std::vector<Var> ws;
  for (size_t g = 0; g < rows.size(); ++g) {
    const Tensor w = testing::randn_tensor({Cout, Cin}, 60 + g, 0.2, DType::kF32);
    ps.push_back(std::make_unique<Parameter>("w" + std::to_string(g), w.to(DType::kBF16).to(d)));
    ps.back()->main_grad = Tensor::zeros({Cout, Cin}, DType::kF32, d);
    ws.push_back(Var::param(*ps.back()));
  }
  std::vector<std::vector<double>> first;
  for (int run = 0; run < 2; ++run) {
    for (auto& p : ps) p->main_grad.zero_();
    const Var xv = Var::leaf(x);
    const Var y = grouped_linear(xv, ws, offsets);
    backward_with(y, dy);
    std::vector<std::vector<double>> got = {host(y.value()), host(xv.grad())};
    for (auto& p : ps) got.push_back(host(p->main_grad));
    if (run == 0) {
      first = got;
    } else {
      for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], first[i]) << "output " << i;
    }
  }
  cuda::set_grouped_kernel(cuda::GroupedKernel::kMma);
}

// G expert weights [Cout, Cin] (standard deviation 0.2, seeds seed0 + g) as parameters on `d` with
// fp32 main_grad slots; their Vars read the fp32 masters, or bf16 copies (the shadow path).
struct ExpertWeights {
  std::vector<std::unique_ptr<Parameter>> ps;
  std::vector<Var> ws;
};
ExpertWeights expert_weights(int64_t G, int64_t Cout, int64_t Cin, uint64_t seed0, bool masters,
                             Device d) {
  ExpertWeights e;
  for (int64_t g = 0; g < G; ++g) {
    const Tensor w = testing::randn_tensor({Cout, Cin}, seed0 + g, 0.2, DType::kF32);
    e.ps.push_back(std::make_unique<Parameter>("w" + std::to_string(g), w.to(d)));
    e.ps.back()->main_grad = Tensor::zeros({Cout, Cin}, DType::kF32, d);
    e.ws.push_back(masters ? Var::param(*e.ps.back())
                           : Var::param_as(*e.ps.back(), w.to(DType::kBF16).to(d)));
  }
  return e;
}

// y, x's gradient and every weight gradient, after backward_with(y, dy).
std::vector<std::vector<double>> grouped_results(const Var& y, const Var& x,
                                                 const ExpertWeights& e) {
  std::vector<std::vector<double>> r = {host(y.value()), host(x.grad())};
  for (const auto& p : e.ps) r.push_back(host(p->main_grad));
  return r;
}

void expect_same_results(const std::vector<std::vector<double>> (&results)[2]) {
  ASSERT_EQ(results[0].size(), results[1].size());
  for (size_t i = 0; i < results[0].size(); ++i) {
    EXPECT_EQ(results[1][i], results[0][i]) << "output " << i;
  }
}

// Note [grouped GEMM on fp32 masters]: fp32 weights beside bf16 rows give the products of their
// bf16 roundings bit for bit (the kernel rounds as the shadow's cast does), forward and backward;
// the weight gradient lands in the same fp32 main_grad.
TEST(GroupedLinearCuda, Fp32MasterWeightsEqualTheShadowPath) {
  GTRON_REQUIRE_GPU();
  if (!cuda::grouped_wgmma_usable()) GTEST_SKIP() << "needs a compute-capability 9.0 GPU";
  const std::vector<int32_t> rows = {3, 0, 300, 129, 64};
  const int64_t Cin = 192, Cout = 136, M = total(rows);
  const Device d = Device::cuda(0);
  const Tensor offsets = offsets_of(rows);
  const Tensor x = testing::randn_tensor({M, Cin}, 71, 1.0, DType::kF32).to(DType::kBF16).to(d);
  const Tensor dy = testing::randn_tensor({M, Cout}, 72, 1.0, DType::kF32).to(DType::kBF16).to(d);
  for (cuda::GroupedKernel k : {cuda::GroupedKernel::kWgmma3, cuda::GroupedKernel::kWgmma4}) {
    SCOPED_TRACE(k == cuda::GroupedKernel::kWgmma3 ? "wgmma3" : "wgmma4");
    cuda::set_grouped_kernel(k);
    cuda::set_grouped_master_weights(true);
    ASSERT_TRUE(cuda::grouped_master_weights());
    std::vector<std::vector<double>> results[2];
    for (int masters = 0; masters < 2; ++masters) {
      const ExpertWeights e =
          expert_weights(static_cast<int64_t>(rows.size()), Cout, Cin, 80, masters == 1, d);
      const Var xv = Var::leaf(x);
      const Var y = grouped_linear(xv, e.ws, offsets);
      backward_with(y, dy);
      results[masters] = grouped_results(y, xv, e);
    }
    expect_same_results(results);
  }
  cuda::set_grouped_master_weights(false);
  cuda::set_grouped_kernel(cuda::GroupedKernel::kMma);
}

// Note [regathered expert rows]: the gathered op gives grouped_linear(moe_dispatch(x)) bit for bit:
// outputs, x's gradient (dispatch's backward from scratch rows) and every weight gradient, on the
// bf16 shadows and on the fp32 masters.
TEST(GroupedLinearCuda, GatheredRowsEqualDispatchThenGrouped) {
  GTRON_REQUIRE_GPU();
  // The fp32 masters need a wgmma kernel; the bf16 weights run on whichever kernel the GPU has.
  const bool wgmma = cuda::grouped_wgmma_usable();
  const int64_t N = 150, E = 5, Cin = 192, Cout = 136;
  const int k = 3;
  const Device d = Device::cuda(0);
  const MoePlan plan =
      moe_plan(random_ids(N, k, E, 91, /*hot=*/1, /*span=*/4).to(d), E);  // expert 4: empty
  const Tensor x = testing::randn_tensor({N, Cin}, 92, 1.0, DType::kF32).to(DType::kBF16).to(d);
  const Tensor dy =
      testing::randn_tensor({N * k, Cout}, 93, 1.0, DType::kF32).to(DType::kBF16).to(d);
  cuda::set_grouped_kernel(wgmma ? cuda::GroupedKernel::kWgmma3 : cuda::GroupedKernel::kMma);
  for (bool masters : {false, true}) {
    if (masters && !wgmma) continue;
    SCOPED_TRACE(masters ? "fp32 masters" : "bf16 weights");
    cuda::set_grouped_master_weights(masters);
    std::vector<std::vector<double>> results[2];
    for (int gathered = 0; gathered < 2; ++gathered) {
      const ExpertWeights e = expert_weights(E, Cout, Cin, 95, masters, d);
      const Var xv = Var::leaf(x);
      const Var y = gathered ? grouped_linear_gathered(xv, plan, e.ws)
                             : grouped_linear(moe_dispatch(xv, plan), e.ws, plan.offsets);
      backward_with(y, dy);
      results[gathered] = grouped_results(y, xv, e);
    }
    expect_same_results(results);
  }
  cuda::set_grouped_master_weights(false);
  cuda::set_grouped_kernel(cuda::GroupedKernel::kMma);
}

}  // namespace
}  // namespace gtron

// Expert parallelism of one MoE layer (Note [expert parallelism] in model/moe.h) with 2 and 4
// thread ranks over Gloo, against one process running the layer over the ranks' rows stacked:
// the outputs, the input gradients and the held experts' weight gradients are the one-process
// values (the same rows reach each expert in the same order); the router's and the shared
// expert's gradients and the load counts sum over the ranks to the one-process ones. Also a rank
// whose experts receive no token, the layer's parameter list under EP, and the grid's EP and
// expert-data groups.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "model/moe.h"
#include "parallel/expert_parallel.h"
#include "parallel/gloo_communicator.h"
#include "tests/model/gradcheck.h"
#include "tests/parallel/ranks.h"

namespace gtron::parallel {
namespace {

constexpr int64_t C = 8;
constexpr int64_t kRowsPerRank = 12;

MoeDims dims() {
  MoeDims d;
  d.E = 8;
  d.top_k = 2;
  d.num_shared = 1;
  d.F = 5;
  d.router = MoeRouterKind::kSigmoid;
  d.aux_loss_weight = 0.05;
  return d;
}

struct LayerRun {
  std::vector<double> y, dx;
  std::map<std::string, std::vector<double>> grads;  // by parameter name
  std::vector<int64_t> load;
};

// Forward over x's rows [row0, row0 + n) of the stacked input, backward seeded with the same rows
// of a fixed dy. `bias` (E values) is set as the router bias first.
LayerRun run_layer(MoeLayer& moe, ParamRegistry& reg, int64_t row0, int64_t n, int64_t total,
                   const std::vector<double>& bias) {
  const std::vector<double> x_all = testing::randn(static_cast<size_t>(total * C), 21);
  const std::vector<double> dy_all = testing::randn(static_cast<size_t>(total * C), 22);
  const auto rows = [&](const std::vector<double>& v) {
    return std::vector<double>(v.begin() + row0 * C, v.begin() + (row0 + n) * C);
  };
  moe.expert_bias().copy_from(Tensor::from_vector(bias, {moe.dims().E}, DType::kF64));
  Var x = Var::leaf(Tensor::from_vector(rows(x_all), {n, C}, DType::kF64));
  DirectWeights access;
  Var y = moe.forward(x, access);
  backward_with(y, Tensor::from_vector(rows(dy_all), {n, C}, DType::kF64));
  LayerRun r;
  r.y = y.value().to_vector();
  r.dx = x.grad().to_vector();
  for (const Parameter* p : reg.all()) r.grads[p->name] = p->main_grad.to_vector();
  r.load = moe.load();
  return r;
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    worst = std::max(worst, std::fabs(a[i] - b[i]));
  return worst;
}

void check_against_one_process(int P, const std::vector<double>& bias) {
  const int64_t total = P * kRowsPerRank;
  ParamRegistry reg(DType::kF64, Device::cpu(), 5);
  MoeLayer one(reg, "moe", C, dims(), 0.3, 0.2);
  const LayerRun want = run_layer(one, reg, 0, total, total, bias);

  test_util::run_ranks(P, [&](int rank, StoreClient& store) {
    GlooOptions o;
    o.timeout = std::chrono::seconds(15);
    GlooCommunicator comm(store, "ep", rank, P, o);
    CommExpertParallel ep(&comm);
    MoeDims d = dims();
    d.ep_size = P;
    d.ep_rank = rank;
    ParamRegistry r_reg(DType::kF64, Device::cpu(), 5);
    MoeLayer moe(r_reg, "moe", C, d, 0.3, 0.2);
    moe.set_expert_parallel(&ep);
    const LayerRun got = run_layer(moe, r_reg, rank * kRowsPerRank, kRowsPerRank, total, bias);

    const auto mine = [&](const std::vector<double>& v) {
      return std::vector<double>(v.begin() + rank * kRowsPerRank * C,
                                 v.begin() + (rank + 1) * kRowsPerRank * C);
    };
    EXPECT_LT(max_abs_diff(got.y, mine(want.y)), 1e-13) << "rank " << rank << " output";
    EXPECT_LT(max_abs_diff(got.dx, mine(want.dx)), 1e-13) << "rank " << rank << " input grad";
    // The held experts: the one-process gradients (every token of the group reached them here).
    const int held = dims().E / P;
    int experts_seen = 0;
    for (const Parameter* p : r_reg.all()) {
      if (r_reg.routed_experts().count(p) == 0) continue;
      ++experts_seen;
      EXPECT_LT(max_abs_diff(got.grads.at(p->name), want.grads.at(p->name)), 1e-13) << p->name;
    }
    EXPECT_EQ(experts_seen, 2 * held);
    // The router and the shared expert saw this rank's tokens only: summed over the ranks, the
    // one-process gradient. So is the load.
    for (const std::string name : {"moe.router.weight", "moe.shared.gate_up.weight"}) {
      const std::vector<double>& g = got.grads.at(name);
      Tensor t = Tensor::from_vector(g, {static_cast<int64_t>(g.size())}, DType::kF64);
      comm.all_reduce(t).synchronize();
      EXPECT_LT(max_abs_diff(t.to_vector(), want.grads.at(name)), 1e-12) << name;
    }
    std::vector<double> load(got.load.begin(), got.load.end());
    Tensor l = Tensor::from_vector(load, {static_cast<int64_t>(load.size())}, DType::kF64);
    comm.all_reduce(l).synchronize();
    EXPECT_EQ(l.to_vector(), std::vector<double>(want.load.begin(), want.load.end()));
  });
}

TEST(MoeExpertParallel, TwoAndFourRanksMatchOneProcess) {
  for (int P : {2, 4}) {
    SCOPED_TRACE("EP = " + std::to_string(P));
    check_against_one_process(P, std::vector<double>(8, 0.0));
  }
}

TEST(MoeExpertParallel, ARankWhoseExpertsGetNoTokenStillExchanges) {
  // A bias of -100 on experts 4..7 keeps every token away from them: EP rank 1 of 2 receives no
  // row at all, yet joins every exchange, forward and backward; its experts' gradients are zero.
  std::vector<double> bias(8, 0.0);
  for (int e = 4; e < 8; ++e) bias[e] = -100;
  check_against_one_process(2, bias);
}

TEST(MoeExpertParallel, EachRankHoldsItsExpertsUnderTheirGlobalNames) {
  MoeDims d = dims();
  d.ep_size = 4;
  d.ep_rank = 2;
  ParamRegistry reg(DType::kF32, Device::cpu(), 1);
  MoeLayer moe(reg, "blocks.1.mlp", C, d, 0.3, 0.2);
  std::vector<std::string> names;
  for (const Parameter* p : reg.all()) names.push_back(p->name);
  EXPECT_EQ(names, (std::vector<std::string>{
                       "blocks.1.mlp.router.weight",
                       "blocks.1.mlp.experts.4.gate_up.weight",
                       "blocks.1.mlp.experts.4.down.weight",
                       "blocks.1.mlp.experts.5.gate_up.weight",
                       "blocks.1.mlp.experts.5.down.weight",
                       "blocks.1.mlp.shared.gate_up.weight",
                       "blocks.1.mlp.shared.down.weight",
                   }));
  EXPECT_EQ(reg.routed_experts().size(), 4u);
  EXPECT_TRUE(moe.holds_elsewhere("blocks.1.mlp.experts.0.down.weight"));
  EXPECT_TRUE(moe.holds_elsewhere("blocks.1.mlp.experts.7.gate_up.weight"));
  EXPECT_FALSE(moe.holds_elsewhere("blocks.1.mlp.experts.4.down.weight"));  // held here
  EXPECT_FALSE(moe.holds_elsewhere("blocks.1.mlp.experts.8.down.weight"));  // no such expert
  EXPECT_FALSE(moe.holds_elsewhere("blocks.1.mlp.router.weight"));
  EXPECT_EQ(moe.load().size(), 8u);  // the load counts every expert
  // The same init as one process's copy of expert 5.
  ParamRegistry one(DType::kF32, Device::cpu(), 1);
  MoeLayer all(one, "blocks.1.mlp", C, dims(), 0.3, 0.2);
  EXPECT_EQ(reg.find("blocks.1.mlp.experts.5.down.weight")->data.to_vector(),
            one.find("blocks.1.mlp.experts.5.down.weight")->data.to_vector());
  EXPECT_EQ(moe_expert_shifted("blocks.1.mlp.experts.5.down.weight", 3),
            "blocks.1.mlp.experts.8.down.weight");
  EXPECT_EQ(moe_expert_shifted("blocks.1.mlp.router.weight", 3), "");
}

// Note [expert-parallel groups] in parallel/grid.h: EP groups of consecutive data ranks of one TP
// rank, expert-data groups of the data ranks with the same EP rank.
TEST(ExpertGroups, LayoutOfTheGrid) {
  GridLayout l = grid_layout(5, 8, 1, 2);  // data rank 2 of 4, TP rank 1
  set_expert_layout(l, 2);
  EXPECT_EQ(l.ep_size, 2);
  EXPECT_EQ(l.ep_rank, 0);
  EXPECT_EQ(l.ep_group, 3);
  EXPECT_EQ(l.ep_members, (std::vector<int>{5, 7}));
  EXPECT_EQ(l.expert_data_size, 2);
  EXPECT_EQ(l.expert_data_rank, 1);
  EXPECT_EQ(l.expert_data_group, 1);
  EXPECT_EQ(l.expert_data_members, (std::vector<int>{1, 5}));
  set_expert_layout(l, 4);  // every data rank of TP rank 1: one expert-data group each
  EXPECT_EQ(l.ep_members, (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(l.expert_data_members, (std::vector<int>{5}));
  EXPECT_THROW(set_expert_layout(l, 3), UserError);
  EXPECT_THROW(set_expert_layout(l, 0), UserError);
}

TEST(ExpertGroups, CommunicatorsJoinTheirMembers) {
  test_util::run_ranks(4, [](int rank, StoreClient& store) {
    GlooOptions o;
    o.timeout = std::chrono::seconds(15);
    const CommunicatorFactory make = [&o](StoreClient& s, const std::string& name, int r, int n) {
      return make_gloo_communicator(s, name, r, n, o);
    };
    Grid grid = make_grid(store, rank, 4, 1, 1, make);
    add_expert_groups(grid, store, 2, make);
    ASSERT_TRUE(grid.ep && grid.expert_data);
    EXPECT_EQ(grid.ep->size(), 2);
    EXPECT_EQ(grid.ep->rank(), rank % 2);
    EXPECT_EQ(grid.expert_data->size(), 2);
    EXPECT_EQ(grid.expert_data->rank(), rank / 2);
    // Sums of the members' world ranks: EP {0, 1} and {2, 3}; expert-data {0, 2} and {1, 3}.
    Tensor a = Tensor::from_vector({static_cast<double>(rank)}, {1}, DType::kF64);
    Tensor b = Tensor::from_vector({static_cast<double>(rank)}, {1}, DType::kF64);
    grid.ep->all_reduce(a).synchronize();
    grid.expert_data->all_reduce(b).synchronize();
    EXPECT_EQ(a.item(), rank < 2 ? 1 : 5);
    EXPECT_EQ(b.item(), rank % 2 == 0 ? 2 : 4);
  });
}

}  // namespace
}  // namespace gtron::parallel

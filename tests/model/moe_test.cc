// The mixture-of-experts MLP (model/moe.h) and the llama GPT built with it: f64 gradient checks
// of the layer (shared experts, both routers, the balance loss) and of the whole model (MoE MTP
// depths too), the sigmoid router's bias balancing a skewed router, bit-identical reruns, and
// num_experts = 0 giving exactly the dense model.
#include "model/moe.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "model/gpt.h"
#include "model/ops/loss.h"
#include "tests/model/gradcheck.h"
#include "tests/model/op_check.h"

namespace gtron {
namespace {

MoeDims tiny_moe(MoeRouterKind router) {
  MoeDims d;
  d.E = 4;
  d.top_k = 2;
  d.num_shared = 1;
  d.F = 3;
  d.router = router;
  d.norm_topk_prob = router == MoeRouterKind::kSigmoid;
  d.aux_loss_weight = 0.05;
  return d;
}

// The smallest gap, over the rows of x, between the k-th and (k+1)-th largest router value
// (score + bias): the gradient checks below need it well above their 1e-6 steps.
double selection_margin(const Parameter& router, const Tensor& bias, const Tensor& x,
                        MoeRouterKind kind, int k) {
  NoGradGuard no_grad;
  const int64_t E = router.data.dim(0), C = router.data.dim(1), N = x.numel() / C;
  std::vector<double> w = router.data.to_vector(), xv = x.to_vector(), b = bias.to_vector();
  double margin = 1e9;
  for (int64_t n = 0; n < N; ++n) {
    std::vector<double> z(static_cast<size_t>(E));
    double mx = -1e300, sum = 0;
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t c = 0; c < C; ++c) z[e] += xv[n * C + c] * w[e * C + c];
      mx = std::max(mx, z[e]);
    }
    for (double& v : z) {
      v = kind == MoeRouterKind::kSigmoid ? 1 / (1 + std::exp(-v)) : std::exp(v - mx);
      sum += v;
    }
    for (int64_t e = 0; e < E; ++e) {
      if (kind == MoeRouterKind::kSoftmax) z[e] /= sum;
      z[e] += b[e];
    }
    std::sort(z.begin(), z.end(), std::greater<double>());
    margin = std::min(margin, z[k - 1] - z[k]);
  }
  return margin;
}

TEST(MoeLayer, ParameterNamesAndShapes) {
  ParamRegistry reg(DType::kF64, Device::cpu(), 1);
  MoeLayer moe(reg, "blocks.1.mlp", 6, tiny_moe(MoeRouterKind::kSoftmax), 0.3, 0.1);
  std::vector<std::string> names;
  for (const Parameter* p : reg.all()) names.push_back(p->name + " " + p->data.shape().str());
  EXPECT_EQ(names, (std::vector<std::string>{
                       "blocks.1.mlp.router.weight [4, 6]",
                       "blocks.1.mlp.experts.0.gate_up.weight [6, 6]",
                       "blocks.1.mlp.experts.0.down.weight [6, 3]",
                       "blocks.1.mlp.experts.1.gate_up.weight [6, 6]",
                       "blocks.1.mlp.experts.1.down.weight [6, 3]",
                       "blocks.1.mlp.experts.2.gate_up.weight [6, 6]",
                       "blocks.1.mlp.experts.2.down.weight [6, 3]",
                       "blocks.1.mlp.experts.3.gate_up.weight [6, 6]",
                       "blocks.1.mlp.experts.3.down.weight [6, 3]",
                       "blocks.1.mlp.shared.gate_up.weight [6, 6]",
                       "blocks.1.mlp.shared.down.weight [6, 3]",
                   }));
  EXPECT_EQ(moe.bias_name(), "blocks.1.mlp.router.expert_bias");
}

// train.precision = "fp8": the expert and shared linears are FP8 ones, the router is not.
TEST(MoeLayer, Fp8LeavesTheRouterInFullPrecision) {
  ParamRegistry reg(DType::kF32, Device::cpu(), 1);
  reg.set_fp8_linears(true);
  MoeLayer moe(reg, "moe", 6, tiny_moe(MoeRouterKind::kSoftmax), 0.3, 0.1);
  EXPECT_TRUE(reg.fp8_linears());
  EXPECT_EQ(reg.fp8_weights().count(reg.find("moe.router.weight")), 0u);
  EXPECT_EQ(reg.fp8_weights().count(reg.find("moe.experts.2.down.weight")), 1u);
  EXPECT_EQ(reg.fp8_weights().count(reg.find("moe.shared.gate_up.weight")), 1u);
}

// The whole MoE MLP (router, top-k gates, dispatch, the grouped experts, combine, the shared
// expert) and, separately, its balance loss: every input and parameter, both routers.
TEST(MoeLayer, GradCheckWithSharedExpertAndBalanceLoss) {
  for (MoeRouterKind kind : {MoeRouterKind::kSoftmax, MoeRouterKind::kSigmoid}) {
    SCOPED_TRACE(kind == MoeRouterKind::kSigmoid ? "sigmoid" : "softmax");
    ParamRegistry reg(DType::kF64, Device::cpu(), 5);
    MoeLayer moe(reg, "moe", 6, tiny_moe(kind), 0.5, 0.5);
    if (kind == MoeRouterKind::kSigmoid) {
      moe.expert_bias().copy_from(Tensor::from_vector({0.01, -0.02, 0.03, 0}, {4}, DType::kF64));
    }
    Tensor x = testing::randn_tensor({2, 5, 6}, 9);
    ASSERT_GT(selection_margin(*reg.find("moe.router.weight"), moe.expert_bias(), x, kind, 2),
              1e-4);
    DirectWeights w;
    auto y = testing::gradcheck([&](const std::vector<Var>& in) { return moe.forward(in[0], w); },
                                {x}, reg.all());
    EXPECT_LT(y.worst_error, 1e-6) << y.worst_name;
    auto aux = testing::gradcheck(
        [&](const std::vector<Var>& in) {
          moe.forward(in[0], w);
          return moe.take_aux_loss();
        },
        {x}, {reg.find("moe.router.weight")});
    EXPECT_LT(aux.worst_error, 1e-6) << aux.worst_name;
  }
}

// Note [router bias]: a router skewed towards expert 0 (every token's input has a component
// along expert 0's router row) sends it nearly every token; the bias updates balance the load.
TEST(MoeLayer, SigmoidBiasUpdateBalancesASkewedRouter) {
  const int64_t C = 16, N = 4096;
  MoeDims d;
  d.E = 8;
  d.top_k = 2;
  d.F = 4;
  d.router = MoeRouterKind::kSigmoid;
  d.bias_update_rate = 0.01;
  ParamRegistry reg(DType::kF32, Device::cpu(), 3);
  MoeLayer moe(reg, "moe", C, d, 0.3, 0.3);
  Parameter* router = reg.find("moe.router.weight");
  std::vector<double> w = router->data.to_vector();
  for (int64_t c = 0; c < C; ++c) w[c] += 0.5;  // expert 0's row along the all-ones direction
  router->data.copy_from(Tensor::from_vector(w, router->data.shape(), DType::kF32));
  DirectWeights access;
  double first_cv = 0;
  int balanced_at = -1;
  for (int step = 0; step < 400 && balanced_at < 0; ++step) {
    std::vector<double> x = testing::randn(static_cast<size_t>(N * C), 100 + step);
    for (double& v : x) v += 0.5;  // the common component the skewed row picks up
    moe.forward(Var::leaf(Tensor::from_vector(x, {N, C}, DType::kF32)), access);
    clear_tape();
    const MoeLayerStats s = moe.stats(0);
    if (step == 0) first_cv = s.load_cv;
    if (s.load_cv < 0.1) balanced_at = step;
    moe.update_bias();
  }
  std::printf("skewed router: cv %.3f at the start, below 0.1 after %d updates\n", first_cv,
              balanced_at);
  EXPECT_GT(first_cv, 0.5);  // deliberately skewed to start with
  ASSERT_GE(balanced_at, 0) << "the load's coefficient of variation never fell below 0.1";
  EXPECT_LT(balanced_at, 200);
  EXPECT_GT(moe.stats(0).bias_norm, 0);
}

TEST(MoeLayer, LoadCountsOnlyInGradModeAndStats) {
  ParamRegistry reg(DType::kF32, Device::cpu(), 4);
  MoeLayer moe(reg, "moe", 6, tiny_moe(MoeRouterKind::kSoftmax), 0.3, 0.3);
  DirectWeights w;
  Var x = Var::leaf(testing::randn_tensor({3, 6}, 5, 1.0, DType::kF32));
  {
    NoGradGuard no_grad;
    moe.forward(x, w);
  }
  EXPECT_EQ(moe.stats(0).tokens, (std::vector<int64_t>{0, 0, 0, 0}));
  moe.forward(x, w);
  clear_tape();
  const MoeLayerStats s = moe.stats(7);
  int64_t total = 0;
  for (int64_t t : s.tokens) total += t;
  EXPECT_EQ(total, 3 * 2);
  EXPECT_EQ(s.layer, 7);
  EXPECT_EQ(s.tokens_min, *std::min_element(s.tokens.begin(), s.tokens.end()));
  EXPECT_GT(s.aux_loss, 0);
  moe.update_bias();  // softmax: the bias stays, the counts reset
  EXPECT_EQ(moe.stats(0).tokens, (std::vector<int64_t>{0, 0, 0, 0}));
  EXPECT_EQ(moe.stats(0).bias_norm, 0);
}

Tensor random_window(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  std::vector<int32_t> v(static_cast<size_t>(B * (T + 1)));
  uint64_t s = seed;
  for (auto& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<int32_t>((s >> 33) % static_cast<uint64_t>(V));
  }
  return Tensor::from_ints(v, {B, T + 1});
}

GPTConfig llama_config() {
  GPTConfig c;
  c.arch = Arch::kLlama;
  c.vocab_size = 13;
  c.context_length = 6;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_kv_head = 1;
  c.head_dim = 4;
  c.n_embd = 6;
  c.intermediate_size = 10;
  c.rope_theta = 10000;
  c.init_std = 0.3;
  return c;
}

GPTConfig moe_config(MoeRouterKind router) {
  GPTConfig c = llama_config();
  c.moe = tiny_moe(router);
  c.moe.first_dense_layers = 1;
  return c;
}

TEST(MoeGPT, FirstDenseLayersKeepTheDenseMlp) {
  GPT model(moe_config(MoeRouterKind::kSigmoid), DType::kF32, Device::cpu(), 1);
  EXPECT_NE(model.find("blocks.0.mlp.gate_up.weight"), nullptr);
  EXPECT_EQ(model.find("blocks.0.mlp.router.weight"), nullptr);
  EXPECT_EQ(model.find("blocks.1.mlp.gate_up.weight"), nullptr);
  EXPECT_NE(model.find("blocks.1.mlp.experts.3.down.weight"), nullptr);
  ASSERT_EQ(model.buffers().size(), 1u);
  EXPECT_EQ(model.buffers()[0].first, "blocks.1.mlp.router.expert_bias");
  EXPECT_EQ(model.moe_stats().size(), 1u);
  EXPECT_EQ(model.moe_stats()[0].layer, 1);
}

// The whole model: loss = CE + λ/D·CE_1 + the balance loss, with MTP D = 1 (a dense depth).
TEST(MoeGPT, GradCheckWholeModelWithMtp) {
  for (MoeRouterKind kind : {MoeRouterKind::kSoftmax, MoeRouterKind::kSigmoid}) {
    SCOPED_TRACE(kind == MoeRouterKind::kSigmoid ? "sigmoid" : "softmax");
    GPTConfig c = moe_config(kind);
    c.mtp_depth = 1;
    GPT model(c, DType::kF64, Device::cpu(), 42);
    Tensor window = random_window(2, 5, 13, 3);
    GPTOutput probe = model.forward(window);
    clear_tape();
    ASSERT_TRUE(probe.moe_aux_loss.defined());
    EXPECT_GT(probe.moe_aux_loss.value().item(), 0);
    auto res =
        testing::gradcheck([&](const std::vector<Var>&) { return model.forward(window).loss; }, {},
                           model.parameters());
    EXPECT_LT(res.worst_error, 1e-6) << res.worst_name;
  }
}

// mtp.moe: the depth's block takes a mixture of experts of its own (router, experts, shared
// expert, bias and load), after the main blocks' in the load, stats and buffers; its balance
// loss joins the total, and the whole model's gradients check in f64.
TEST(MoeGPT, MtpDepthsMayBeMixturesOfExperts) {
  GPTConfig c = moe_config(MoeRouterKind::kSigmoid);
  c.mtp_depth = 1;
  GPT dense_depth(c, DType::kF64, Device::cpu(), 42);
  EXPECT_NE(dense_depth.find("mtp.1.block.mlp.gate_up.weight"), nullptr);
  EXPECT_EQ(dense_depth.moe_stats().size(), 1u);
  c.mtp_moe = true;
  GPT model(c, DType::kF64, Device::cpu(), 42);
  EXPECT_EQ(model.find("mtp.1.block.mlp.gate_up.weight"), nullptr);
  for (const char* name : {"mtp.1.block.mlp.router.weight", "mtp.1.block.mlp.experts.3.down.weight",
                           "mtp.1.block.mlp.shared.gate_up.weight"}) {
    EXPECT_NE(model.find(name), nullptr) << name;
  }
  ASSERT_EQ(model.buffers().size(), 2u);
  EXPECT_EQ(model.buffers()[1].first, "mtp.1.block.mlp.router.expert_bias");
  Tensor window = random_window(2, 5, 13, 3);
  GPTOutput probe = model.forward(window);
  const std::vector<MoeLayerStats> stats = model.moe_stats();
  clear_tape();
  ASSERT_EQ(stats.size(), 2u);
  EXPECT_EQ(stats[1].layer, 2);  // after the 2 main blocks
  int64_t routed = 0;
  for (int64_t t : stats[1].tokens) routed += t;
  EXPECT_EQ(routed, 2 * 5 * 2);  // B·T tokens, top 2 each
  EXPECT_EQ(model.moe_load().size(), 8u);
  // Both layers' balance losses are in the total: more than the main block's alone.
  GPTOutput main_only = dense_depth.forward(window);
  clear_tape();
  EXPECT_GT(probe.moe_aux_loss.value().item(), main_only.moe_aux_loss.value().item());
  auto res = testing::gradcheck([&](const std::vector<Var>&) { return model.forward(window).loss; },
                                {}, model.parameters());
  EXPECT_LT(res.worst_error, 1e-6) << res.worst_name;
}

struct StepResult {
  std::vector<double> losses;
  std::vector<std::vector<double>> grads;
  std::vector<double> bias;
  bool operator==(const StepResult& o) const {
    return losses == o.losses && grads == o.grads && bias == o.bias;
  }
};

// Three steps of loss, backward, plain SGD and the bias update from one seed.
StepResult train_three_steps(const GPTConfig& c) {
  GPT model(c, DType::kF32, Device::cpu(), 7);
  StepResult r;
  for (int step = 0; step < 3; ++step) {
    for (Parameter* p : model.parameters()) p->zero_grad();
    GPTOutput out = model.forward(random_window(4, 5, 13, 10 + step));
    r.losses.push_back(out.loss.value().item());
    backward(out.loss);
    for (Parameter* p : model.parameters()) {
      std::vector<double> g = p->main_grad.to_vector(), v = p->data.to_vector();
      r.grads.push_back(g);
      for (size_t i = 0; i < v.size(); ++i) v[i] -= 0.1 * g[i];
      p->data.copy_from(Tensor::from_vector(v, p->data.shape(), DType::kF32));
    }
    model.moe_update_bias();
  }
  for (const auto& [name, b] : model.buffers()) {
    std::vector<double> v = b.to_vector();
    r.bias.insert(r.bias.end(), v.begin(), v.end());
  }
  return r;
}

TEST(MoeGPT, RerunsAreBitIdentical) {
  GPTConfig c = moe_config(MoeRouterKind::kSigmoid);
  c.moe.bias_update_rate = 0.01;
  const StepResult first = train_three_steps(c);
  EXPECT_EQ(first, train_three_steps(c));
  testing::with_threads(1, [&] { EXPECT_EQ(first, train_three_steps(c)); });
  double bias_sum = 0;
  for (double b : first.bias) bias_sum += std::fabs(b);
  EXPECT_GT(bias_sum, 0);  // the bias moved, and moved the same way each run
}

// num_experts = 0 is the dense model: the same parameters, the same loss and gradient bits,
// whatever the other moe fields say.
TEST(MoeGPT, NoExpertsIsExactlyTheDenseModel) {
  GPTConfig dense = llama_config();
  GPTConfig off = moe_config(MoeRouterKind::kSigmoid);
  off.moe.E = 0;
  GPT a(dense, DType::kF32, Device::cpu(), 3);
  GPT b(off, DType::kF32, Device::cpu(), 3);
  ASSERT_EQ(a.parameters().size(), b.parameters().size());
  for (size_t i = 0; i < a.parameters().size(); ++i) {
    EXPECT_EQ(a.parameters()[i]->name, b.parameters()[i]->name);
    EXPECT_EQ(a.parameters()[i]->data.to_vector(), b.parameters()[i]->data.to_vector());
  }
  EXPECT_TRUE(b.buffers().empty());
  EXPECT_TRUE(b.moe_stats().empty());
  const Tensor window = random_window(2, 5, 13, 4);
  GPTOutput oa = a.forward(window);
  backward(oa.loss);
  GPTOutput ob = b.forward(window);
  backward(ob.loss);
  EXPECT_FALSE(ob.moe_aux_loss.defined());
  EXPECT_EQ(oa.loss.value().item(), ob.loss.value().item());
  for (size_t i = 0; i < a.parameters().size(); ++i) {
    EXPECT_EQ(a.parameters()[i]->main_grad.to_vector(), b.parameters()[i]->main_grad.to_vector());
  }
  EXPECT_EQ(a.flops_per_token(5), b.flops_per_token(5));
}

}  // namespace
}  // namespace gtron

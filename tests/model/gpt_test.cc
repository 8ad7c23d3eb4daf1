// Whole-model tests: gradient check of GPT + MTP (D=2, tied head: 3 backwards into wte's head use
// plus 3 embedding lookups), the window/target construction, and overfitting one batch.
#include "model/gpt.h"

#include <gtest/gtest.h>

#include <cmath>

#include "model/ops/loss.h"
#include "tests/model/gradcheck.h"

namespace gtron {
namespace {

Tensor random_window(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  std::vector<int32_t> v(static_cast<size_t>(B * (T + 1)));
  uint64_t s = seed;
  for (auto& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<int32_t>((s >> 33) % static_cast<uint64_t>(V));
  }
  return Tensor::from_ints(v, {B, T + 1});
}

TEST(Window, InputsAndTargetsShiftAndMask) {
  Tensor w = Tensor::from_ints({10, 11, 12, 13}, {1, 4});  // T = 3
  EXPECT_EQ(window_inputs(w, 0).to_vector(), (std::vector<double>{10, 11, 12}));
  EXPECT_EQ(window_targets(w, 0).to_vector(), (std::vector<double>{11, 12, 13}));
  EXPECT_EQ(window_inputs(w, 1).to_vector(), (std::vector<double>{11, 12, 13}));
  EXPECT_EQ(window_targets(w, 1).to_vector(), (std::vector<double>{12, 13, kMaskedTarget}));
  EXPECT_EQ(window_inputs(w, 2).to_vector(), (std::vector<double>{12, 13, 0}));
  EXPECT_EQ(window_targets(w, 2).to_vector(),
            (std::vector<double>{13, kMaskedTarget, kMaskedTarget}));
}

GPTConfig tiny_config(int D) {
  GPTConfig c;
  c.vocab_size = 13;  // padded to 64: the padded rows must get exactly zero gradient
  c.context_length = 6;
  c.n_layer = 1;
  c.n_head = 2;
  c.n_embd = 6;
  c.mtp_depth = D;
  c.mtp_loss_weight = 0.3;
  c.init_std = 0.3;  // larger than GPT-2's so every path carries a visible gradient
  return c;
}

TEST(GPT, GradCheckWithMTPDepth2) {
  GPT model(tiny_config(2), DType::kF64, Device::cpu(), 42);
  Tensor window = random_window(2, 5, 13, 3);
  // The loss is a scalar: gradcheck seeds it with a random scale, which is still a full check.
  auto res = testing::gradcheck([&](const std::vector<Var>&) { return model.forward(window).loss; },
                                {}, model.parameters());
  EXPECT_LT(res.worst_error, 1e-6) << res.worst_name;
}

TEST(GPT, GradCheckUntiedNoMTP) {
  GPTConfig c = tiny_config(0);
  c.tied_embeddings = false;
  GPT model(c, DType::kF64, Device::cpu(), 43);
  Tensor window = random_window(2, 4, 13, 4);
  auto res = testing::gradcheck([&](const std::vector<Var>&) { return model.forward(window).loss; },
                                {}, model.parameters());
  EXPECT_LT(res.worst_error, 1e-6) << res.worst_name;
}

// Note [full recompute] in model/gpt.cc: train.recompute = "full" keeps each main block's input
// only and runs its forward again in the backward; losses and every parameter gradient equal the
// plain tape's bit for bit, for GPT-2 and the llama family (GQA, q/k norms, MTP D = 2, two blocks
// so a block's input is the previous block's output), and the forward records fewer closures.
TEST(GPT, FullRecomputeKeepsLossesAndGradientsBitForBit) {
  GPTConfig gpt2 = tiny_config(2);
  gpt2.n_layer = 2;
  GPTConfig llama = gpt2;
  llama.arch = Arch::kLlama;
  llama.n_head = 2;
  llama.n_kv_head = 1;
  llama.head_dim = 4;
  llama.intermediate_size = 10;
  llama.qk_norm = true;
  llama.rope_theta = 10000;
  for (const GPTConfig& base : {gpt2, llama}) {
    SCOPED_TRACE(base.llama() ? "llama" : "gpt2");
    const Tensor window = random_window(2, 5, 13, 7);
    auto run = [&](Recompute r, size_t* closures) {
      GPTConfig c = base;
      c.recompute = r;
      GPT model(c, DType::kF32, Device::cpu(), 11);
      clear_tape();
      GPTOutput out = model.forward(window);
      *closures = tape_size();
      backward(out.loss);
      std::vector<std::vector<double>> grads;
      for (Parameter* p : model.parameters()) grads.push_back(p->main_grad.to_vector());
      return std::make_pair(out.loss.value().item(), grads);
    };
    size_t plain_closures = 0, full_closures = 0;
    const auto plain = run(Recompute::kNone, &plain_closures);
    const auto full = run(Recompute::kFull, &full_closures);
    EXPECT_EQ(plain.first, full.first);
    ASSERT_EQ(plain.second.size(), full.second.size());
    double norm = 0;
    for (size_t i = 0; i < plain.second.size(); ++i) {
      EXPECT_EQ(plain.second[i], full.second[i]) << "parameter " << i;
      for (double g : plain.second[i]) norm += g * g;
    }
    EXPECT_GT(norm, 0);
    EXPECT_LT(full_closures, plain_closures);
  }
}

TEST(GPT, LossComposition) {
  GPT model(tiny_config(2), DType::kF64, Device::cpu(), 5);
  NoGradGuard ng;
  GPTOutput out = model.forward(random_window(3, 5, 13, 9));
  ASSERT_EQ(out.mtp_losses.size(), 2u);
  const double expect =
      out.main_loss.value().item() +
      0.3 / 2 * (out.mtp_losses[0].value().item() + out.mtp_losses[1].value().item());
  EXPECT_NEAR(out.loss.value().item(), expect, 1e-12);
  // At init every CE is close to ln(V) (near-uniform predictions).
  EXPECT_NEAR(out.main_loss.value().item(), std::log(13.0), 0.5);
}

TEST(GPT, DeterministicInitFromSeed) {
  GPT a(tiny_config(1), DType::kF32, Device::cpu(), 7);
  GPT b(tiny_config(1), DType::kF32, Device::cpu(), 7);
  GPT c(tiny_config(1), DType::kF32, Device::cpu(), 8);
  ASSERT_EQ(a.parameters().size(), b.parameters().size());
  for (size_t i = 0; i < a.parameters().size(); ++i) {
    EXPECT_EQ(a.parameters()[i]->data.to_vector(), b.parameters()[i]->data.to_vector());
  }
  EXPECT_NE(a.find("wte.weight")->data.to_vector(), c.find("wte.weight")->data.to_vector());
  // Residual projections use std / sqrt(2L).
  auto v = a.find("blocks.0.attn.proj.weight")->data.to_vector();
  double ss = 0;
  for (double x : v) ss += x * x;
  EXPECT_NEAR(std::sqrt(ss / v.size()), 0.3 / std::sqrt(2.0), 0.1);
}

// Plain Adam over every parameter (the trainer's AdamW lives in trainer/; this test stays local).
void adam_step(const std::vector<Parameter*>& params, std::vector<std::vector<float>>& m,
               std::vector<std::vector<float>>& v, int t, float lr) {
  const float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
  for (size_t i = 0; i < params.size(); ++i) {
    float* w = params[i]->data.data<float>();
    float* g = params[i]->main_grad.data<float>();
    const int64_t n = params[i]->data.numel();
    m[i].resize(n, 0.f);
    v[i].resize(n, 0.f);
    for (int64_t j = 0; j < n; ++j) {
      m[i][j] = b1 * m[i][j] + (1 - b1) * g[j];
      v[i][j] = b2 * v[i][j] + (1 - b2) * g[j] * g[j];
      const float mh = m[i][j] / (1 - std::pow(b1, t));
      const float vh = v[i][j] / (1 - std::pow(b2, t));
      w[j] -= lr * mh / (std::sqrt(vh) + eps);
    }
  }
}

TEST(GPT, OverfitsOneBatch) {
  GPTConfig c;
  c.vocab_size = 256;
  c.context_length = 32;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 64;
  c.mtp_depth = 1;
  GPT model(c, DType::kF32, Device::cpu(), 1);
  Tensor window = random_window(4, 32, 256, 11);
  std::vector<std::vector<float>> m(model.parameters().size()), v(model.parameters().size());
  double main_loss = 0;
  int steps = 0;
  for (int step = 1; step <= 300; ++step) {
    for (Parameter* p : model.parameters()) p->zero_grad();
    GPTOutput out = model.forward(window);
    main_loss = out.main_loss.value().item();
    steps = step;
    if (main_loss < 0.05) break;
    backward(out.loss);
    adam_step(model.parameters(), m, v, step, 3e-3f);
  }
  EXPECT_LT(main_loss, 0.05) << "after " << steps << " steps";
  std::printf("overfit: main loss %.4f after %d steps\n", main_loss, steps);
}

}  // namespace
}  // namespace gtron

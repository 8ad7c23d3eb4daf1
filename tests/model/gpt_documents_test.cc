// Document masking in the whole model (GPTConfig::document_start, Note [document masking] in
// model/ops/segments.h): a packed row of several documents gives, position by position, the logits
// each document gives alone, and its summed losses the same gradients; GPT-2 (positions restarted)
// and the llama family (RoPE, GQA, q/k norms); gradient checks with MTP depths; full recompute.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "model/gpt.h"
#include "tests/model/gradcheck.h"

namespace gtron {
namespace {

constexpr int32_t kStart = 12;  // the token that opens a document

GPTConfig config(bool llama) {
  GPTConfig c;
  c.vocab_size = 13;
  c.context_length = 16;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 8;
  c.init_std = 0.3;
  if (llama) {
    c.arch = Arch::kLlama;
    c.n_kv_head = 1;
    c.head_dim = 4;
    c.intermediate_size = 12;
    c.qk_norm = true;
    c.rope_theta = 10000;
  }
  c.document_start = kStart;
  return c;
}

// Two rows of 12 inputs and the token after them: row 0 holds documents [0, 3), [3, 7), [7, 12)
// (the first does not open with kStart: a window starts anywhere), row 1 [0, 2), [2, 12).
const std::vector<int32_t> kWindow = {
    3,      5, 1,      kStart, 7,  2, 9, kStart, 4, 4, 8, 6, 11,  //
    kStart, 2, kStart, 5,      10, 3, 3, 1,      7, 9, 2, 0, kStart};
constexpr int64_t kT = 12;
const std::vector<std::vector<int>> kDocs = {{0, 3, 7, 12}, {0, 2, 12}};  // boundaries per row

// tokens [t0, t1) of row b of the window.
std::vector<int32_t> cut(int64_t b, int64_t t0, int64_t t1) {
  const auto row = kWindow.begin() + b * (kT + 1);
  return std::vector<int32_t>(row + t0, row + t1);
}

std::vector<double> logits_of(GPT& model, const std::vector<int32_t>& tokens, int64_t B) {
  const int64_t T = static_cast<int64_t>(tokens.size()) / B;
  return model.logits(Tensor::from_ints(tokens, {B, T})).to_vector();
}

TEST(GPTDocuments, PackedLogitsAreEachDocumentAlone) {
  for (bool llama : {false, true}) {
    SCOPED_TRACE(llama ? "llama" : "gpt2");
    GPT model(config(llama), DType::kF64, Device::cpu(), 31);
    const int64_t Vp = model.config().padded_vocab();
    std::vector<int32_t> inputs = cut(0, 0, kT), row1 = cut(1, 0, kT);
    inputs.insert(inputs.end(), row1.begin(), row1.end());
    const std::vector<double> packed = logits_of(model, inputs, 2);
    double worst = 0;
    for (int64_t b = 0; b < 2; ++b) {
      const std::vector<int>& bounds = kDocs[static_cast<size_t>(b)];
      for (size_t d = 0; d + 1 < bounds.size(); ++d) {
        const std::vector<double> alone = logits_of(model, cut(b, bounds[d], bounds[d + 1]), 1);
        for (size_t i = 0; i < alone.size(); ++i) {
          const double got = packed[static_cast<size_t>((b * kT + bounds[d]) * Vp) + i];
          worst = std::max(worst, std::abs(got - alone[i]));
        }
      }
    }
    std::printf("%s: max |packed logit - alone| %.3g\n", llama ? "llama" : "gpt2", worst);
    EXPECT_LT(worst, 1e-12);
    // Without the mask the later documents see the earlier ones.
    GPTConfig open_cfg = config(llama);
    open_cfg.document_start = -1;
    GPT open(open_cfg, DType::kF64, Device::cpu(), 31);
    const std::vector<double> plain = logits_of(open, inputs, 2);
    double moved = 0;
    for (size_t i = 0; i < plain.size(); ++i)
      moved = std::max(moved, std::abs(plain[i] - packed[i]));
    EXPECT_GT(moved, 1e-3);
  }
}

// The model's gradients (every parameter, concatenated) after backward of `scale` · loss.
std::vector<double> gradients(GPT& model, const std::vector<int32_t>& window, double scale,
                              double* loss) {
  for (Parameter* p : model.parameters()) p->zero_grad();
  const int64_t T = static_cast<int64_t>(window.size()) - 1;
  GPTOutput out = model.forward(Tensor::from_ints(window, {1, T + 1}));
  *loss = out.loss.value().item();
  backward_with(out.loss, Tensor::from_vector({scale}, Shape{}, out.loss.dtype()));
  std::vector<double> g;
  for (Parameter* p : model.parameters()) {
    const std::vector<double> v = p->main_grad.to_vector();
    g.insert(g.end(), v.begin(), v.end());
  }
  return g;
}

TEST(GPTDocuments, PackedGradientsAreTheDocumentsGradientsSummed) {
  // The mean loss of a packed row times its T positions is the sum of each document's mean loss
  // times its length (a document's last target is the next document's opening token, as in the
  // packed row), so the gradients of T·loss and of Σ len·loss_doc are equal.
  for (bool llama : {false, true}) {
    SCOPED_TRACE(llama ? "llama" : "gpt2");
    GPT model(config(llama), DType::kF64, Device::cpu(), 32);
    double packed_loss = 0, summed_loss = 0;
    const std::vector<double> packed = gradients(model, cut(0, 0, kT + 1), kT, &packed_loss);
    std::vector<double> summed(packed.size(), 0.0);
    const std::vector<int>& bounds = kDocs[0];
    for (size_t d = 0; d + 1 < bounds.size(); ++d) {
      const int len = bounds[d + 1] - bounds[d];
      double loss = 0;
      const std::vector<double> g =
          gradients(model, cut(0, bounds[d], bounds[d + 1] + 1), len, &loss);
      for (size_t i = 0; i < g.size(); ++i) summed[i] += g[i];
      summed_loss += len * loss;
    }
    double worst = 0, norm = 0;
    for (size_t i = 0; i < packed.size(); ++i) {
      worst = std::max(worst, std::abs(packed[i] - summed[i]));
      norm = std::max(norm, std::abs(summed[i]));
    }
    std::printf("%s: loss·T %.15g vs Σ len·loss %.15g; max |grad diff| %.3g (max |grad| %.3g)\n",
                llama ? "llama" : "gpt2", packed_loss * kT, summed_loss, worst, norm);
    EXPECT_NEAR(packed_loss * kT, summed_loss, 1e-11);
    EXPECT_GT(norm, 1e-3);
    EXPECT_LT(worst, 1e-11);
  }
}

TEST(GPTDocuments, GradCheckWithMtpDepths) {
  // The MTP depths mask by the documents of the tokens each embeds.
  for (bool llama : {false, true}) {
    SCOPED_TRACE(llama ? "llama" : "gpt2");
    GPTConfig c = config(llama);
    c.n_layer = 1;
    c.mtp_depth = 2;
    GPT model(c, DType::kF64, Device::cpu(), 33);
    const Tensor window = Tensor::from_ints(kWindow, {2, kT + 1});
    auto res =
        testing::gradcheck([&](const std::vector<Var>&) { return model.forward(window).loss; }, {},
                           model.parameters());
    EXPECT_LT(res.worst_error, 1e-6) << res.worst_name;
    // Each depth's loss changes with the mask.
    NoGradGuard no_grad;
    const GPTOutput masked = model.forward(window);
    c.document_start = -1;
    GPT open(c, DType::kF64, Device::cpu(), 33);
    const GPTOutput plain = open.forward(window);
    for (int k = 0; k < 2; ++k) {
      EXPECT_GT(std::abs(masked.mtp_losses[k].value().item() - plain.mtp_losses[k].value().item()),
                1e-6)
          << "depth " << k + 1;
    }
  }
}

TEST(GPTDocuments, FullRecomputeKeepsTheMaskBitForBit) {
  // The block's second forward, inside the backward, reads the segments of the same forward.
  for (bool llama : {false, true}) {
    SCOPED_TRACE(llama ? "llama" : "gpt2");
    auto run = [&](Recompute r) {
      GPTConfig c = config(llama);
      c.recompute = r;
      c.mtp_depth = 1;
      GPT model(c, DType::kF32, Device::cpu(), 34);
      double loss = 0;
      std::vector<double> g = gradients(model, cut(1, 0, kT + 1), 1.0, &loss);
      g.push_back(loss);
      return g;
    };
    EXPECT_EQ(run(Recompute::kNone), run(Recompute::kFull));
  }
}

}  // namespace
}  // namespace gtron

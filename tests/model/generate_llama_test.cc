// Generation for the llama family (issue 27 item 3), in f64 on the CPU over tiny models of every
// shape the family has: grouped-query and multi-query attention, Qwen3's q/k norms with a head
// size that is not C / NH, Qwen2's qkv bias, llama3 RoPE scaling, tied and untied heads, two MTP
// depths, mixture-of-experts blocks (a sigmoid router with a shared expert; Qwen3-MoE's softmax
// router). (a) Incremental decoding (ragged prefills, single tokens, wider windows, rows at
// different positions) gives the full forward's logits at every position, main model and each
// depth, within 1e-10 relative; (b) greedy decoding with --speculative gives the tokens of plain
// cached decoding and of full recomputation; (c) after a rollback (wrong tokens fed, then the
// right ones from the same position) the logits are those of a fresh decode, bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "model/decoder.h"
#include "model/generate.h"
#include "model/ops/embedding.h"
#include "model/ops/linear.h"
#include "tests/model/decode_check.h"

namespace gtron {
namespace {

using testing::incremental_logits;
using testing::tokens_of;

constexpr double kRelTol = 1e-10;  // f64

struct Case {
  std::string name;
  GPTConfig config;
};

GPTConfig base_config() {
  GPTConfig c;
  c.arch = Arch::kLlama;
  c.vocab_size = 37;
  c.context_length = 96;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.n_embd = 32;
  c.intermediate_size = 24;
  c.mtp_depth = 2;
  c.rope_theta = 10000;
  c.init_std = 0.25;  // peaked distributions: greedy choices far from ties
  return c;
}

std::vector<Case> cases() {
  std::vector<Case> all;
  all.push_back({"gqa_tied", base_config()});
  GPTConfig mqa = base_config();
  mqa.n_kv_head = 1;
  mqa.tied_embeddings = false;
  all.push_back({"mqa_untied", mqa});
  GPTConfig qwen3 = base_config();
  qwen3.qk_norm = true;
  qwen3.head_dim = 6;  // not C / NH = 8
  all.push_back({"qk_norm_head_dim_6", qwen3});
  GPTConfig llama3 = base_config();
  llama3.tied_embeddings = false;
  llama3.qkv_bias = true;
  llama3.rope_llama3 = true;
  // An original context of 16 positions: the low frequencies are divided by 4 and the middle
  // ones interpolated within the positions decoded here.
  llama3.rope_scaling = {4.0, 1.0, 4.0, 16};
  all.push_back({"llama3_scaling_qkv_bias_untied", llama3});
  // Mixture of experts (model/moe.h) in block 1: routing is per token, so a cached decode routes
  // every position as the full forward does.
  GPTConfig moe = base_config();
  moe.moe.E = 4;
  moe.moe.top_k = 2;
  moe.moe.num_shared = 1;
  moe.moe.F = 8;
  moe.moe.first_dense_layers = 1;
  moe.moe.router = MoeRouterKind::kSigmoid;
  all.push_back({"moe_sigmoid_shared", moe});
  // Qwen3-MoE's routing (trainer/hf_qwen3_moe.h): softmax over the experts, top 2 of 4 without
  // renormalization, every block sparse, q/k norms.
  GPTConfig qwen3_moe = base_config();
  qwen3_moe.qk_norm = true;
  qwen3_moe.moe.E = 4;
  qwen3_moe.moe.top_k = 2;
  qwen3_moe.moe.F = 8;
  qwen3_moe.moe.router = MoeRouterKind::kSoftmax;
  qwen3_moe.moe.norm_topk_prob = false;
  all.push_back({"moe_softmax_qwen3", qwen3_moe});
  return all;
}

// tokens in [0, V) from a fixed stream.
double rel_diff(const std::vector<std::vector<double>>& a,
                const std::vector<std::vector<double>>& b, size_t rows) {
  double d = 0, scale = 1;
  for (size_t t = 0; t < rows; ++t) {
    for (size_t v = 0; v < b[t].size(); ++v) {
      d = std::max(d, std::fabs(a[t][v] - b[t][v]));
      scale = std::max(scale, std::fabs(b[t][v]));
    }
  }
  return d / scale;
}

TEST(GenerateLlama, CachedLogitsEqualTheFullForwardAtEveryPosition) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    GPT m(c.config, DType::kF64, Device::cpu(), 3);
    const int64_t V = c.config.vocab_size;
    const std::vector<std::vector<int32_t>> seqs = {tokens_of(61, 1, V), tokens_of(43, 2, V),
                                                    tokens_of(29, 3, V)};
    // Ragged windows: row 0 prefills 7 then goes one token at a time with wider windows between;
    // rows 1 and 2 other chunks, so the rows sit at different positions in every window (and sit
    // the last windows out).
    const std::vector<std::vector<int64_t>> plan = {
        {7, 1, 1, 1, 3, 1, 5, 2}, {1, 2, 4, 1}, {11, 1}};
    Decoder dec(m, 3, /*keep_hidden=*/true);
    auto main =
        incremental_logits(seqs, plan, V, [&](const WindowInput& in) { return dec.main_f64(in); });
    for (size_t b = 0; b < seqs.size(); ++b) {
      const auto ref = testing::llama_reference_logits(m, seqs[b], 0);
      ASSERT_EQ(main[b].size(), seqs[b].size());
      EXPECT_LE(rel_diff(main[b], ref, ref.size()), kRelTol) << "row " << b;
    }
    // GPT::logits is the same forward (its own composition): a check on the reference itself.
    const Tensor full = m.logits(Tensor::from_ints(seqs[0], {1, 61}));
    const auto ref0 = testing::llama_reference_logits(m, seqs[0], 0);
    EXPECT_EQ(full.to_vector()[60 * c.config.padded_vocab() + 5], ref0[60][5]);
    // The depths over the same positions: slot s of depth k feeds token s + k (teacher forcing)
    // and reads the hidden states the previous module stored there.
    for (int k = 1; k <= c.config.mtp_depth; ++k) {
      std::vector<std::vector<int32_t>> ahead;
      for (const auto& s : seqs) ahead.emplace_back(s.begin() + k, s.end());
      auto depth = incremental_logits(ahead, plan, V,
                                      [&](const WindowInput& in) { return dec.depth_f64(k, in); });
      for (size_t b = 0; b < seqs.size(); ++b) {
        const auto ref = testing::llama_reference_logits(m, seqs[b], k);
        EXPECT_LE(rel_diff(depth[b], ref, ahead[b].size()), kRelTol)
            << "depth " << k << " row " << b;
      }
    }
  }
}

TEST(GenerateLlama, RollbackThenRedecodeEqualsAFreshDecode) {
  // Row 0 feeds wrong tokens at 40..44 and row 1 at 25..27 (the main model and depth 1), then
  // both feed the right ones from there: the logits must be a fresh decoder's bit for bit (keys
  // were rotated at the same positions and overwritten), and the full forward's within 1e-10.
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    GPT m(c.config, DType::kF64, Device::cpu(), 4);
    const int64_t V = c.config.vocab_size;
    const std::vector<std::vector<int32_t>> seqs = {tokens_of(70, 5, V), tokens_of(50, 6, V)};
    const std::vector<int64_t> cut = {40, 25};
    auto window = [&](const std::vector<int64_t>& from, const std::vector<int64_t>& to,
                      const std::vector<std::vector<int32_t>>& src) {
      WindowInput in;
      in.start = from;
      for (size_t b = 0; b < 2; ++b) {
        in.tokens.emplace_back(src[b].begin() + from[b], src[b].begin() + to[b]);
        in.want.emplace_back();
        for (int64_t i = 0; i < to[b] - from[b]; ++i) in.want[b].push_back(i);
      }
      return in;
    };
    std::vector<std::vector<int32_t>> wrong = seqs;
    for (size_t b = 0; b < 2; ++b) {
      for (int64_t t = cut[b]; t < cut[b] + 5; ++t) wrong[b][t] = (seqs[b][t] + 1) % V;
    }
    const std::vector<int64_t> zero = {0, 0}, ends = {70, 50}, wrong_end = {45, 30};
    Decoder rolled(m, 2, true), fresh(m, 2, true);
    rolled.main_f64(window(zero, cut, seqs));
    rolled.main_f64(window(cut, wrong_end, wrong));
    const std::vector<double> got = rolled.main_f64(window(cut, ends, seqs));
    fresh.main_f64(window(zero, cut, seqs));
    const std::vector<double> want = fresh.main_f64(window(cut, ends, seqs));
    EXPECT_EQ(got, want);
    // Depth 1 over the stores the main windows left (teacher forcing: token s + 1 at s), with its
    // own rollback; its last positions need token s + 1, so it stops one short.
    std::vector<std::vector<int32_t>> ahead, wrong_ahead;
    for (size_t b = 0; b < 2; ++b) {
      ahead.emplace_back(seqs[b].begin() + 1, seqs[b].end());
      wrong_ahead.emplace_back(wrong[b].begin() + 1, wrong[b].end());
    }
    const std::vector<int64_t> depth_end = {69, 49};
    rolled.depth_f64(1, window(zero, cut, ahead));
    rolled.depth_f64(1, window(cut, wrong_end, wrong_ahead));
    const std::vector<double> got1 = rolled.depth_f64(1, window(cut, depth_end, ahead));
    fresh.depth_f64(1, window(zero, cut, ahead));
    const std::vector<double> want1 = fresh.depth_f64(1, window(cut, depth_end, ahead));
    EXPECT_EQ(got1, want1);
    // Against the full forward.
    size_t r = 0;
    for (size_t b = 0; b < 2; ++b) {
      const auto ref = testing::llama_reference_logits(m, seqs[b], 0);
      std::vector<std::vector<double>> rows, refs;
      for (int64_t t = cut[b]; t < ends[b]; ++t, ++r) {
        rows.emplace_back(got.begin() + r * V, got.begin() + (r + 1) * V);
        refs.push_back(ref[t]);
      }
      EXPECT_LE(rel_diff(rows, refs, rows.size()), kRelTol) << "row " << b;
    }
    EXPECT_EQ(r * V, got.size());
  }
}

GenerateOptions greedy(int64_t tokens) {
  GenerateOptions o;
  o.max_new_tokens = tokens;
  o.sampling.temperature = 0;
  return o;
}

TEST(GenerateLlama, GreedySpeculativeEqualsPlainAndRecomputed) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    GPT m(c.config, DType::kF64, Device::cpu(), 5);
    const int64_t V = c.config.vocab_size;
    const std::vector<std::vector<int32_t>> prompts = {tokens_of(9, 7, V), tokens_of(9, 8, V),
                                                       tokens_of(9, 9, V)};
    const Generation full = generate_recompute(m, prompts, greedy(60));
    const Generation cached = generate(m, prompts, greedy(60));
    GenerateOptions spec = greedy(60);
    spec.speculative = true;
    const Generation fast = generate(m, prompts, spec);
    for (size_t b = 0; b < prompts.size(); ++b) {
      ASSERT_EQ(full.tokens[b].size(), 60u);
      EXPECT_EQ(cached.tokens[b], full.tokens[b]) << "row " << b;
      EXPECT_EQ(fast.tokens[b], full.tokens[b]) << "row " << b;
    }
    EXPECT_EQ(cached.stats.proposed, 0);
    EXPECT_GT(fast.stats.proposed, 0);
    EXPECT_LE(fast.stats.accepted, fast.stats.proposed);
    // Ragged prompts decode as they would alone, speculative or not.
    const std::vector<std::vector<int32_t>> ragged = {tokens_of(4, 10, V), tokens_of(17, 11, V)};
    for (bool speculative : {false, true}) {
      GenerateOptions o = greedy(30);
      o.speculative = speculative;
      const Generation g = generate(m, ragged, o);
      for (size_t b = 0; b < ragged.size(); ++b) {
        const Generation alone = generate_recompute(m, {ragged[b]}, greedy(30));
        EXPECT_EQ(g.tokens[b], alone.tokens[0]) << "row " << b << " speculative " << speculative;
      }
    }
  }
}

TEST(GenerateLlama, SampledSpeculativeIsDeterministicAndSampledCachedEqualsRecomputed) {
  const Case c = cases()[0];
  GPT m(c.config, DType::kF64, Device::cpu(), 6);
  const std::vector<std::vector<int32_t>> prompts = {tokens_of(6, 12, 37), tokens_of(6, 13, 37)};
  GenerateOptions o;
  o.max_new_tokens = 40;
  o.sampling = {0.9, 10, 0.95};
  o.seed = 11;
  EXPECT_EQ(generate(m, prompts, o).tokens, generate_recompute(m, prompts, o).tokens);
  o.speculative = true;
  const Generation a = generate(m, prompts, o);
  const Generation b = generate(m, prompts, o);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_GT(a.stats.proposed, 0);
}

}  // namespace
}  // namespace gtron

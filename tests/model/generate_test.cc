// Generation with key/value caches is exact (issue 14, acceptance 1 and 3): on a trained tiny
// model with two MTP depths, the cached logits equal the full forward's at every position (main
// model and each depth), and greedy decoding with the cache, with MTP self-speculation and by full
// recomputation produce the same 200 tokens.
#include "model/generate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "model/decoder.h"
#include "model/ops/embedding.h"
#include "model/ops/linear.h"
#include "tests/model/decode_check.h"
#include "tests/model/trained_tiny.h"

namespace gtron {
namespace {

using testing::incremental_logits;
using testing::source_tokens;
using testing::trained_tiny_mtp2;

constexpr double kLogitTol = 1e-5;  // fp32 CPU (acceptance 3)

// Full-forward logits [T, V] of depth k (0: the main model) over one sequence, composed from the
// modules the way GPT::forward does (the MTP depths' logits are not a public output of GPT).
std::vector<std::vector<float>> reference_logits(GPT& m, const std::vector<int32_t>& seq, int k) {
  NoGradGuard no_grad;
  const auto T = static_cast<int64_t>(seq.size());
  auto shifted = [&](int s) {
    std::vector<int32_t> ids(seq.size(), 0);
    for (int64_t t = 0; t + s < T; ++t) ids[t] = seq[t + s];
    return Tensor::from_ints(ids, {1, T});
  };
  Var table = Var::param(m.token_embedding());
  Var h = add_positions(embedding(shifted(0), table), Var::param(m.position_embedding()));
  for (int l = 0; l < m.num_blocks(); ++l) h = m.block_forward(l, h);
  DirectWeights direct;
  for (int d = 1; d <= k; ++d) h = m.mtp_module(d).forward(h, embedding(shifted(d), table), direct);
  Var logits = linear(m.final_norm().forward(h), Var::param(m.output_head()), Var());
  const std::vector<double> all = logits.value().to_vector();
  const int64_t V = m.config().vocab_size, Vp = m.config().padded_vocab();
  std::vector<std::vector<float>> rows(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) rows[t].assign(all.begin() + t * Vp, all.begin() + t * Vp + V);
  return rows;
}

double max_diff(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b,
                size_t rows) {
  double d = 0;
  for (size_t t = 0; t < rows; ++t) {
    for (size_t v = 0; v < a[t].size(); ++v) d = std::max(d, std::fabs(double(a[t][v]) - b[t][v]));
  }
  return d;
}

TEST(Generate, CachedLogitsEqualTheFullForwardAtEveryPosition) {
  GPT& m = trained_tiny_mtp2();
  const int64_t V = m.config().vocab_size;
  const std::vector<std::vector<int32_t>> seqs = {source_tokens(0, 150), source_tokens(700, 97)};
  // Row 0: a prefill of 7, then single tokens and wider windows; row 1: other chunks, so the rows'
  // windows are ragged (and row 1 sits the last windows out).
  const std::vector<std::vector<int64_t>> plan = {{7, 1, 1, 1, 3, 1, 5, 2}, {1, 2, 4, 1}};
  Decoder dec(m, 2, /*keep_hidden=*/true);
  auto main =
      incremental_logits(seqs, plan, V, [&](const WindowInput& in) { return dec.main(in); });
  for (size_t b = 0; b < seqs.size(); ++b) {
    const auto ref = reference_logits(m, seqs[b], 0);
    ASSERT_EQ(main[b].size(), seqs[b].size());
    EXPECT_LE(max_diff(main[b], ref, ref.size()), kLogitTol) << "row " << b;
  }
  // The depths over the same positions: slot s of depth k feeds token s + k (teacher forcing) and
  // reads the hidden states the previous module stored there.
  for (int k = 1; k <= m.config().mtp_depth; ++k) {
    std::vector<std::vector<int32_t>> ahead;
    for (const auto& s : seqs) ahead.emplace_back(s.begin() + k, s.end());
    auto depth =
        incremental_logits(ahead, plan, V, [&](const WindowInput& in) { return dec.depth(k, in); });
    for (size_t b = 0; b < seqs.size(); ++b) {
      const auto ref = reference_logits(m, seqs[b], k);
      EXPECT_LE(max_diff(depth[b], ref, ahead[b].size()), kLogitTol) << "depth " << k;
    }
  }
}

TEST(Generate, RolledBackPositionsAreRecomputedExactly) {
  // Feed wrong tokens at positions 40..44, then the right ones from 40: the stale cache entries
  // must not leak into any later logits.
  GPT& m = trained_tiny_mtp2();
  const int64_t V = m.config().vocab_size;
  const std::vector<int32_t> seq = source_tokens(300, 80);
  const auto ref = reference_logits(m, seq, 0);
  Decoder dec(m, 1, false);
  auto window = [&](int64_t start, std::vector<int32_t> tokens) {
    WindowInput in{{tokens}, {start}, {{}}};
    for (size_t i = 0; i < tokens.size(); ++i) in.want[0].push_back(static_cast<int64_t>(i));
    return dec.main(in);
  };
  window(0, std::vector<int32_t>(seq.begin(), seq.begin() + 40));
  window(40, {3, 3, 3, 3, 3});
  const std::vector<float> rest = window(40, std::vector<int32_t>(seq.begin() + 40, seq.end()));
  double d = 0;
  for (int64_t t = 40; t < 80; ++t) {
    for (int64_t v = 0; v < V; ++v)
      d = std::max(d, std::fabs(double(rest[(t - 40) * V + v]) - ref[t][v]));
  }
  EXPECT_LE(d, kLogitTol);
}

// Greedy self-speculation over the final sequence y (prompt of P tokens) with D = 2, drafting from
// the composed full forward: depth 1 at position n-2 sees the real tokens; depth 2 there sees
// depth 1's draft as token n. Adds the drafts proposed and accepted.
void replay_greedy_speculation(GPT& m, const std::vector<int32_t>& y, int64_t P, int64_t* proposed,
                               int64_t* accepted) {
  auto best = [](const std::vector<float>& row) {
    return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
  };
  const auto target = static_cast<int64_t>(y.size());
  const auto depth1 = reference_logits(m, y, 1);  // causal: position n-2 sees tokens < n only
  for (int64_t n = P + 1; n < target;) {
    const int64_t want = std::min<int64_t>(2, target - n - 1);
    std::vector<int32_t> ctx(y.begin(), y.begin() + n), drafts;
    if (want >= 1) drafts.push_back(best(depth1[n - 2]));
    if (want >= 2) {
      ctx.push_back(drafts[0]);
      drafts.push_back(best(reference_logits(m, ctx, 2)[n - 2]));
    }
    int64_t j = 0;
    while (j < want && drafts[j] == y[n + j]) ++j;
    *proposed += want;
    *accepted += j;
    n += j + 1;
  }
}

GenerateOptions greedy(int64_t tokens) {
  GenerateOptions o;
  o.max_new_tokens = tokens;
  o.sampling.temperature = 0;
  return o;
}

TEST(Generate, GreedyCachedSpeculativeAndRecomputedGiveTheSame200Tokens) {
  GPT& m = trained_tiny_mtp2();
  const std::vector<std::vector<int32_t>> prompts = {source_tokens(0, 16), source_tokens(100, 16),
                                                     source_tokens(200, 16)};
  const Generation full = generate_recompute(m, prompts, greedy(200));
  const Generation cached = generate(m, prompts, greedy(200));
  GenerateOptions spec = greedy(200);
  spec.speculative = true;
  const Generation fast = generate(m, prompts, spec);
  for (size_t b = 0; b < prompts.size(); ++b) {
    ASSERT_EQ(full.tokens[b].size(), 200u);
    EXPECT_EQ(cached.tokens[b], full.tokens[b]) << "row " << b;
    EXPECT_EQ(fast.tokens[b], full.tokens[b]) << "row " << b;
  }
  EXPECT_EQ(cached.stats.proposed, 0);
  EXPECT_EQ(fast.stats.tokens, 600);
  // The drafts themselves: replaying Note [MTP self-speculative decoding] on the known output
  // with full-forward logits must propose and accept exactly what the decoder did.
  int64_t proposed = 0, accepted = 0;
  for (size_t b = 0; b < prompts.size(); ++b) {
    std::vector<int32_t> y = prompts[b];
    y.insert(y.end(), full.tokens[b].begin(), full.tokens[b].end());
    replay_greedy_speculation(m, y, static_cast<int64_t>(prompts[b].size()), &proposed, &accepted);
  }
  EXPECT_EQ(fast.stats.proposed, proposed);
  EXPECT_EQ(fast.stats.accepted, accepted);
  EXPECT_GT(accepted, 0) << fast.stats.json();
}

TEST(Generate, RaggedPromptsDecodeAsTheyWouldAlone) {
  GPT& m = trained_tiny_mtp2();
  const std::vector<std::vector<int32_t>> prompts = {source_tokens(50, 5), source_tokens(900, 23)};
  for (bool speculative : {false, true}) {
    GenerateOptions o = greedy(60);
    o.speculative = speculative;
    const Generation g = generate(m, prompts, o);
    for (size_t b = 0; b < prompts.size(); ++b) {
      const Generation alone = generate_recompute(m, {prompts[b]}, greedy(60));
      EXPECT_EQ(g.tokens[b], alone.tokens[0]) << "row " << b << " speculative " << speculative;
    }
  }
}

TEST(Generate, SampledCachedEqualsSampledRecomputed) {
  // Same seed, same random numbers in the same order: the same tokens.
  GPT& m = trained_tiny_mtp2();
  const std::vector<std::vector<int32_t>> prompts = {source_tokens(10, 8), source_tokens(20, 8)};
  GenerateOptions o;
  o.max_new_tokens = 100;
  o.sampling = {0.8, 8, 0.95};
  o.seed = 11;
  const Generation full = generate_recompute(m, prompts, o);
  const Generation cached = generate(m, prompts, o);
  EXPECT_EQ(cached.tokens, full.tokens);
  EXPECT_NE(cached.tokens[0], cached.tokens[1]) << "rows draw from distinct streams";
}

TEST(Generate, SpeculativeSamplingIsDeterministic) {
  GPT& m = trained_tiny_mtp2();
  GenerateOptions o;
  o.max_new_tokens = 120;
  o.speculative = true;
  o.seed = 5;
  const std::vector<std::vector<int32_t>> prompts(4, source_tokens(0, 8));
  const Generation a = generate(m, prompts, o);
  const Generation b = generate(m, prompts, o);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_GT(a.stats.accepted, 0);
  EXPECT_LT(a.stats.accepted, a.stats.proposed);
  for (const auto& row : a.tokens) {
    EXPECT_EQ(row.size(), 120u);
    for (int32_t t : row) EXPECT_TRUE(t >= 0 && t < 16) << t;
  }
}

}  // namespace
}  // namespace gtron

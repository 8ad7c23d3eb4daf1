#include "trainer/data/markov.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "model/check.h"

namespace gtron {
namespace {

double h2(double p) { return -p * std::log(p) - (1 - p) * std::log(1 - p); }

// Plug-in estimate of H(next | previous `order` tokens) from a token stream, and its Miller-Madow
// bias correction sum_ctx (observed symbols in ctx - 1) / (2N).
struct ConditionalEntropy {
  double plug_in = 0;
  double miller_madow = 0;
};

ConditionalEntropy empirical_conditional_entropy(const std::vector<uint32_t>& x, int order,
                                                 int vocab) {
  int64_t contexts = 1;
  for (int k = 0; k < order; ++k) contexts *= vocab;
  std::vector<int64_t> joint(static_cast<size_t>(contexts * vocab), 0);
  std::vector<int64_t> ctx_count(static_cast<size_t>(contexts), 0);
  int64_t ctx = 0;
  for (int k = 0; k < order; ++k) ctx = ctx * vocab + x[k];
  const int64_t n = static_cast<int64_t>(x.size()) - order;
  for (int64_t i = order; i < static_cast<int64_t>(x.size()); ++i) {
    ++joint[ctx * vocab + x[i]];
    ++ctx_count[ctx];
    ctx = (ctx % (contexts / vocab)) * vocab + x[i];
  }
  ConditionalEntropy out;
  int64_t observed_cells = 0;
  int64_t observed_contexts = 0;
  for (int64_t c = 0; c < contexts; ++c) {
    if (ctx_count[c] == 0) continue;
    ++observed_contexts;
    for (int v = 0; v < vocab; ++v) {
      const int64_t m = joint[c * vocab + v];
      if (m == 0) continue;
      ++observed_cells;
      out.plug_in -= static_cast<double>(m) / n * std::log(static_cast<double>(m) / ctx_count[c]);
    }
  }
  out.miller_madow =
      out.plug_in + static_cast<double>(observed_cells - observed_contexts) / (2.0 * n);
  return out;
}

TEST(Markov, HandCaseOrderOneVocabTwo) {
  // P = [[0.9, 0.1], [0.4, 0.6]]: balance 0.1 pi0 = 0.4 pi1 gives pi = (0.8, 0.2).
  MarkovSource m(1, 2, {0.9, 0.1, 0.4, 0.6});
  ASSERT_EQ(m.num_contexts(), 2);
  EXPECT_NEAR(m.stationary()[0], 0.8, 1e-12);
  EXPECT_NEAR(m.stationary()[1], 0.2, 1e-12);
  const double rate = 0.8 * h2(0.9) + 0.2 * h2(0.4);  // = 0.3947... nats
  EXPECT_NEAR(m.entropy_rate(), rate, 1e-12);
  EXPECT_NEAR(m.unigram_entropy(), h2(0.8), 1e-12);
  EXPECT_NEAR(m.token_marginal()[0], 0.8, 1e-12);

  // The generated stream has the stationary frequencies and transition frequencies.
  const std::vector<uint32_t> x = m.generate(200000, 7);
  int64_t ones = 0, zero_to_one = 0, zeros_before = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    ones += x[i];
    if (i > 0 && x[i - 1] == 0) {
      ++zeros_before;
      zero_to_one += x[i];
    }
  }
  EXPECT_NEAR(static_cast<double>(ones) / x.size(), 0.2, 0.01);
  EXPECT_NEAR(static_cast<double>(zero_to_one) / zeros_before, 0.1, 0.005);
}

TEST(Markov, PeriodicChainStillConverges) {
  // Deterministic alternation: plain power iteration would oscillate; the lazy chain converges.
  MarkovSource m(1, 2, {0, 1, 1, 0});
  EXPECT_NEAR(m.stationary()[0], 0.5, 1e-12);
  EXPECT_NEAR(m.entropy_rate(), 0.0, 1e-15);
  EXPECT_NEAR(m.unigram_entropy(), std::log(2.0), 1e-12);
  const std::vector<uint32_t> x = m.generate(100, 3);
  for (size_t i = 1; i < x.size(); ++i) EXPECT_NE(x[i], x[i - 1]);
}

TEST(Markov, OrderTwoContextEncodingUsesTheOlderTokenAsHighDigit) {
  // ctx = t_{-2} * 2 + t_{-1}. Rows copy t_{-2} with probability 0.9 regardless of t_{-1}.
  MarkovSource m(2, 2, {0.9, 0.1, 0.9, 0.1, 0.1, 0.9, 0.1, 0.9});
  EXPECT_NEAR(m.entropy_rate(), h2(0.9), 1e-12);
  const std::vector<uint32_t> x = m.generate(100000, 11);
  int64_t same_as_two_back = 0, same_as_one_back = 0;
  for (size_t i = 2; i < x.size(); ++i) {
    same_as_two_back += x[i] == x[i - 2];
    same_as_one_back += x[i] == x[i - 1];
  }
  EXPECT_NEAR(static_cast<double>(same_as_two_back) / (x.size() - 2), 0.9, 0.01);
  EXPECT_NEAR(static_cast<double>(same_as_one_back) / (x.size() - 2), 0.5, 0.02);
}

TEST(Markov, DefaultSourceNeedsContextAndMatchesItsSamples) {
  MarkovSource m(2, 64, 0.2, 1234);
  ASSERT_EQ(m.num_contexts(), 4096);

  // pi is stationary: pi P = pi to rounding, and sums to 1.
  std::vector<double> next(4096, 0.0);
  double total = 0;
  for (int64_t c = 0; c < 4096; ++c) {
    total += m.stationary()[c];
    for (int v = 0; v < 64; ++v) next[(c % 64) * 64 + v] += m.stationary()[c] * m.transition(c, v);
  }
  double residual = 0;
  for (int64_t c = 0; c < 4096; ++c) residual += std::abs(next[c] - m.stationary()[c]);
  EXPECT_LT(residual, 1e-12);
  EXPECT_NEAR(total, 1.0, 1e-12);

  // Context matters: knowing the last two tokens saves more than a nat per token.
  EXPECT_LT(m.entropy_rate(), m.unigram_entropy() - 1.0)
      << "rate " << m.entropy_rate() << " unigram " << m.unigram_entropy();
  EXPECT_LT(m.unigram_entropy(), std::log(64.0));

  // 2M samples. (1) Their cross-entropy under the true table, -mean log P(x_i | ctx_i), is an
  // unbiased estimate of the entropy rate once the chain is stationary (it mixes within a few
  // tokens); its standard error is ~sqrt(Var[-log p] / N) ~ 1.5e-3, so 0.01 is ~6 sd (measured:
  // 2.8763 vs rate 2.8759). (2) The plug-in conditional entropy from (ctx, next) counts is biased
  // LOW, deterministically rather than by noise: ~0.03 nats from sum_ctx (symbols seen - 1) / 2N
  // (4096 contexts x ~30 symbols / 4M) plus the mass of the rare symbols Dirichlet(0.2) rows have
  // that the counts miss. Measured bias: 0.045 nats (plug-in 2.8311). So it must lie in
  // (rate - 0.06, rate), and the Miller-Madow correction must move it closer.
  const std::vector<uint32_t> x = m.generate(2000000, 99);
  double cross_entropy = 0;
  for (size_t i = 2; i < x.size(); ++i) {
    cross_entropy -= std::log(m.transition(x[i - 2] * 64 + x[i - 1], static_cast<int>(x[i])));
  }
  cross_entropy /= static_cast<double>(x.size() - 2);
  EXPECT_NEAR(cross_entropy, m.entropy_rate(), 0.01);
  const ConditionalEntropy est = empirical_conditional_entropy(x, 2, 64);
  EXPECT_LT(est.plug_in, m.entropy_rate());
  EXPECT_GT(est.plug_in, m.entropy_rate() - 0.06);
  EXPECT_LT(std::abs(est.miller_madow - m.entropy_rate()), m.entropy_rate() - est.plug_in);

  // Token frequencies follow the stationary marginal (L1 over 64 tokens).
  std::vector<double> freq(64, 0.0);
  for (uint32_t t : x) freq[t] += 1.0 / x.size();
  double l1 = 0;
  for (int v = 0; v < 64; ++v) l1 += std::abs(freq[v] - m.token_marginal()[v]);
  EXPECT_LT(l1, 0.02);
}

TEST(Markov, BigramMixesAFirstOrderPartIntoTheSameOrderTwoRows) {
  // row_b(ctx) = b·B[last token] + (1 − b)·D[ctx], with D the b = 0 table of the same seed: so
  // (row_b − (1 − b)·row_0) / b depends only on the last token and is a distribution.
  const double b = 0.8;
  MarkovSource pure(2, 16, 0.2, 1234), mixed(2, 16, 0.2, 1234, b);
  for (int last = 0; last < 16; ++last) {
    for (int older = 0; older < 16; ++older) {
      const int64_t ctx = older * 16 + last;
      double sum = 0;
      for (int v = 0; v < 16; ++v) {
        const double part = (mixed.transition(ctx, v) - (1 - b) * pure.transition(ctx, v)) / b;
        const double ref = (mixed.transition(last, v) - (1 - b) * pure.transition(last, v)) / b;
        EXPECT_NEAR(part, ref, 1e-12) << "ctx " << ctx << " v " << v;
        EXPECT_GE(part, -1e-12);
        sum += part;
      }
      EXPECT_NEAR(sum, 1.0, 1e-12);
    }
  }
  // Still order 2 (the older token matters), with an exact rate between the bigram-only loss and
  // the unigram: the previous token alone now predicts most of what can be predicted.
  EXPECT_LT(mixed.entropy_rate(), mixed.unigram_entropy() - 0.5);
  const std::vector<uint32_t> x = mixed.generate(1000000, 7);
  const ConditionalEntropy order1 = empirical_conditional_entropy(x, 1, 16);
  const ConditionalEntropy order2 = empirical_conditional_entropy(x, 2, 16);
  EXPECT_GT(order1.miller_madow - order2.miller_madow, 0.02);  // context beyond one token helps
  EXPECT_GT(mixed.unigram_entropy() - order1.miller_madow,
            0.5 * (mixed.unigram_entropy() - mixed.entropy_rate()));
  EXPECT_THROW(MarkovSource(2, 16, 0.2, 1, 1.0), UserError);
  EXPECT_THROW(MarkovSource(2, 16, 0.2, 1, -0.1), UserError);
}

TEST(Markov, DeterministicInSeeds) {
  MarkovSource a(2, 16, 0.5, 5), b(2, 16, 0.5, 5), c(2, 16, 0.5, 6);
  EXPECT_EQ(a.entropy_rate(), b.entropy_rate());
  EXPECT_NE(a.entropy_rate(), c.entropy_rate());
  EXPECT_EQ(a.generate(1000, 1), b.generate(1000, 1));
  EXPECT_NE(a.generate(1000, 1), a.generate(1000, 2));
  for (uint32_t t : a.generate(1000, 3)) EXPECT_LT(t, 16u);
}

TEST(Markov, RejectsBadParameters) {
  EXPECT_THROW(MarkovSource(0, 64, 0.2, 1), UserError);
  EXPECT_THROW(MarkovSource(2, 1, 0.2, 1), UserError);
  EXPECT_THROW(MarkovSource(2, 64, 0.0, 1), UserError);
  EXPECT_THROW(MarkovSource(2, 64, std::nan(""), 1), UserError);
  EXPECT_THROW(MarkovSource(5, 64, 0.2, 1), UserError);                // 64^6 entries
  EXPECT_THROW(MarkovSource(1, 2, {0.5, 0.5, 0.5}), UserError);        // wrong size
  EXPECT_THROW(MarkovSource(1, 2, {0.5, 0.6, 0.5, 0.5}), UserError);   // row sum 1.1
  EXPECT_THROW(MarkovSource(1, 2, {1.5, -0.5, 0.5, 0.5}), UserError);  // negative
}

TEST(Markov, MetaJson) {
  const char* root = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(root != nullptr ? root : "/tmp") + "/markov_meta.json";
  MarkovSource m(2, 8, 0.3, 42);
  m.write_meta_json(path, 1000, 100);
  nlohmann::json meta;
  std::ifstream(path) >> meta;
  EXPECT_EQ(meta["source"], "markov");
  EXPECT_EQ(meta["order"], 2);
  EXPECT_EQ(meta["vocab"], 8);
  EXPECT_EQ(meta["alpha"], 0.3);
  EXPECT_EQ(meta["seed"], 42);
  EXPECT_EQ(meta["bigram"], 0.0);
  EXPECT_EQ(meta["tokens"], 1000);
  EXPECT_EQ(meta["val_tokens"], 100);
  EXPECT_EQ(meta["entropy_rate"].get<double>(), m.entropy_rate());  // round-trips exactly
  EXPECT_EQ(meta["unigram_entropy"].get<double>(), m.unigram_entropy());

  MarkovSource explicit_table(1, 2, {0.9, 0.1, 0.4, 0.6});
  explicit_table.write_meta_json(path, 10, 1);
  std::ifstream(path) >> meta;
  EXPECT_TRUE(meta["alpha"].is_null());
  EXPECT_TRUE(meta["seed"].is_null());
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

}  // namespace
}  // namespace gtron

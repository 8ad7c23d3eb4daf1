// Speculative sampling keeps the main model's distribution (issue 14, acceptance 2): the tokens
// that come out of draft-and-verify follow p, by a chi-square test that the naive rule (keep every
// draft, i.e. sample from the draft model q) fails with the same samples' budget and bound. First
// the rule alone on fixed p and q, then the whole decoder on a small-vocabulary model whose MTP
// depth disagrees with its main model.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>

#include "model/generate.h"
#include "model/sampling.h"

namespace gtron {
namespace {

// The upper critical value of chi-square with `df` degrees of freedom at normal quantile z
// (Wilson–Hilferty). z = 4.75 is a one-sided tail of about 1e-6.
double chi2_critical(int df, double z = 4.75) {
  const double a = 2.0 / (9.0 * df);
  return df * std::pow(1 - a + z * std::sqrt(a), 3);
}

struct ChiSquare {
  double stat = 0;
  int df = 0;
  bool passes() const { return stat < chi2_critical(df); }
};

// Pearson's statistic of `counts` (n samples) against `expected` probabilities, with the cells
// expecting fewer than 5 samples pooled into one.
ChiSquare chi_square(const std::vector<double>& counts, const std::vector<double>& expected) {
  double n = 0;
  for (double c : counts) n += c;
  ChiSquare r;
  double pooled_obs = 0, pooled_exp = 0;
  int cells = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double e = expected[i] * n;
    if (e < 5) {
      pooled_obs += counts[i];
      pooled_exp += e;
      continue;
    }
    r.stat += (counts[i] - e) * (counts[i] - e) / e;
    ++cells;
  }
  if (pooled_exp > 0) {
    r.stat += (pooled_obs - pooled_exp) * (pooled_obs - pooled_exp) / pooled_exp;
    ++cells;
  }
  r.df = cells - 1;
  return r;
}

Verdict keep_every_draft(const std::vector<double>&, const std::vector<double>&, int32_t draft,
                         Rng&) {
  return {true, draft};
}

TEST(SpeculativeSampling, TheRuleTurnsDraftsFromQIntoSamplesOfP) {
  const std::vector<double> p = {0.4, 0.25, 0.15, 0.1, 0.07, 0.03, 0.0};
  const std::vector<double> q = {0.05, 0.1, 0.2, 0.3, 0.2, 0.1, 0.05};
  const int kTrials = 100000;
  for (bool naive : {false, true}) {
    const DraftVerifier rule = naive ? DraftVerifier(keep_every_draft) : verify_draft;
    Rng rng = row_rng(42, 0);
    std::vector<double> counts(p.size(), 0);
    int accepted = 0;
    for (int i = 0; i < kTrials; ++i) {
      const Verdict v = rule(p, q, draw(q, rng), rng);
      counts[static_cast<size_t>(v.token)] += 1;
      accepted += v.accepted;
    }
    const ChiSquare c = chi_square(counts, p);
    std::printf("rule %s: chi2 %.1f, df %d, critical %.1f\n", naive ? "naive" : "exact", c.stat,
                c.df, chi2_critical(c.df));
    if (naive) {
      EXPECT_FALSE(c.passes()) << "the naive rule must fail: chi2 " << c.stat << " df " << c.df;
      continue;
    }
    EXPECT_TRUE(c.passes()) << "chi2 " << c.stat << " df " << c.df << " crit "
                            << chi2_critical(c.df);
    // The acceptance rate is Σ min(p, q) = 1 − TV(p, q) = 0.5 here.
    EXPECT_NEAR(static_cast<double>(accepted) / kTrials, 0.5, 0.01);
    EXPECT_EQ(counts.back(), 0) << "a token p gives no mass never comes out";
  }
}

// A small-vocabulary model, untrained but with a wide init so that its distributions are far
// from uniform, and its MTP depth (a different random function) far from the main model.
GPTConfig small_model() {
  GPTConfig c;
  c.vocab_size = 8;
  c.context_length = 16;
  c.n_layer = 1;
  c.n_head = 2;
  c.n_embd = 32;
  c.mtp_depth = 1;
  c.init_std = 0.3;
  return c;
}

// The main model's law of the first two new tokens after `prompt`: P(a, b) = p(a)·p(b | a), from
// full-forward logits.
std::vector<double> two_token_law(GPT& m, const std::vector<int32_t>& prompt,
                                  const SamplingOptions& s) {
  const int64_t V = m.config().vocab_size, Vp = m.config().padded_vocab();
  auto next = [&](const std::vector<int32_t>& ctx) {
    const auto T = static_cast<int64_t>(ctx.size());
    const std::vector<double> all = m.logits(Tensor::from_ints(ctx, {1, T})).to_vector();
    const std::vector<float> row(all.begin() + (T - 1) * Vp, all.begin() + (T - 1) * Vp + V);
    return sampling_distribution(row.data(), V, s);
  };
  const std::vector<double> first = next(prompt);
  std::vector<double> law(static_cast<size_t>(V * V));
  for (int32_t a = 0; a < V; ++a) {
    std::vector<int32_t> ctx = prompt;
    ctx.push_back(a);
    const std::vector<double> second = next(ctx);
    for (int32_t b = 0; b < V; ++b) law[a * V + b] = first[a] * second[b];
  }
  return law;
}

TEST(SpeculativeSampling, DecodedTokensFollowTheMainModel) {
  GPT m(small_model(), DType::kF32, Device::cpu(), 3);
  const std::vector<int32_t> prompt = {1, 2, 3};
  const int64_t V = m.config().vocab_size;
  const int kRows = 4000;
  for (const SamplingOptions& s : {SamplingOptions{1.0, 0, 1.0}, SamplingOptions{0.8, 6, 0.95}}) {
    const std::vector<double> law = two_token_law(m, prompt, s);
    std::map<std::string, ChiSquare> results;
    for (const char* rule : {"exact", "naive"}) {
      GenerateOptions o;
      o.max_new_tokens = 3;  // the second token comes from a verified draft (D = 1)
      o.sampling = s;
      o.seed = 17;
      o.speculative = true;
      if (std::string(rule) == "naive") o.verify = keep_every_draft;
      const Generation g = generate(m, std::vector<std::vector<int32_t>>(kRows, prompt), o);
      std::vector<double> counts(static_cast<size_t>(V * V), 0);
      for (const auto& row : g.tokens) counts[row[0] * V + row[1]] += 1;
      results[rule] = chi_square(counts, law);
      EXPECT_EQ(g.stats.proposed, kRows) << rule;
    }
    for (const auto& [rule, c] : results) {
      std::printf("T %.1f top-k %ld top-p %.2f, rule %s: chi2 %.1f, df %d, critical %.1f\n",
                  s.temperature, static_cast<long>(s.top_k), s.top_p, rule.c_str(), c.stat, c.df,
                  chi2_critical(c.df));
    }
    const ChiSquare& exact = results["exact"];
    const ChiSquare& naive = results["naive"];
    EXPECT_TRUE(exact.passes()) << "T " << s.temperature << ": chi2 " << exact.stat << " df "
                                << exact.df << " crit " << chi2_critical(exact.df);
    EXPECT_FALSE(naive.passes()) << "T " << s.temperature << ": naive chi2 " << naive.stat << " df "
                                 << naive.df;
  }
}

}  // namespace
}  // namespace gtron

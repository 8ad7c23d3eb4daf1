// A synthetic token source with a known answer: an order-K Markov chain over a vocabulary of V
// tokens. A model that learns the chain perfectly reaches a loss equal to the chain's entropy rate,
// so convergence tests have an exact floor to aim at.
//
// Contexts: the last K tokens (t_{-K}, ..., t_{-1}) as one index
//   ctx = t_{-K} * V^{K-1} + ... + t_{-1}        (most recent token = least significant digit),
// and after emitting token v the next context is (ctx * V + v) mod V^K.
//
// Transition rows: row(ctx)[v] = P(next = v | ctx), stored densely (V^K rows of V). The random
// constructor draws each row from a symmetric Dirichlet(alpha) (independent Gamma(alpha, 1) draws,
// normalized), then, with bigram weight b > 0, mixes in a first-order part:
//   row(ctx) = b · B[t_{-1}] + (1 − b) · D[ctx],  B's V rows drawn from Dirichlet(alpha) after D's.
// The chain stays order K (D still depends on the whole context) and its entropy rate stays exact;
// b gives models a signal they pick up early (the previous token alone), so a loss curve leaves the
// unigram plateau quickly. b = 0 draws exactly the table of earlier versions. Gamma, normal and
// uniform variates are computed here from std::mt19937_64 (Marsaglia- Tsang for the gamma), not by
// std:: distributions, so a seed gives the same table with any standard library.
//
// Stationary distribution: power iteration of the lazy chain (pi <- (pi + pi P) / 2; same fixed
// point, and it converges for periodic chains too) over the V^K contexts, from uniform, until the
// L1 change is < 1e-13.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gtron {

// The largest transition table (vocab^(order+1) entries, 128 MiB of doubles): a larger source is a
// UserError before anything is allocated.
constexpr int64_t kMarkovMaxTableEntries = int64_t{1} << 24;

class MarkovSource {
 public:
  // Random table. REQUIRES (else UserError): order >= 1, vocab >= 2, alpha > 0 and finite,
  // 0 <= bigram < 1, vocab^(order+1) <= 2^24 entries.
  MarkovSource(int order, int vocab, double alpha, uint64_t seed, double bigram = 0.0);

  // Explicit table: `transitions[ctx * vocab + v]` for ctx in [0, vocab^order). Every row must be
  // non-negative and sum to 1 within 1e-9 (it is renormalized); else UserError.
  MarkovSource(int order, int vocab, std::vector<double> transitions);

  int order() const { return order_; }
  int vocab() const { return vocab_; }
  int64_t num_contexts() const { return num_contexts_; }
  // P(next = v | ctx). REQUIRES: 0 <= ctx < num_contexts(), 0 <= v < vocab().
  double transition(int64_t ctx, int v) const { return rows_[ctx * vocab_ + v]; }

  // n tokens: the first context is drawn uniformly from the V^K contexts using `seed` (its K tokens
  // are not emitted), then the chain runs. Deterministic in (table, n, seed).
  std::vector<uint32_t> generate(int64_t n, uint64_t seed) const;

  // The stationary distribution over contexts (num_contexts entries, sums to 1).
  const std::vector<double>& stationary() const { return stationary_; }
  // The stationary marginal of a single token: p(v) = sum_ctx pi(ctx) row(ctx)[v].
  const std::vector<double>& token_marginal() const { return marginal_; }

  // Exact entropy rate in nats/token: sum_ctx pi(ctx) * H(row(ctx)). The best achievable loss.
  double entropy_rate() const { return entropy_rate_; }
  // Entropy of the stationary token marginal, in nats: the best loss without any context.
  double unigram_entropy() const { return unigram_entropy_; }

  // Writes a JSON object, atomically: {"source": "markov", "tokenizer": "none", "order", "vocab",
  // "alpha", "seed", "bigram" (null for an explicit table), "tokens", "val_tokens", "entropy_rate",
  // "unigram_entropy"}.
  void write_meta_json(const std::string& path, int64_t tokens, int64_t val_tokens) const;

 private:
  void finish_construction();  // computes the CDFs, stationary distribution and entropies

  int order_ = 0;
  int vocab_ = 0;
  int64_t num_contexts_ = 0;
  bool random_ = false;  // made by the (alpha, seed) constructor
  double alpha_ = 0;
  uint64_t seed_ = 0;
  double bigram_ = 0;
  std::vector<double> rows_;        // [num_contexts, V]
  std::vector<double> cdf_;         // [num_contexts, V], inclusive prefix sums of rows_, last = 1
  std::vector<double> stationary_;  // [num_contexts]
  std::vector<double> marginal_;    // [V]
  double entropy_rate_ = 0;
  double unigram_entropy_ = 0;
};

}  // namespace gtron

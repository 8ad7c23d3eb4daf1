#include "trainer/data/markov.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <random>

#include "model/check.h"
#include "trainer/data/shards.h"

namespace gtron {
namespace {

constexpr int64_t kMaxTableEntries = kMarkovMaxTableEntries;
constexpr double kStationaryTolerance = 1e-13;  // L1 change between iterations
constexpr int kMaxPowerIterations = 200000;

// Uniform in (0, 1]: never 0, so its log and its powers are safe.
double uniform_open0(std::mt19937_64& gen) {
  return static_cast<double>((gen() >> 11) + 1) * 0x1p-53;
}

// Uniform in [0, 1).
double uniform_open1(std::mt19937_64& gen) { return static_cast<double>(gen() >> 11) * 0x1p-53; }

// Standard normal by Box-Muller (one of the pair; simple and enough for table generation).
double normal(std::mt19937_64& gen) {
  const double u1 = uniform_open0(gen);
  const double u2 = uniform_open1(gen);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

// Gamma(shape, 1) by Marsaglia-Tsang (2000). For shape < 1 it uses Gamma(shape + 1) * U^(1/shape).
double gamma_variate(double shape, std::mt19937_64& gen) {
  if (shape < 1.0) {
    const double g = gamma_variate(shape + 1.0, gen);
    return g * std::pow(uniform_open0(gen), 1.0 / shape);
  }
  const double d = shape - 1.0 / 3.0;
  const double c = 1.0 / std::sqrt(9.0 * d);
  for (;;) {
    const double x = normal(gen);
    double v = 1.0 + c * x;
    if (v <= 0.0) continue;
    v = v * v * v;
    const double u = uniform_open0(gen);
    if (u < 1.0 - 0.0331 * x * x * x * x) return d * v;
    if (std::log(u) < 0.5 * x * x + d * (1.0 - v + std::log(v))) return d * v;
  }
}

double entropy_nats(const double* p, int64_t n) {
  double h = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    if (p[i] > 0.0) h -= p[i] * std::log(p[i]);
  }
  return h;
}

// vocab^order, checking the table size limit.
int64_t count_contexts(int order, int vocab) {
  if (order < 1 || vocab < 2) {
    throw UserError(str_cat("markov source: got order ", order, " and vocab ", vocab,
                            "; expected order >= 1 and vocab >= 2."));
  }
  int64_t contexts = 1;
  for (int k = 0; k < order; ++k) {
    contexts *= vocab;
    if (contexts * vocab > kMaxTableEntries) {
      throw UserError(str_cat("markov source: order ", order, " and vocab ", vocab,
                              " need vocab^(order+1) transition entries, more than the limit ",
                              kMaxTableEntries, ". Hint: lower the order or the vocab."));
    }
  }
  return contexts;
}

}  // namespace

namespace {

// count rows of v entries, each from Dirichlet(alpha): Gamma(alpha, 1) draws, normalized.
std::vector<double> dirichlet_rows(int64_t count, int v, double alpha, std::mt19937_64& gen) {
  std::vector<double> rows(static_cast<size_t>(count * v));
  for (int64_t r = 0; r < count; ++r) {
    double* row = &rows[r * v];
    double sum = 0.0;
    for (int k = 0; k < v; ++k) {
      row[k] = gamma_variate(alpha, gen);
      sum += row[k];
    }
    // Gamma(alpha) draws are > 0 almost surely; a zero sum would need every draw to underflow.
    GTRON_CHECK(sum > 0.0, "all gamma draws of row ", r, " underflowed");
    for (int k = 0; k < v; ++k) row[k] /= sum;
  }
  return rows;
}

}  // namespace

MarkovSource::MarkovSource(int order, int vocab, double alpha, uint64_t seed, double bigram)
    : order_(order), vocab_(vocab), random_(true), alpha_(alpha), seed_(seed), bigram_(bigram) {
  num_contexts_ = count_contexts(order, vocab);
  if (!(alpha > 0.0) || !std::isfinite(alpha)) {
    throw UserError(str_cat("markov source: alpha ", alpha,
                            " is not allowed; expected a finite Dirichlet concentration > 0."));
  }
  if (!(bigram >= 0.0 && bigram < 1.0)) {
    throw UserError(
        str_cat("markov source: bigram ", bigram, " is not allowed; expected a weight in [0, 1)."));
  }
  std::mt19937_64 gen(seed);
  rows_ = dirichlet_rows(num_contexts_, vocab_, alpha, gen);
  if (bigram > 0.0) {
    const std::vector<double> first_order = dirichlet_rows(vocab_, vocab_, alpha, gen);
    for (int64_t ctx = 0; ctx < num_contexts_; ++ctx) {
      const double* b = &first_order[(ctx % vocab_) * vocab_];  // the most recent token's row
      double* row = &rows_[ctx * vocab_];
      for (int v = 0; v < vocab_; ++v) row[v] = bigram * b[v] + (1.0 - bigram) * row[v];
    }
  }
  finish_construction();
}

MarkovSource::MarkovSource(int order, int vocab, std::vector<double> transitions)
    : order_(order), vocab_(vocab), rows_(std::move(transitions)) {
  num_contexts_ = count_contexts(order, vocab);
  if (static_cast<int64_t>(rows_.size()) != num_contexts_ * vocab_) {
    throw UserError(str_cat("markov source: got ", rows_.size(), " transition entries; expected ",
                            num_contexts_ * vocab_, " (vocab^order rows of vocab)."));
  }
  for (int64_t ctx = 0; ctx < num_contexts_; ++ctx) {
    double* row = &rows_[ctx * vocab_];
    double sum = 0.0;
    for (int v = 0; v < vocab_; ++v) {
      if (!(row[v] >= 0.0) || !std::isfinite(row[v])) {
        throw UserError(str_cat("markov source: transition[", ctx, "][", v, "] = ", row[v],
                                "; expected a finite probability >= 0."));
      }
      sum += row[v];
    }
    if (std::abs(sum - 1.0) > 1e-9) {
      throw UserError(str_cat("markov source: row ", ctx, " sums to ", sum, "; expected 1."));
    }
    for (int v = 0; v < vocab_; ++v) row[v] /= sum;
  }
  finish_construction();
}

void MarkovSource::finish_construction() {
  const int64_t V = vocab_;
  const int64_t C = num_contexts_;
  // CDFs for sampling. From the last non-zero entry on the CDF is exactly 1, so a uniform in [0, 1)
  // never lands on a zero-probability token through rounding.
  cdf_.resize(rows_.size());
  for (int64_t ctx = 0; ctx < C; ++ctx) {
    const double* row = &rows_[ctx * V];
    double* cdf = &cdf_[ctx * V];
    int64_t last_nonzero = 0;
    double acc = 0.0;
    for (int64_t v = 0; v < V; ++v) {
      acc += row[v];
      cdf[v] = acc;
      if (row[v] > 0.0) last_nonzero = v;
    }
    for (int64_t v = 0; v < V; ++v) cdf[v] = v >= last_nonzero ? 1.0 : cdf[v] / acc;
  }

  // Lazy power iteration: next[(ctx mod C/V) * V + v] += pi[ctx] * row[ctx][v].
  std::vector<double> pi(static_cast<size_t>(C), 1.0 / static_cast<double>(C));
  std::vector<double> next(static_cast<size_t>(C));
  const int64_t suffixes = C / V;
  bool converged = false;
  for (int it = 0; it < kMaxPowerIterations && !converged; ++it) {
    std::fill(next.begin(), next.end(), 0.0);
    for (int64_t ctx = 0; ctx < C; ++ctx) {
      const double* row = &rows_[ctx * V];
      double* dst = &next[(ctx % suffixes) * V];
      const double p = pi[ctx];
      for (int64_t v = 0; v < V; ++v) dst[v] += p * row[v];
    }
    double sum = 0.0;
    for (int64_t i = 0; i < C; ++i) {
      next[i] = 0.5 * (next[i] + pi[i]);
      sum += next[i];
    }
    double change = 0.0;
    for (int64_t i = 0; i < C; ++i) {
      next[i] /= sum;  // keeps rounding drift from accumulating in the total mass
      change += std::abs(next[i] - pi[i]);
    }
    pi.swap(next);
    converged = change < kStationaryTolerance;
  }
  if (!converged) {
    throw UserError(str_cat("markov source: the stationary distribution did not converge in ",
                            kMaxPowerIterations,
                            " power iterations. Hint: the chain mixes too "
                            "slowly; use a table without near-absorbing "
                            "states."));
  }
  stationary_ = std::move(pi);

  marginal_.assign(static_cast<size_t>(V), 0.0);
  entropy_rate_ = 0.0;
  for (int64_t ctx = 0; ctx < C; ++ctx) {
    const double* row = &rows_[ctx * V];
    entropy_rate_ += stationary_[ctx] * entropy_nats(row, V);
    for (int64_t v = 0; v < V; ++v) marginal_[v] += stationary_[ctx] * row[v];
  }
  unigram_entropy_ = entropy_nats(marginal_.data(), V);
}

std::vector<uint32_t> MarkovSource::generate(int64_t n, uint64_t seed) const {
  GTRON_CHECK(n >= 0, "generate(", n, ")");
  std::mt19937_64 gen(seed);
  int64_t ctx = static_cast<int64_t>(gen() % static_cast<uint64_t>(num_contexts_));
  const int64_t suffixes = num_contexts_ / vocab_;
  std::vector<uint32_t> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const double* cdf = &cdf_[ctx * vocab_];
    const double u = uniform_open1(gen);
    const int64_t v = std::upper_bound(cdf, cdf + vocab_, u) - cdf;  // first entry > u
    out[i] = static_cast<uint32_t>(v);
    ctx = (ctx % suffixes) * vocab_ + v;
  }
  return out;
}

void MarkovSource::write_meta_json(const std::string& path, int64_t tokens,
                                   int64_t val_tokens) const {
  nlohmann::json meta;
  meta["source"] = "markov";
  meta["tokenizer"] = "none";
  meta["order"] = order_;
  meta["vocab"] = vocab_;
  meta["alpha"] = random_ ? nlohmann::json(alpha_) : nlohmann::json(nullptr);
  meta["bigram"] = random_ ? nlohmann::json(bigram_) : nlohmann::json(nullptr);
  meta["seed"] = random_ ? nlohmann::json(seed_) : nlohmann::json(nullptr);
  meta["tokens"] = tokens;
  meta["val_tokens"] = val_tokens;
  meta["entropy_rate"] = entropy_rate_;
  meta["unigram_entropy"] = unigram_entropy_;
  write_file_atomic(path, meta.dump(2) + "\n");
}

}  // namespace gtron

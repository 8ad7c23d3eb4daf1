#include "model/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "model/check.h"

namespace gtron {

Rng row_rng(uint64_t seed, int64_t row) {
  // splitmix64 of (seed, row): nearby seeds and rows give unrelated streams.
  uint64_t x = seed + 0x9e3779b97f4a7c15ULL * (static_cast<uint64_t>(row) + 1);
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return Rng(x ^ (x >> 31));
}

double uniform(Rng& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

int32_t argmax(const float* logits, int64_t V) {
  GTRON_CHECK(V > 0, "argmax over ", V, " logits");
  return static_cast<int32_t>(std::max_element(logits, logits + V) - logits);
}

std::vector<double> sampling_distribution(const float* logits, int64_t V,
                                          const SamplingOptions& opts) {
  GTRON_CHECK(!opts.greedy() && opts.top_p > 0 && opts.top_p <= 1 && V > 0,
              "sampling_distribution: temperature ", opts.temperature, ", top_p ", opts.top_p);
  double cutoff = -INFINITY;
  if (opts.top_k > 0 && opts.top_k < V) {
    std::vector<float> sorted(logits, logits + V);
    std::nth_element(sorted.begin(), sorted.begin() + (opts.top_k - 1), sorted.end(),
                     std::greater<float>());
    cutoff = sorted[static_cast<size_t>(opts.top_k - 1)];
  }
  const double mx = *std::max_element(logits, logits + V);
  std::vector<double> p(static_cast<size_t>(V));
  double sum = 0;
  for (int64_t i = 0; i < V; ++i) {
    p[i] = logits[i] < cutoff ? 0.0 : std::exp((logits[i] - mx) / opts.temperature);
    sum += p[i];
  }
  for (double& x : p) x /= sum;
  if (opts.top_p >= 1) return p;
  // The nucleus: most likely first (lower index first among equals), until the mass reaches top_p.
  std::vector<int32_t> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[a] > p[b]; });
  double mass = 0;
  size_t keep = 0;
  while (keep < order.size() && (keep == 0 || mass < opts.top_p)) mass += p[order[keep++]];
  for (size_t i = keep; i < order.size(); ++i) p[order[i]] = 0;
  for (double& x : p) x /= mass;
  return p;
}

int32_t draw(const std::vector<double>& p, Rng& rng) {
  const double total = std::accumulate(p.begin(), p.end(), 0.0);
  GTRON_CHECK(total > 0, "draw from a distribution of total mass ", total);
  const double u = uniform(rng) * total;
  double acc = 0;
  int32_t last = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] <= 0) continue;
    acc += p[i];
    last = static_cast<int32_t>(i);
    if (u < acc) return last;
  }
  return last;  // u fell in the rounding gap at the top: the last token with mass
}

Verdict verify_draft(const std::vector<double>& p, const std::vector<double>& q, int32_t draft,
                     Rng& rng) {
  GTRON_CHECK(
      p.size() == q.size() && draft >= 0 && static_cast<size_t>(draft) < p.size() && q[draft] > 0,
      "verify_draft: draft ", draft, " over ", p.size(), " / ", q.size(), " tokens");
  if (uniform(rng) * q[draft] < p[draft]) return {true, draft};
  std::vector<double> residual(p.size());
  double mass = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    residual[i] = std::max(0.0, p[i] - q[i]);
    mass += residual[i];
  }
  // A rejection implies p[draft] < q[draft], hence mass > 0 in exact arithmetic; if rounding left
  // none, p and q agree to rounding and p itself is the right law.
  return {false, draw(mass > 0 ? residual : p, rng)};
}

}  // namespace gtron

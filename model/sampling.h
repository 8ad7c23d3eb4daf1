// Token choice for generation: greedy argmax, or sampling from softmax(logits / temperature) cut
// to the top-k tokens and the top-p nucleus; and the speculative-sampling rule that verifies a
// drafted token so that the output follows the main model's distribution exactly.
//
// Random numbers come from one std::mt19937_64 per batch row (row_rng), turned into doubles in
// [0, 1) by this file, never by std:: distributions (their algorithms differ between libraries),
// so a seed gives the same tokens everywhere.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <vector>

namespace gtron {

struct SamplingOptions {
  double temperature = 1.0;  // 0: greedy (argmax); top_k and top_p are then unused
  int64_t top_k = 0;         // keep the k most likely tokens (0: all)
  double top_p = 1.0;        // keep the smallest set of most likely tokens whose mass >= top_p
  bool greedy() const { return temperature <= 0; }
};

using Rng = std::mt19937_64;

// The random stream of batch row `row` for a run seeded with `seed` (rows get distinct streams).
Rng row_rng(uint64_t seed, int64_t row);
// A uniform double in [0, 1) (53 random bits).
double uniform(Rng& rng);

// The index of the largest of V logits (the lowest index among equal ones).
int32_t argmax(const float* logits, int64_t V);
// The distribution sampling draws from: softmax(logits / temperature) over the tokens that survive
// top-k (ties at the k-th value survive too) and then top-p, renormalized; 0 elsewhere.
// REQUIRES: !opts.greedy(), 0 < top_p <= 1.
std::vector<double> sampling_distribution(const float* logits, int64_t V,
                                          const SamplingOptions& opts);
// A token drawn from `p` (non-negative weights, positive sum) by inverse CDF.
int32_t draw(const std::vector<double>& p, Rng& rng);

// The verification of one drafted token against the main model.
struct Verdict {
  bool accepted = false;
  int32_t token = 0;  // the draft when accepted, else its replacement
};
// p: the main model's distribution at the draft's position, q: the distribution the draft was
// drawn from. Accepts with probability min(1, p[draft] / q[draft]); on rejection draws the
// replacement from the residual max(0, p − q), normalized. Whatever q is, the token that results
// (the draft or its replacement) is distributed as p.
using DraftVerifier = std::function<Verdict(const std::vector<double>& p,
                                            const std::vector<double>& q, int32_t draft, Rng& rng)>;
Verdict verify_draft(const std::vector<double>& p, const std::vector<double>& q, int32_t draft,
                     Rng& rng);

}  // namespace gtron

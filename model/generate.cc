#include "model/generate.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "model/decoder.h"
#include "model/stream.h"

namespace gtron {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Row {
  std::vector<int32_t> seq;  // prompt, then the new tokens
  int64_t target = 0;        // final length of seq
  Rng rng;
  std::vector<int64_t> stale;           // [D] first position of depth k+1 not yet valid
  std::vector<int32_t> drafts;          // this round's x̂_n, x̂_{n+1}, ...
  std::vector<std::vector<double>> qs;  // their distributions (sampling only)
  int64_t n() const { return static_cast<int64_t>(seq.size()); }
  int64_t wanted() const { return target - n(); }
};

void check_args(const GPT& model, const std::vector<std::vector<int32_t>>& prompts,
                const GenerateOptions& o) {
  const GPTConfig& c = model.config();
  GTRON_CHECK(!prompts.empty() && o.max_new_tokens >= 1, "generate: ", prompts.size(), " prompts, ",
              o.max_new_tokens, " new tokens");
  GTRON_CHECK(!o.speculative || c.mtp_depth >= 1, "speculative decoding needs MTP depths");
  GTRON_CHECK(o.sampling.top_p > 0 && o.sampling.top_p <= 1, "top_p ", o.sampling.top_p);
  for (const auto& p : prompts) {
    GTRON_CHECK(!p.empty() && static_cast<int64_t>(p.size()) + o.max_new_tokens <= c.context_length,
                "a prompt of ", p.size(), " tokens + ", o.max_new_tokens,
                " new tokens does not fit the context of ", c.context_length);
    for (int32_t id : p) GTRON_CHECK(id >= 0 && id < c.vocab_size, "token id ", id);
  }
}

int64_t longest(const std::vector<std::vector<int32_t>>& prompts) {
  size_t n = 0;
  for (const auto& p : prompts) n = std::max(n, p.size());
  return static_cast<int64_t>(n);
}

// The token chosen from one row of logits (greedy or a draw), and its distribution when drawn.
int32_t choose(const float* logits, int64_t V, const SamplingOptions& s, Rng& rng,
               std::vector<double>* dist = nullptr) {
  if (s.greedy()) return argmax(logits, V);
  std::vector<double> p = sampling_distribution(logits, V, s);
  const int32_t t = draw(p, rng);
  if (dist) *dist = std::move(p);
  return t;
}

class Generator {
 public:
  Generator(const GPT& model, const std::vector<std::vector<int32_t>>& prompts,
            const GenerateOptions& o)
      : o_(o),
        V_(model.config().vocab_size),
        D_(o.speculative ? model.config().mtp_depth : 0),
        dec_(model, static_cast<int64_t>(prompts.size()), o.speculative,
             longest(prompts) + o.max_new_tokens, o.graphs, o.dtype) {
    for (size_t b = 0; b < prompts.size(); ++b) {
      Row r;
      r.seq = prompts[b];
      r.target = r.n() + o.max_new_tokens;
      r.rng = row_rng(o.seed, static_cast<int64_t>(b));
      r.stale.assign(static_cast<size_t>(D_), 0);
      rows_.push_back(std::move(r));
    }
  }

  Generation run() {
    const Clock::time_point t0 = Clock::now();
    prefill();
    stats_.prefill_ms = 1e3 * seconds_since(t0);
    while (std::any_of(rows_.begin(), rows_.end(), [](const Row& r) { return r.wanted() > 0; })) {
      for (int k = 1; k <= D_; ++k) draft(k);
      verify();
    }
    stats_.seconds = seconds_since(t0);
    Generation g;
    for (const Row& r : rows_) {
      g.tokens.emplace_back(r.seq.end() - o_.max_new_tokens, r.seq.end());
      stats_.tokens += o_.max_new_tokens;
    }
    g.stats = stats_;
    return g;
  }

 private:
  WindowInput empty_input() const {
    WindowInput in;
    in.tokens.resize(rows_.size());
    in.start.assign(rows_.size(), 0);
    in.want.resize(rows_.size());
    return in;
  }

  bool greedy() const { return o_.sampling.greedy(); }

  // Drafts verified this round: m of Note [MTP self-speculative decoding].
  int64_t drafts_wanted(const Row& r) const { return std::min<int64_t>(D_, r.wanted() - 1); }

  void prefill() {
    WindowInput in = empty_input();
    for (size_t b = 0; b < rows_.size(); ++b) {
      in.tokens[b] = rows_[b].seq;
      in.want[b] = {rows_[b].n() - 1};
    }
    if (greedy()) {
      const std::vector<int32_t> ids = dec_.main_argmax(in);
      for (size_t b = 0; b < rows_.size(); ++b) rows_[b].seq.push_back(ids[b]);
      return;
    }
    const std::vector<float> logits = dec_.main(in);
    for (size_t b = 0; b < rows_.size(); ++b) {
      Row& r = rows_[b];
      r.seq.push_back(choose(&logits[b * V_], V_, o_.sampling, r.rng));
    }
  }

  // Depth k over positions stale[k-1] .. n-2 of every row that still wants k drafts.
  void draft(int k) {
    WindowInput in = empty_input();
    std::vector<size_t> drafting;
    for (size_t b = 0; b < rows_.size(); ++b) {
      Row& r = rows_[b];
      if (k == 1) {
        r.drafts.clear();
        r.qs.clear();
      }
      if (drafts_wanted(r) < k) continue;
      const int64_t first = r.stale[k - 1], last = r.n() - 2;
      in.start[b] = first;
      for (int64_t s = first; s <= last; ++s) {
        const int64_t t = s + k;  // the token k ahead: real, else an earlier depth's draft
        in.tokens[b].push_back(t < r.n() ? r.seq[t] : r.drafts[static_cast<size_t>(t - r.n())]);
      }
      in.want[b] = {last - first};
      r.stale[k - 1] = std::max<int64_t>(0, r.n() - k);
      drafting.push_back(b);
    }
    if (drafting.empty()) return;
    if (greedy()) {
      const std::vector<int32_t> ids = dec_.depth_argmax(k, in);
      for (size_t i = 0; i < drafting.size(); ++i) rows_[drafting[i]].drafts.push_back(ids[i]);
      return;
    }
    const std::vector<float> logits = dec_.depth(k, in);
    for (size_t i = 0; i < drafting.size(); ++i) {
      Row& r = rows_[drafting[i]];
      std::vector<double> q;
      r.drafts.push_back(choose(&logits[i * V_], V_, o_.sampling, r.rng, &q));
      if (!o_.sampling.greedy()) r.qs.push_back(std::move(q));
    }
  }

  void verify() {
    WindowInput in = empty_input();
    std::vector<size_t> active;
    for (size_t b = 0; b < rows_.size(); ++b) {
      const Row& r = rows_[b];
      if (r.wanted() <= 0) continue;
      const int64_t m = drafts_wanted(r);
      in.start[b] = r.n() - 1;
      in.tokens[b] = {r.seq.back()};
      in.tokens[b].insert(in.tokens[b].end(), r.drafts.begin(), r.drafts.begin() + m);
      for (int64_t i = 0; i <= m; ++i) in.want[b].push_back(i);
      active.push_back(b);
    }
    size_t offset = 0;
    if (greedy()) {
      const std::vector<int32_t> best = dec_.main_argmax(in);
      for (size_t b : active) {
        const int64_t m = static_cast<int64_t>(in.tokens[b].size()) - 1;
        accept_greedy(rows_[b], &best[offset], m);
        offset += static_cast<size_t>(m + 1);
      }
      return;
    }
    const std::vector<float> logits = dec_.main(in);
    for (size_t b : active) {
      const int64_t m = static_cast<int64_t>(in.tokens[b].size()) - 1;
      accept(rows_[b], &logits[offset * V_], m);
      offset += static_cast<size_t>(m + 1);
    }
  }

  // Greedy: best holds the main model's argmax at slots 0..m; a draft agrees when it equals the
  // argmax of the slot before it.
  void accept_greedy(Row& r, const int32_t* best, int64_t m) {
    int64_t j = 0;
    while (j < m && r.drafts[static_cast<size_t>(j)] == best[j]) r.seq.push_back(best[j++]);
    r.seq.push_back(best[j]);
    stats_.proposed += m;
    stats_.accepted += j;
  }

  // Sampling: p holds m + 1 rows of main logits, slot i judging draft i (the last one judges
  // nothing).
  void accept(Row& r, const float* p, int64_t m) {
    const SamplingOptions& s = o_.sampling;
    int64_t j = 0;
    int32_t next = -1;  // the token after the accepted drafts, once known
    while (j < m) {
      const int32_t d = r.drafts[static_cast<size_t>(j)];
      const Verdict v = o_.verify(sampling_distribution(p + j * V_, V_, s), r.qs[j], d, r.rng);
      if (!v.accepted) next = v.token;
      if (next >= 0) break;
      r.seq.push_back(d);
      ++j;
    }
    if (next < 0) next = choose(p + m * V_, V_, s, r.rng);
    r.seq.push_back(next);
    stats_.proposed += m;
    stats_.accepted += j;
  }

  GenerateOptions o_;
  int64_t V_;
  int D_;
  Decoder dec_;
  std::vector<Row> rows_;
  GenerateStats stats_;
};

}  // namespace

std::string GenerateStats::json() const {
  char acceptance[32] = "null";
  if (proposed > 0) {
    std::snprintf(acceptance, sizeof(acceptance), "%.4f",
                  static_cast<double>(accepted) / static_cast<double>(proposed));
  }
  char buf[256];
  std::snprintf(
      buf, sizeof(buf),
      "{\"tokens\": %ld, \"tokens_per_s\": %.2f, \"prefill_ms\": %.3f, \"proposed\": %ld, "
      "\"accepted\": %ld, \"acceptance\": %s}",
      static_cast<long>(tokens), seconds > 0 ? static_cast<double>(tokens) / seconds : 0.0,
      prefill_ms, static_cast<long>(proposed), static_cast<long>(accepted), acceptance);
  return buf;
}

Generation generate(const GPT& model, const std::vector<std::vector<int32_t>>& prompts,
                    const GenerateOptions& opts) {
  check_args(model, prompts, opts);
  return Generator(model, prompts, opts).run();
}

Generation generate_recompute(GPT& model, const std::vector<std::vector<int32_t>>& prompts,
                              const GenerateOptions& opts) {
  check_args(model, prompts, opts);
  GTRON_CHECK(!opts.speculative, "the recomputation path does not speculate");
  GTRON_CHECK(opts.dtype != DType::kBF16, "the recomputation path runs the model's own dtype");
  const auto B = static_cast<int64_t>(prompts.size());
  for (const auto& p : prompts) GTRON_CHECK(p.size() == prompts[0].size(), "ragged prompts");
  const int64_t V = model.config().vocab_size, Vp = model.config().padded_vocab();
  std::vector<Rng> rngs;
  for (int64_t b = 0; b < B; ++b) rngs.push_back(row_rng(opts.seed, b));
  std::vector<std::vector<int32_t>> seqs = prompts;
  Generation g;
  g.tokens.resize(static_cast<size_t>(B));
  // On a GPU every step copies all its logits into one host buffer sized for the last step (a
  // fresh host tensor per step would leave a cached block of each size behind: about 200 GB over
  // 256 steps at batch 16 for GPT-2's vocabulary).
  const int64_t Tlast = static_cast<int64_t>(prompts[0].size()) + opts.max_new_tokens - 1;
  Tensor host;
  if (!model.token_embedding().data.device().is_cpu()) {
    host = Tensor::empty({B * Tlast, Vp}, DType::kF32, Device::cpu());
  }
  const Clock::time_point t0 = Clock::now();
  for (int64_t step = 0; step < opts.max_new_tokens; ++step) {
    const auto T = static_cast<int64_t>(seqs[0].size());
    std::vector<int32_t> flat;
    for (const auto& s : seqs) flat.insert(flat.end(), s.begin(), s.end());
    Tensor logits = model.logits(Tensor::from_ints(flat, {B, T}));
    if (!logits.device().is_cpu()) {
      Tensor dst = host.rows(0, B * T);
      dst.copy_from(logits.view({B * T, Vp}));
      current_stream(logits.device()).synchronize();
      logits = dst;
    }
    if (logits.dtype() != DType::kF32) logits = logits.to(DType::kF32);  // an f64 CPU model
    const float* all = logits.data<float>();
    for (int64_t b = 0; b < B; ++b) {
      const int32_t t = choose(all + (b * T + T - 1) * Vp, V, opts.sampling, rngs[b]);
      seqs[b].push_back(t);
      g.tokens[b].push_back(t);
    }
    if (step == 0) g.stats.prefill_ms = 1e3 * seconds_since(t0);
  }
  g.stats.seconds = seconds_since(t0);
  g.stats.tokens = B * opts.max_new_tokens;
  return g;
}

}  // namespace gtron

// Helpers of the decoding tests (generate_test, generate_llama_test, generate_cuda_test,
// generate_llama_cuda_test): windows fed in ragged chunks, full-forward reference logits, seeded
// token rows and test inputs, a history of graphed and eager greedy steps.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "model/decoder.h"
#include "model/ops/embedding.h"
#include "model/ops/linear.h"

namespace gtron::testing {

// n values in [-1, 1) from a seeded LCG (inputs of the kernel tests).
inline std::vector<double> pseudo_random(int64_t n, uint64_t seed) {
  std::vector<double> v(static_cast<size_t>(n));
  for (auto& x : v) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<double>(seed >> 40) / static_cast<double>(1ull << 24) * 2 - 1;
  }
  return v;
}

inline double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

// n token ids in [0, V) from a seeded LCG.
inline std::vector<int32_t> tokens_of(int64_t n, uint64_t seed, int64_t V) {
  std::vector<int32_t> t;
  for (int64_t i = 0; i < n; ++i) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    t.push_back(static_cast<int32_t>((seed >> 33) % static_cast<uint64_t>(V)));
  }
  return t;
}

// Full-forward logits [T][V] of depth k (0: the main model) over one sequence of a llama-family
// model (no position table), composed from the modules the way GPT::forward does.
inline std::vector<std::vector<double>> llama_reference_logits(GPT& m,
                                                               const std::vector<int32_t>& seq,
                                                               int k) {
  NoGradGuard no_grad;
  const auto T = static_cast<int64_t>(seq.size());
  auto shifted = [&](int s) {
    std::vector<int32_t> ids(seq.size(), 0);
    for (int64_t t = 0; t + s < T; ++t) ids[t] = seq[t + s];
    return Tensor::from_ints(ids, {1, T});
  };
  Var table = Var::param(m.token_embedding());
  Var h = embedding(shifted(0), table);
  for (int l = 0; l < m.num_blocks(); ++l) h = m.block_forward(l, h);
  DirectWeights direct;
  for (int d = 1; d <= k; ++d) h = m.mtp_module(d).forward(h, embedding(shifted(d), table), direct);
  Var logits = linear(m.final_norm_forward(h), Var::param(m.output_head()), Var());
  const std::vector<double> all = logits.value().to_vector();
  const int64_t V = m.config().vocab_size, Vp = m.config().padded_vocab();
  std::vector<std::vector<double>> rows(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) rows[t].assign(all.begin() + t * Vp, all.begin() + t * Vp + V);
  return rows;
}

// Feeds row b's positions [0, n_b) in chunks of the sizes in plan[b] (cycled), all rows in the
// same windows, wanting every slot; returns each row's logits by position (the element type of
// what `run(in)` returns: Decoder::main, main_f64, depth, ...).
template <typename Run,
          typename F = typename std::invoke_result_t<Run, const WindowInput&>::value_type>
std::vector<std::vector<std::vector<F>>> incremental_logits(
    const std::vector<std::vector<int32_t>>& tokens, const std::vector<std::vector<int64_t>>& plan,
    int64_t V, Run run) {
  const size_t B = tokens.size();
  std::vector<int64_t> pos(B, 0);
  std::vector<size_t> step(B, 0);
  std::vector<std::vector<std::vector<F>>> out(B);
  while (true) {
    WindowInput in;
    in.tokens.resize(B);
    in.start = pos;
    in.want.resize(B);
    bool any = false;
    for (size_t b = 0; b < B; ++b) {
      const auto n = static_cast<int64_t>(tokens[b].size());
      const int64_t chunk = std::min(plan[b][step[b]++ % plan[b].size()], n - pos[b]);
      for (int64_t i = 0; i < chunk; ++i) {
        in.tokens[b].push_back(tokens[b][pos[b] + i]);
        in.want[b].push_back(i);
      }
      any = any || chunk > 0;
    }
    if (!any) break;
    const std::vector<F> logits = run(in);
    size_t r = 0;
    for (size_t b = 0; b < B; ++b) {
      for (size_t i = 0; i < in.tokens[b].size(); ++i, ++r) {
        out[b].emplace_back(logits.begin() + r * V, logits.begin() + (r + 1) * V);
      }
      pos[b] += static_cast<int64_t>(in.tokens[b].size());
    }
  }
  return out;
}

// One history of greedy windows over B = 3 rows fed to two decoders of one model (made with
// keep_hidden, D >= 2), one replaying graphs and one eager (generate_cuda_test,
// generate_llama_cuda_test): a prefill (eager in both: it wants only the last slots), single
// slots, a ragged verify window with a row sitting out, both depths (ragged, a row out), a graph
// replayed at rolled-back positions, and a want pattern no graph covers. Returns each step's
// (graphed, eager) tokens; the graphed decoder captures (main, 1), (main, 4), (depth 1, 4),
// (depth 2, 2) and (depth 1, 2): 5 graphs. Tokens < 25.
struct GraphStepTokens {
  std::vector<int32_t> graphed, eager;
  size_t wanted = 0;  // slots the step asked for
};
inline std::vector<GraphStepTokens> graph_and_eager_steps(Decoder& graphed, Decoder& eager) {
  struct Step {
    int module;  // 0: main, k: depth k
    WindowInput in;
  };
  const std::vector<Step> steps = {
      {0, {{{1, 2, 3, 4, 5, 6}, {7, 8, 9}, {10, 11, 12, 13}}, {0, 0, 0}, {{5}, {2}, {3}}}},
      {0, {{{14}, {15}, {16}}, {6, 3, 4}, {{0}, {0}, {0}}}},
      {0, {{{5, 6, 7}, {8}, {}}, {7, 4, 0}, {{0, 1, 2}, {0}, {}}}},
      {1, {{{2, 3, 4, 5}, {8, 9}, {11, 12, 13}}, {0, 0, 0}, {{3}, {1}, {2}}}},
      {2, {{{3, 4}, {9}, {}}, {0, 0, 0}, {{1}, {0}, {}}}},
      {0, {{{1}, {2}, {3}}, {8, 5, 5}, {{0}, {0}, {0}}}},
      {1, {{{20, 21}, {22, 23}, {24}}, {3, 1, 2}, {{1}, {1}, {0}}}},
      {0, {{{17, 18}, {19}, {20}}, {9, 6, 6}, {{1}, {0}, {0}}}},
  };
  std::vector<GraphStepTokens> out;
  for (const Step& st : steps) {
    GraphStepTokens t;
    t.graphed =
        st.module == 0 ? graphed.main_argmax(st.in) : graphed.depth_argmax(st.module, st.in);
    t.eager = st.module == 0 ? eager.main_argmax(st.in) : eager.depth_argmax(st.module, st.in);
    for (const auto& w : st.in.want) t.wanted += w.size();
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace gtron::testing

// `gtron sample` on a mixture-of-experts checkpoint (issue 50 item 5): a tiny Qwen3-MoE-like model
// (softmax router, top 2 of 4 experts, norm_topk_prob false, a dense first layer, q/k norms, MTP
// D = 1) trained for a few steps from the CLI. Greedy decoding with the KV cache (the decoder runs
// each block's MoE MLP over the new positions only) gives the ids of uncached decoding: each new
// token the argmax of `gtron logits` over the whole sequence so far, the full forward recomputed
// from position 0 at every step. --recompute and --speculative give the same ids too.
#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>

#include "tests/trainer/cli_util.h"
#include "trainer/io/safetensors.h"

namespace gtron {
namespace {

using testing::CmdResult;
using testing::run_command;
using testing::run_gtron;
using testing::temp_dir;
using testing::train_checkpoint;

// init_std 0.3: peaked logits, so greedy choices sit far from ties.
const char kConfig[] = R"({
  "model": {"arch": "llama", "vocab_size": 40, "context_length": 32, "n_layer": 2, "n_head": 4,
            "n_kv_head": 2, "n_embd": 16, "head_dim": 6, "intermediate_size": 24,
            "qk_norm": true, "rope_theta": 10000, "init_std": 0.3,
            "moe": {"num_experts": 4, "top_k": 2, "expert_intermediate_size": 8,
                    "first_dense_layers": 1, "norm_topk_prob": false}},
  "mtp": {"depth": 1},
  "data": {"synthetic": {"vocab": 40, "tokens": 20000, "val_tokens": 2000}},
  "train": {"steps": 3, "global_batch": 4, "micro_batch": 2, "seq_len": 16, "device": "cpu",
            "eval_batches": 1},
  "log": {"every": 3}
})";
constexpr int kNew = 10;  // new tokens per run
constexpr int64_t V = 40;

// The ids `gtron sample --print-ids` printed (its first stdout line), as a list.
std::vector<int> ids_of(const std::string& output) {
  std::vector<int> ids;
  std::istringstream line(output.substr(0, output.find('\n')));
  for (std::string w; std::getline(line, w, ',');) ids.push_back(std::stoi(w));
  return ids;
}

std::vector<int> sample_greedy(const std::string& ckpt, const std::string& dir,
                               const std::vector<std::string>& extra) {
  std::string cmd = "trainer/gtron sample --checkpoint '" + ckpt +
                    "' --prompt-ids 5,1,2 --tokens " + std::to_string(kNew) +
                    " --temperature 0 --print-ids";
  for (const std::string& e : extra) cmd += " " + e;
  const CmdResult r = run_command(cmd + " 2>'" + dir + "/stderr.txt'");
  EXPECT_EQ(r.exit_code, 0) << cmd << "\n" << r.output << testing::read_text(dir + "/stderr.txt");
  return ids_of(r.output);
}

TEST(SampleMoeCli, CachedGreedyEqualsUncachedFullSequenceArgmax) {
  const std::string dir = temp_dir("sample_moe_cli");
  const std::string ckpt = train_checkpoint(kConfig, dir, "run", {}, 3);

  const std::vector<int> cached = sample_greedy(ckpt, dir, {});
  ASSERT_EQ(cached.size(), 3u + kNew);
  EXPECT_EQ(std::vector<int>(cached.begin(), cached.begin() + 3), (std::vector<int>{5, 1, 2}));

  // Uncached: the whole sequence through the training forward for every new token.
  std::vector<int> seq = {5, 1, 2};
  double smallest_gap = 1e30;  // between the best and second-best logit of a step
  for (int step = 0; step < kNew; ++step) {
    std::string row;
    for (int t : seq) row += (row.empty() ? "" : ",") + std::to_string(t);
    const std::string out = dir + "/logits_" + std::to_string(step) + ".safetensors";
    const CmdResult r = run_gtron({"logits", "--checkpoint", ckpt, "--tokens", row, "--out", out});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::vector<double> all = read_safetensors(out).tensors.at(1).tensor.to_vector();
    ASSERT_EQ(all.size(), seq.size() * V);
    std::vector<double> last(all.end() - V, all.end());
    const auto best = std::max_element(last.begin(), last.end());
    const int id = static_cast<int>(best - last.begin());
    const double top = *best;
    *best = -1e30;
    smallest_gap = std::min(smallest_gap, top - *std::max_element(last.begin(), last.end()));
    seq.push_back(id);
  }
  EXPECT_EQ(cached, seq) << "cached greedy decoding differs from the full forward's argmax";
  EXPECT_GT(smallest_gap, 1e-4) << "a near tie makes this comparison fragile";
  std::printf("10 greedy tokens; smallest top-2 logit gap %.3g\n", smallest_gap);

  EXPECT_EQ(sample_greedy(ckpt, dir, {"--recompute"}), cached);
  EXPECT_EQ(sample_greedy(ckpt, dir, {"--speculative"}), cached);
}

}  // namespace
}  // namespace gtron

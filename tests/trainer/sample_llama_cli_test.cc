// `gtron sample` on a llama-family checkpoint (issue 27 item 3): a tiny Qwen3-like model (GQA,
// q/k norms with a head size that is not C / NH, MTP D = 2) trained for a few steps from the CLI
// decodes greedily to the same ids with the cache, with --speculative and with --recompute;
// sampling with one seed repeats its output; --no-graphs decodes the same; --dtype is checked.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tests/trainer/cli_util.h"

namespace gtron {
namespace {

using testing::run_command;
using testing::run_gtron;
using testing::temp_dir;
using testing::write_text;

const char kConfig[] = R"({
  "model": {"arch": "llama", "vocab_size": 32, "context_length": 32, "n_layer": 2, "n_head": 4,
            "n_kv_head": 2, "n_embd": 16, "head_dim": 6, "intermediate_size": 24,
            "qk_norm": true, "rope_theta": 10000},
  "mtp": {"depth": 2},
  "data": {"synthetic": {"vocab": 32, "tokens": 20000, "val_tokens": 2000}},
  "train": {"steps": 4, "global_batch": 4, "micro_batch": 2, "seq_len": 16, "device": "cpu"},
  "log": {"every": 4}
})";

struct Sampled {
  int exit_code = -1;
  std::vector<std::string> lines;  // stdout
  std::string err;                 // stderr
};

class SampleLlamaCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = temp_dir("sample_llama_cli");
    write_text(dir_ + "/c.json", kConfig);
    auto r = run_gtron({"train", "--config", dir_ + "/c.json", "--out", dir_ + "/run"});
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }

  // Runs `gtron sample --checkpoint <the model> ARGS`, keeping stdout and stderr apart.
  static Sampled sample(const std::vector<std::string>& args) {
    std::string cmd =
        "(trainer/gtron sample --checkpoint '" + dir_ + "/run/checkpoints/step_00000004'";
    for (const std::string& a : args) cmd += " '" + a + "'";
    const std::string err_file = dir_ + "/stderr.txt";
    cmd += " 2>'" + err_file + "')";
    auto r = run_command(cmd);
    Sampled s;
    s.exit_code = r.exit_code;
    std::istringstream lines(r.output);
    for (std::string line; std::getline(lines, line);) s.lines.push_back(line);
    std::ifstream f(err_file);
    s.err.assign(std::istreambuf_iterator<char>(f), {});
    return s;
  }

  static std::string dir_;
};

std::string SampleLlamaCli::dir_;

TEST_F(SampleLlamaCli, GreedyIdsAreTheSameCachedSpeculativeAndRecomputed) {
  const std::vector<std::string> base = {"--prompt-ids", "1,2,3",         "--tokens",
                                         "20",           "--temperature", "0",
                                         "--print-ids",  "--batch",       "2"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = base;
    a.insert(a.end(), extra.begin(), extra.end());
    return sample(a);
  };
  const Sampled cached = with({});
  ASSERT_EQ(cached.exit_code, 0) << cached.err;
  ASSERT_EQ(cached.lines.size(), 2u);
  EXPECT_EQ(cached.lines[0].rfind("1,2,3,", 0), 0u) << cached.lines[0];
  EXPECT_EQ(std::count(cached.lines[0].begin(), cached.lines[0].end(), ','), 22);
  EXPECT_EQ(cached.lines[0], cached.lines[1]) << "greedy rows of one prompt agree";
  EXPECT_EQ(nlohmann::json::parse(cached.err)["proposed"], 0);

  const Sampled spec = with({"--speculative"});
  ASSERT_EQ(spec.exit_code, 0) << spec.err;
  EXPECT_EQ(spec.lines, cached.lines);
  EXPECT_GT(nlohmann::json::parse(spec.err)["proposed"].get<int>(), 0);

  const Sampled full = with({"--recompute"});
  ASSERT_EQ(full.exit_code, 0) << full.err;
  EXPECT_EQ(full.lines, cached.lines);
}

TEST_F(SampleLlamaCli, SamplingWithOneSeedRepeats) {
  for (const char* extra : {"--top-k=0", "--speculative"}) {
    const std::vector<std::string> args = {"--prompt-ids", "4,5", "--tokens", "24",
                                           "--batch",      "3",   "--seed",   "9",
                                           "--print-ids",  extra};
    const Sampled a = sample(args);
    ASSERT_EQ(a.exit_code, 0) << extra << ": " << a.err;
    ASSERT_EQ(a.lines.size(), 3u);
    EXPECT_FALSE(a.lines[0] == a.lines[1] && a.lines[1] == a.lines[2]) << a.lines[0];
    const Sampled b = sample(args);
    ASSERT_EQ(b.exit_code, 0) << b.err;
    EXPECT_EQ(b.lines, a.lines) << extra;
  }
}

// --no-graphs is accepted (on the CPU there are no graphs to turn off: the same ids); --dtype
// bf16 needs the GPU, and an unknown --dtype is refused, each with code 2 naming the flag.
TEST_F(SampleLlamaCli, NoGraphsDecodesTheSameAndDtypesAreChecked) {
  const std::vector<std::string> base = {"--prompt-ids", "1,2",           "--tokens", "4",
                                         "--print-ids",  "--temperature", "0"};
  const Sampled plain = sample(base);
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  std::vector<std::string> args = base;
  args.push_back("--no-graphs");
  const Sampled eager = sample(args);
  ASSERT_EQ(eager.exit_code, 0) << eager.err;
  EXPECT_EQ(eager.lines, plain.lines);
  for (const char* dtype : {"bf16", "f16"}) {
    args = base;
    args.insert(args.end(), {"--dtype", dtype});
    const Sampled s = sample(args);
    EXPECT_EQ(s.exit_code, 2) << dtype;
    EXPECT_NE(s.err.find("--dtype"), std::string::npos) << s.err;
    EXPECT_NE(s.err.find(std::string(dtype) == "bf16" ? "--device cuda" : "f32 or bf16"),
              std::string::npos)
        << s.err;
    EXPECT_TRUE(s.lines.empty());
  }
}

}  // namespace
}  // namespace gtron

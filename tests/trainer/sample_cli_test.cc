// `gtron sample` as a user meets it (issue 14): ids in and out, --batch, greedy decoding that is
// the same with the cache, with --speculative and with --recompute, the stats line on stderr, and
// bad inputs (acceptance 5) that each exit with code 2 and name the flag.
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

// Byte-level (vocab 256, trained on the 64-token synthetic source) so that text works too.
const char kConfig[] = R"({
  "model": {"vocab_size": 256, "context_length": 16, "n_layer": 1, "n_head": 2, "n_embd": 16},
  "mtp": {"depth": 1},
  "data": {"synthetic": {"tokens": 20000, "val_tokens": 2000}},
  "train": {"steps": 4, "global_batch": 4, "micro_batch": 2, "seq_len": 16, "device": "cpu"},
  "log": {"every": 4}
})";

struct Sampled {
  int exit_code = -1;
  std::vector<std::string> lines;  // stdout
  std::string err;                 // stderr
};

class SampleCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = temp_dir("sample_cli");
    write_text(dir_ + "/c.json", kConfig);
    for (const char* depth : {"1", "0"}) {
      const std::string out = dir_ + "/d" + depth;
      auto r = run_gtron({"train", "--config", dir_ + "/c.json", "--out", out, "--set",
                          std::string("mtp.depth=") + depth});
      ASSERT_EQ(r.exit_code, 0) << r.output;
    }
  }
  static std::string ckpt(int depth) {
    return dir_ + "/d" + std::to_string(depth) + "/checkpoints/step_00000004";
  }

  // Runs `gtron sample --checkpoint <D=1 model> ARGS`, keeping stdout and stderr apart.
  static Sampled sample(const std::vector<std::string>& args, int depth = 1) {
    std::string cmd = "(trainer/gtron sample --checkpoint '" + ckpt(depth) + "'";
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

std::string SampleCli::dir_;

TEST_F(SampleCli, GreedyIdsAreTheSameCachedSpeculativeAndRecomputed) {
  const std::vector<std::string> base = {"--prompt-ids",  "1,2,3", "--tokens",   "12",
                                         "--temperature", "0",     "--print-ids"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = base;
    a.insert(a.end(), extra.begin(), extra.end());
    return sample(a);
  };
  const Sampled cached = with({});
  ASSERT_EQ(cached.exit_code, 0) << cached.err;
  ASSERT_EQ(cached.lines.size(), 1u);
  EXPECT_EQ(cached.lines[0].rfind("1,2,3,", 0), 0u) << cached.lines[0];
  EXPECT_EQ(std::count(cached.lines[0].begin(), cached.lines[0].end(), ','), 14);
  const auto stats = nlohmann::json::parse(cached.err);
  EXPECT_EQ(stats["tokens"], 12);
  EXPECT_GT(stats["tokens_per_s"].get<double>(), 0);
  EXPECT_GE(stats["prefill_ms"].get<double>(), 0);
  EXPECT_EQ(stats["proposed"], 0);
  EXPECT_TRUE(stats["acceptance"].is_null());

  const Sampled spec = with({"--speculative"});
  ASSERT_EQ(spec.exit_code, 0) << spec.err;
  EXPECT_EQ(spec.lines, cached.lines);
  const auto spec_stats = nlohmann::json::parse(spec.err);
  EXPECT_GT(spec_stats["proposed"].get<int>(), 0);
  EXPECT_NEAR(spec_stats["acceptance"].get<double>(),
              spec_stats["accepted"].get<double>() / spec_stats["proposed"].get<double>(), 1e-4);

  const Sampled full = with({"--recompute"});
  ASSERT_EQ(full.exit_code, 0) << full.err;
  EXPECT_EQ(full.lines, cached.lines);

  // --warmup discards its own generation: one output row and one stats line of 12 tokens, the
  // same ids; --no-graphs changes nothing on the CPU.
  for (const char* flag : {"--warmup", "--no-graphs"}) {
    const Sampled other = with({flag, "--speculative"});
    ASSERT_EQ(other.exit_code, 0) << flag << ": " << other.err;
    EXPECT_EQ(other.lines, cached.lines) << flag;
    EXPECT_EQ(nlohmann::json::parse(other.err)["tokens"], 12) << flag;
  }
}

TEST_F(SampleCli, BatchRowsUseDistinctSeedStreams) {
  const Sampled s = sample({"--prompt-ids", "5,6", "--tokens", "10", "--batch", "3", "--seed", "4",
                            "--print-ids", "--speculative"});
  ASSERT_EQ(s.exit_code, 0) << s.err;
  ASSERT_EQ(s.lines.size(), 3u);
  EXPECT_FALSE(s.lines[0] == s.lines[1] && s.lines[1] == s.lines[2]) << s.lines[0];
  EXPECT_EQ(nlohmann::json::parse(s.err)["tokens"], 30);
  const Sampled again = sample({"--prompt-ids", "5,6", "--tokens", "10", "--batch", "3", "--seed",
                                "4", "--print-ids", "--speculative"});
  EXPECT_EQ(again.lines, s.lines);
}

TEST_F(SampleCli, TextInTextOut) {
  const Sampled s = sample({"--prompt", "ab", "--tokens", "5", "--top-p", "0.9"});
  ASSERT_EQ(s.exit_code, 0) << s.err;
  ASSERT_FALSE(s.lines.empty());
  EXPECT_EQ(s.lines[0].rfind("ab", 0), 0u);
}

TEST_F(SampleCli, BadInputsNameTheFlag) {
  struct Bad {
    std::vector<std::string> args;
    std::string expect;
    int depth = 1;
  };
  const std::vector<Bad> cases = {
      {{}, "--prompt"},
      {{"--prompt", ""}, "--prompt"},
      {{"--prompt-ids", ""}, "--prompt-ids"},
      {{"--prompt-ids", "1,x"}, "--prompt-ids"},
      {{"--prompt-ids", "1,2,256"}, "--prompt-ids: id 256"},
      {{"--prompt-ids", "-1"}, "--prompt-ids"},
      {{"--prompt", "a", "--prompt-ids", "1"}, "--prompt-ids"},
      {{"--prompt-ids", "1,2,3", "--tokens", "14"}, "--tokens 14"},
      {{"--prompt-ids", "1", "--tokens", "4", "--speculative"}, "--speculative", 0},
      {{"--prompt-ids", "1", "--tokens", "4", "--temperature", "0", "--top-p", "0.9"}, "--top-p"},
      {{"--prompt-ids", "1", "--tokens", "4", "--top-p", "1.5"}, "--top-p"},
      {{"--prompt-ids", "1", "--tokens", "4", "--top-p", "0"}, "--top-p"},
      {{"--prompt-ids", "1", "--tokens", "4", "--batch", "0"}, "--batch"},
      {{"--prompt-ids", "1", "--tokens", "4", "--speculative", "--recompute"}, "--recompute"},
      {{"--prompt-ids", "1", "--tokens", "4", "--device", "tpu"}, "--device"},
  };
  for (const Bad& c : cases) {
    const Sampled s = sample(c.args, c.depth);
    std::string all = s.err;
    for (const std::string& l : s.lines) all += l + "\n";
    EXPECT_EQ(s.exit_code, 2) << c.expect << ":\n" << all;
    EXPECT_NE(all.find(c.expect), std::string::npos) << "expected '" << c.expect << "' in:\n"
                                                     << all;
  }
}

}  // namespace
}  // namespace gtron

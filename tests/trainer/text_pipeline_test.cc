// Raw text to samples through a BPE tokenizer, as docs/data-and-tokenizers.md runs it: tokenizer
// train, prepare, train, eval, sample. The checkpoint carries the tokenizer; a too-small model
// vocab is refused.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "tests/trainer/cli_util.h"

namespace gtron {
namespace {

using testing::run_gtron;
using testing::sample_text_of;

const char kConfig[] = R"({
  "model": {"vocab_size": 320, "context_length": 32, "n_layer": 1, "n_head": 2, "n_embd": 16},
  "mtp": {"depth": 1},
  "train": {"steps": 4, "global_batch": 4, "micro_batch": 2, "seq_len": 32, "device": "cpu"},
  "log": {"every": 1}
})";

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(TextPipeline, TokenizerPrepareTrainEvalSample) {
  const std::string dir = testing::temp_dir("text_pipeline");
  std::string text;
  const char* words[] = {"apple", "banana", "cherry", "date", "elder", "fig", "grape"};
  for (int i = 0; i < 300; ++i) {
    text += std::string("The ") + words[i % 7] + " and the " + words[(i * 3) % 7] + " met " +
            std::to_string(i) + " times.\n%\n";
  }
  testing::write_text(dir + "/corpus.txt", text);
  testing::write_text(dir + "/config.json", kConfig);
  const std::string tok = dir + "/tok/tokenizer.json", data = dir + "/data";  // tok/ is created

  auto t = run_gtron({"tokenizer", "train", "--text", dir + "/corpus.txt", "--doc-separator", "%",
                      "--val-fraction", "0.1", "--vocab-size", "300", "--special", "<|endoftext|>",
                      "--out", tok});
  ASSERT_EQ(t.exit_code, 0) << t.output;
  EXPECT_NE(t.output.find("\"train_documents\":270"), std::string::npos) << t.output;
  auto p = run_gtron({"prepare", "--text", dir + "/corpus.txt", "--doc-separator", "%",
                      "--tokenizer", tok, "--val-fraction", "0.1", "--out", data});
  ASSERT_EQ(p.exit_code, 0) << p.output;

  const std::vector<std::string> sets = {"--set", "data.train=" + data + "/train_*.bin", "--set",
                                         "data.val=" + data + "/val_*.bin"};
  std::vector<std::string> small = {"train",        "--config", dir + "/config.json",  "--out",
                                    dir + "/small", "--set",    "model.vocab_size=256"};
  small.insert(small.end(), sets.begin(), sets.end());
  auto refused = run_gtron(small);
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("model.vocab_size 256 is below the 300 tokens"), std::string::npos)
      << refused.output;

  std::vector<std::string> train = {"train", "--config", dir + "/config.json", "--out",
                                    dir + "/run"};
  train.insert(train.end(), sets.begin(), sets.end());
  auto r = run_gtron(train);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("bits/byte"), std::string::npos) << r.output;
  const std::string ckpt = dir + "/run/checkpoints/step_00000004";
  EXPECT_EQ(read_all(ckpt + "/tokenizer.json"), read_all(tok));
  EXPECT_NE(read_all(ckpt + "/MANIFEST.json").find("tokenizer.json"), std::string::npos);

  std::vector<std::string> eval = {"eval", "--config", dir + "/config.json", "--checkpoint", ckpt};
  eval.insert(eval.end(), sets.begin(), sets.end());
  auto e = run_gtron(eval);
  ASSERT_EQ(e.exit_code, 0) << e.output;
  EXPECT_NE(e.output.find("\"val_bits_per_byte\": "), std::string::npos) << e.output;

  auto s = run_gtron(
      {"sample", "--checkpoint", ckpt, "--prompt", "The apple", "--tokens", "12", "--seed", "5"});
  ASSERT_EQ(s.exit_code, 0) << s.output;
  EXPECT_EQ(s.output.rfind("The apple", 0), 0u) << s.output;
  EXPECT_GT(s.output.size(), std::string("The apple\n").size() + 6) << s.output;
  auto again = run_gtron(
      {"sample", "--checkpoint", ckpt, "--prompt", "The apple", "--tokens", "12", "--seed", "5"});
  EXPECT_NE(s.output.find("{\"tokens\": 12, "), std::string::npos) << s.output;
  EXPECT_EQ(sample_text_of(again.output), sample_text_of(s.output))
      << "sampling with one seed is deterministic";
}

}  // namespace
}  // namespace gtron

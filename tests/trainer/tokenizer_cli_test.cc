// `gtron tokenizer train/encode` as a user runs them: byte-identical reruns, bad inputs exit 2.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "tests/trainer/cli_util.h"

namespace gtron {
namespace {

using testing::run_gtron;

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class TokenizerCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::temp_dir("tokenizer_cli");
    std::string text;
    for (int i = 0; i < 30; ++i) {
      text += "Fortune " + std::to_string(i) + ": a penny saved is a penny earned.\n%\n";
    }
    corpus_ = dir_ + "/corpus.txt";
    testing::write_text(corpus_, text);
  }

  // Runs gtron; expects exit code 2 and `needle` in the message.
  void expect_user_error(const std::vector<std::string>& args, const std::string& needle) {
    auto r = run_gtron(args);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(needle), std::string::npos) << "wanted '" << needle << "' in\n"
                                                        << r.output;
  }

  std::string dir_, corpus_;
};

TEST_F(TokenizerCli, TrainingIsByteForByteDeterministic) {
  const std::vector<std::string> base = {"tokenizer",    "train", "--text",    corpus_,
                                         "--vocab-size", "270",   "--special", "<|endoftext|>"};
  auto args_a = base, args_b = base;
  args_a.insert(args_a.end(), {"--out", dir_ + "/a.json"});
  args_b.insert(args_b.end(), {"--out", dir_ + "/b.json"});
  auto a = run_gtron(args_a);
  auto b = run_gtron(args_b);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_NE(a.output.find("\"vocab_size\":270"), std::string::npos) << a.output;
  const std::string json = read_all(dir_ + "/a.json");
  EXPECT_GT(json.size(), 1000u);
  EXPECT_EQ(json, read_all(dir_ + "/b.json"));

  auto enc = run_gtron({"tokenizer", "encode", "--tokenizer", dir_ + "/a.json", "--text", corpus_,
                        "--ids-out", dir_ + "/ids.txt"});
  ASSERT_EQ(enc.exit_code, 0) << enc.output;
  EXPECT_NE(enc.output.find("\"mb_per_s\""), std::string::npos);
  EXPECT_GT(read_all(dir_ + "/ids.txt").size(), 10u);
}

TEST_F(TokenizerCli, BadInputsAreClearErrors) {
  const std::string out = dir_ + "/t.json";
  expect_user_error(
      {"tokenizer", "train", "--text", dir_ + "/missing.txt", "--vocab-size", "300", "--out", out},
      "missing.txt");
  expect_user_error({"tokenizer", "train", "--text", corpus_, "--vocab-size", "256", "--special",
                     "<|endoftext|>", "--out", out},
                    "at least 257");
  expect_user_error({"tokenizer", "train", "--text", corpus_, "--vocab-size", "300",
                     "--val-fraction", "1.5", "--out", out},
                    "--val-fraction");
  testing::write_text(dir_ + "/wordpiece.json",
                      R"({"model": {"type": "WordPiece", "vocab": {"a": 0}}})");
  expect_user_error(
      {"tokenizer", "encode", "--tokenizer", dir_ + "/wordpiece.json", "--text", corpus_},
      "model type \"WordPiece\" is not supported");
  testing::write_text(dir_ + "/corrupt.json", R"({"model": {"type": "BPE", "vocab": {"a": )");
  expect_user_error(
      {"tokenizer", "encode", "--tokenizer", dir_ + "/corrupt.json", "--text", corpus_},
      "not valid JSON");
  expect_user_error({"tokenizer", "encode", "--tokenizer", dir_ + "/none.json", "--text", corpus_},
                    "cannot be opened");
  expect_user_error({"tokenizer", "frobnicate"}, "frobnicate");
  std::ifstream none(out);
  EXPECT_FALSE(none.good()) << "a failed train must not write " << out;
}

}  // namespace
}  // namespace gtron

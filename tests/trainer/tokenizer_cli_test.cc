// `gtron tokenizer train/encode` as a user runs them: byte-identical reruns, bad inputs exit 2,
// --pattern llama3 round trips, a file's BOS template, refused tokenizer.json variants.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "tests/trainer/cli_util.h"
#include "trainer/text/tokenizer.h"

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

  // A corpus with long digit runs, contractions in capitals, CRLF, tabs and several scripts.
  std::string mixed_corpus() {
    std::string text;
    for (int i = 0; i < 40; ++i) {
      text += "Call 5551234567 NOW'S the time, it'S " + std::to_string(10000 + i) +
              " o'clock\r\n\tindented 東京タワー Привет мир 😀😀  \n";
    }
    const std::string path = dir_ + "/mixed.txt";
    testing::write_text(path, text);
    return path;
  }

  // Trains on `corpus` with `extra` flags into dir_/NAME.json; returns the path.
  std::string train(const std::string& corpus, const std::string& name,
                    const std::vector<std::string>& extra) {
    std::vector<std::string> args = {
        "tokenizer",    "train", "--text", corpus,
        "--vocab-size", "320",   "--out",  dir_ + "/" + name + ".json"};
    args.insert(args.end(), extra.begin(), extra.end());
    testing::expect_ok(args);
    return dir_ + "/" + name + ".json";
  }

  // Encodes `text_file` with `tokenizer` through the CLI; the ids of its one line.
  std::vector<int32_t> encode(const std::string& tokenizer, const std::string& text_file) {
    testing::expect_ok({"tokenizer", "encode", "--tokenizer", tokenizer, "--text", text_file,
                        "--ids-out", dir_ + "/ids.txt"});
    std::istringstream in(read_all(dir_ + "/ids.txt"));
    std::vector<int32_t> ids;
    for (int32_t id; in >> id;) ids.push_back(id);
    return ids;
  }

  std::string dir_, corpus_;
};

bool has_token_with_digits(const std::string& tokenizer_json, int run) {
  const nlohmann::json j = nlohmann::json::parse(read_all(tokenizer_json));
  const std::regex digits("[0-9]{" + std::to_string(run) + "}");
  for (const auto& [token, id] : j["model"]["vocab"].items()) {
    if (std::regex_search(token, digits)) return true;
  }
  return false;
}

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

TEST_F(TokenizerCli, TrainWithTheLlama3PatternRoundTrips) {
  const std::string corpus = mixed_corpus();
  const std::string llama = train(corpus, "llama", {"--pattern", "llama3"});
  const std::string gpt2 = train(corpus, "gpt2", {});
  const nlohmann::json j = nlohmann::json::parse(read_all(llama));
  EXPECT_EQ(j["pre_tokenizer"]["type"], "Sequence");
  EXPECT_EQ(j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"],
            split_pattern_regex(SplitPattern::kLlama3));
  EXPECT_EQ(nlohmann::json::parse(read_all(gpt2))["pre_tokenizer"]["type"], "ByteLevel");
  // Llama-3 cuts digits in threes, so no token holds four; GPT-2's pattern keeps the run whole.
  EXPECT_FALSE(has_token_with_digits(llama, 4));
  EXPECT_TRUE(has_token_with_digits(llama, 3));
  EXPECT_TRUE(has_token_with_digits(gpt2, 4));

  const std::vector<int32_t> ids = encode(llama, corpus);
  EXPECT_EQ(Tokenizer::load(llama).decode(ids), read_all(corpus));
  EXPECT_LT(ids.size(), read_all(corpus).size() / 2);  // it compresses
  EXPECT_NE(ids, encode(gpt2, corpus));

  expect_user_error({"tokenizer", "train", "--text", corpus, "--vocab-size", "300", "--pattern",
                     "gpt4", "--out", dir_ + "/bad.json"},
                    "--pattern 'gpt4'");
}

TEST_F(TokenizerCli, EncodeAddsTheFilesBosTemplate) {
  const std::string corpus = mixed_corpus();
  const std::string path =
      train(corpus, "bos", {"--pattern", "llama3", "--special", "<|begin_of_text|>"});
  const std::vector<int32_t> plain = encode(path, corpus);
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(read_all(path));
  const int bos = j["added_tokens"][0]["id"];
  j["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single",
       {{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
        {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
      {"special_tokens", {{"<|begin_of_text|>", {{"id", "<|begin_of_text|>"}, {"ids", {bos}}}}}}};
  testing::write_text(path, j.dump(1));
  const std::vector<int32_t> with_bos = encode(path, corpus);
  ASSERT_EQ(with_bos.size(), plain.size() + 1);
  EXPECT_EQ(with_bos[0], bos);
  EXPECT_NE(plain[0], bos);
  EXPECT_TRUE(std::equal(plain.begin(), plain.end(), with_bos.begin() + 1));
}

// Every variant gtron does not read exactly as tokenizers would is refused, naming the field.
TEST_F(TokenizerCli, RefusedTokenizerVariantsExitTwoNamingTheField) {
  const std::string path = train(mixed_corpus(), "base", {"--pattern", "llama3"});
  const auto base = nlohmann::ordered_json::parse(read_all(path));
  const auto check = [&](const std::function<void(nlohmann::ordered_json&)>& edit,
                         const std::string& field) {
    nlohmann::ordered_json j = base;
    edit(j);
    testing::write_text(dir_ + "/variant.json", j.dump());
    expect_user_error(
        {"tokenizer", "encode", "--tokenizer", dir_ + "/variant.json", "--text", corpus_}, field);
  };
  const auto split = [](nlohmann::ordered_json& j) -> nlohmann::ordered_json& {
    return j["pre_tokenizer"]["pretokenizers"][0];
  };
  const auto bytes = [](nlohmann::ordered_json& j) -> nlohmann::ordered_json& {
    return j["pre_tokenizer"]["pretokenizers"][1];
  };
  for (const char* behavior : {"Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"}) {
    check([&](auto& j) { split(j)["behavior"] = behavior; },
          "pre_tokenizer.pretokenizers[0].behavior");
  }
  check([&](auto& j) { split(j)["invert"] = true; }, "pre_tokenizer.pretokenizers[0].invert");
  check([&](auto& j) { split(j)["pattern"]["Regex"] = "\\p{L}+"; },
        "pre_tokenizer.pretokenizers[0].pattern.Regex");
  check(
      [&](auto& j) {
        split(j)["pattern"] = {{"String", " "}};
      },
      "pre_tokenizer.pretokenizers[0].pattern");
  check([&](auto& j) { bytes(j)["use_regex"] = true; }, "pre_tokenizer.pretokenizers[1].use_regex");
  check([&](auto& j) { bytes(j)["add_prefix_space"] = true; },
        "pre_tokenizer.pretokenizers[1].add_prefix_space");
  check([](auto& j) { j["pre_tokenizer"]["pretokenizers"].erase(1); },
        "pre_tokenizer.pretokenizers");
  check([](auto& j) { j["pre_tokenizer"] = {{"type", "Metaspace"}}; }, "pre_tokenizer {");
  check([](auto& j) { j["pre_tokenizer"] = {{"type", "Whitespace"}}; }, "pre_tokenizer {");
  check([](auto& j) { j["normalizer"] = {{"type", "NFKC"}}; }, "normalizer {\"type\":\"NFKC\"}");
  check([](auto& j) { j["normalizer"] = {{"type", "Lowercase"}}; }, "normalizer {");
  check([](auto& j) { j["post_processor"] = {{"type", "BertProcessing"}}; }, "post_processor {");
  check([](auto& j) { j["decoder"] = {{"type", "WordPiece"}}; }, "decoder {");
  // The base file itself is fine.
  testing::write_text(dir_ + "/variant.json", base.dump());
  testing::expect_ok(
      {"tokenizer", "encode", "--tokenizer", dir_ + "/variant.json", "--text", corpus_});
}

}  // namespace
}  // namespace gtron

// `prepare` with a BPE tokenizer: documents, the end-of-text separator, the validation split,
// meta.json, the shard width, and reuse of a matching previous output.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "model/check.h"
#include "tests/trainer/cli_util.h"
#include "trainer/data/shards.h"
#include "trainer/data/text_corpus.h"
#include "trainer/io/sha256.h"
#include "trainer/prepare.h"
#include "trainer/text/bpe_train.h"
#include "trainer/text/tokenizer.h"

namespace gtron {
namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<int32_t> as_int32(const std::vector<uint32_t>& v) {
  return std::vector<int32_t>(v.begin(), v.end());
}

class PrepareBpe : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::temp_dir("prepare_bpe");
    for (int i = 0; i < 20; ++i) {
      docs_.push_back("Fortune number " + std::to_string(i) + " says: be kind.\n");
      text_ += docs_.back() + "%\n";
    }
    testing::write_text(dir_ + "/f.txt", text_);
    BpeTrainOptions o;
    o.vocab_size = 270;
    o.specials = {"<|endoftext|>"};
    Tokenizer(train_bpe({text_}, o), "t").save(dir_ + "/tok.json");
  }

  TokenizedTextOptions options() const {
    TokenizedTextOptions t;
    t.files = {dir_ + "/f.txt"};
    t.tokenizer = dir_ + "/tok.json";
    t.doc_separator = "%";
    t.val_fraction = 0.25;
    return t;
  }

  std::string dir_, text_;
  std::vector<std::string> docs_;
};

// Note [document split]: with f = 0.25 documents 3, 7, 11, 15, 19 validate.
TEST(DocumentSplit, SpreadsValidationEvenly) {
  const DocumentSplit s = split_documents(20, 0.25);
  EXPECT_EQ(s.val, (std::vector<size_t>{3, 7, 11, 15, 19}));
  EXPECT_EQ(s.train.size(), 15u);
  EXPECT_EQ(split_documents(5, 0.0).train.size(), 5u);
  EXPECT_THROW(split_documents(3, 0.2), UserError);  // floor(3 * 0.2) = 0 validation documents
  EXPECT_THROW(split_documents(3, 1.0), UserError);
}

TEST_F(PrepareBpe, DocumentsAreSeparatedByEndOfText) {
  const std::string out = dir_ + "/out";
  PrepareResult r = prepare_tokenized_text(options(), out);
  EXPECT_FALSE(r.reused);
  Tokenizer tok = Tokenizer::load(dir_ + "/tok.json");
  const int32_t eot = *tok.special_id("<|endoftext|>");
  std::string want_train, want_val;
  for (size_t i = 0; i < docs_.size(); ++i) {
    ((i % 4 == 3) ? want_val : want_train) += "<|endoftext|>" + docs_[i];
  }
  int version = 0;
  const std::vector<uint32_t> train = read_shard(out + "/train_000.bin", 270, &version);
  const std::vector<uint32_t> val = read_shard(out + "/val_000.bin", 270);
  EXPECT_EQ(version, kShardVersionU16);
  EXPECT_EQ(tok.decode(as_int32(train)), want_train);
  EXPECT_EQ(tok.decode(as_int32(val)), want_val);
  EXPECT_EQ(static_cast<int32_t>(train[0]), eot);
  EXPECT_EQ(std::count(train.begin(), train.end(), static_cast<uint32_t>(eot)), 15);

  const nlohmann::json meta = nlohmann::json::parse(read_all(out + "/meta.json"));
  EXPECT_EQ(meta["tokenizer"], "bpe");
  EXPECT_EQ(meta["tokenizer_sha256"], sha256_hex(read_all(dir_ + "/tok.json")));
  EXPECT_EQ(meta["vocab"], 270);
  EXPECT_EQ(meta["eot_id"], eot);
  EXPECT_EQ(meta["doc_start_ids"], nlohmann::json::array({eot}));
  EXPECT_EQ(meta["tokens"], train.size());
  EXPECT_EQ(meta["val_tokens"], val.size());
  EXPECT_EQ(meta["val_documents"], 5);
  EXPECT_EQ(meta["val_bytes"], want_val.size() - 5 * std::string("<|endoftext|>").size());
  EXPECT_EQ(read_all(out + "/tokenizer.json"), read_all(dir_ + "/tok.json"));
  std::map<uint32_t, double> freq;
  for (uint32_t t : train) freq[t] += 1.0 / static_cast<double>(train.size());
  double h = 0;
  for (const auto& [t, p] : freq) h -= p * std::log(p);
  EXPECT_NEAR(meta["unigram_entropy"].get<double>(), h, 1e-9);

  EXPECT_TRUE(prepare_tokenized_text(options(), out).reused);  // same inputs: nothing written
  TokenizedTextOptions other = options();
  other.val_fraction = 0.5;
  EXPECT_THROW(prepare_tokenized_text(other, out), UserError);  // different parameters: refused
}

// A tokenizer whose file has a post-processor template (Llama-3's <|begin_of_text|> first) opens
// each document with the template's ids instead of <|endoftext|> (Tokenizer::document_start), and
// needs no <|endoftext|> at all.
TEST_F(PrepareBpe, TemplateTokenizersOpenDocumentsWithTheirTemplate) {
  BpeTrainOptions o;
  o.vocab_size = 270;
  o.specials = {"<|begin_of_text|>", "<|end_of_text|>"};
  const Tokenizer trained(train_bpe({text_}, o), "t");
  const int32_t bos = *trained.special_id("<|begin_of_text|>");
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(trained.to_json_text());
  const nlohmann::ordered_json bos_item = {
      {"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}};
  j["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", {bos_item, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
      {"pair", nlohmann::ordered_json::array()},
      {"special_tokens",
       {{"<|begin_of_text|>",
         {{"id", "<|begin_of_text|>"}, {"ids", {bos}}, {"tokens", {"<|begin_of_text|>"}}}}}}};
  testing::write_text(dir_ + "/llama.json", j.dump(2));
  TokenizedTextOptions opt = options();
  opt.tokenizer = dir_ + "/llama.json";
  const std::string out = dir_ + "/llama_out";
  prepare_tokenized_text(opt, out);
  Tokenizer tok = Tokenizer::load(dir_ + "/llama.json");
  EXPECT_EQ(tok.document_start("<|endoftext|>"), std::vector<int32_t>{bos});
  std::string want_train;
  for (size_t i = 0; i < docs_.size(); ++i) {
    if (i % 4 != 3) want_train += "<|begin_of_text|>" + docs_[i];
  }
  const std::vector<uint32_t> train = read_shard(out + "/train_000.bin", 270);
  EXPECT_EQ(tok.decode(as_int32(train)), want_train);
  EXPECT_EQ(static_cast<int32_t>(train[0]), bos);
  EXPECT_EQ(std::count(train.begin(), train.end(), static_cast<uint32_t>(bos)), 15);
  const nlohmann::json meta = nlohmann::json::parse(read_all(out + "/meta.json"));
  EXPECT_EQ(meta["doc_start_ids"], nlohmann::json::array({bos}));
  EXPECT_EQ(meta["doc_end_ids"], nlohmann::json::array());
  EXPECT_FALSE(meta.contains("eot_id"));
  // Without a template, a tokenizer lacking the eot token has nothing to open a document with.
  j["post_processor"] = nullptr;
  testing::write_text(dir_ + "/plain.json", j.dump(2));
  opt.tokenizer = dir_ + "/plain.json";
  EXPECT_THROW(prepare_tokenized_text(opt, dir_ + "/plain_out"), UserError);
}

// A vocabulary above 65536 ids needs uint32 tokens: shard version 7.
TEST_F(PrepareBpe, LargeVocabularyWritesVersion7) {
  std::string json = read_all(dir_ + "/tok.json");
  const std::string from = "\"id\": 269", to = "\"id\": 70000";
  json.replace(json.find(from), from.size(), to);
  const std::string in_vocab = "\"<|endoftext|>\": 269";
  json.replace(json.find(in_vocab), in_vocab.size(), "\"<|endoftext|>\": 70000");
  testing::write_text(dir_ + "/big.json", json);
  TokenizedTextOptions o = options();
  o.tokenizer = dir_ + "/big.json";
  prepare_tokenized_text(o, dir_ + "/big");
  int version = 0;
  const std::vector<uint32_t> train = read_shard(dir_ + "/big/train_000.bin", 70001, &version);
  EXPECT_EQ(version, kShardVersionU32);
  EXPECT_EQ(train[0], 70000u);
}

TEST_F(PrepareBpe, BadInputsAreUserErrors) {
  TokenizedTextOptions o = options();
  o.eot = "<|end|>";
  EXPECT_THROW(prepare_tokenized_text(o, dir_ + "/a"), UserError);  // no such special token
  o = options();
  o.files = {dir_ + "/missing.txt"};
  EXPECT_THROW(prepare_tokenized_text(o, dir_ + "/b"), UserError);
  o = options();
  o.tokenizer = dir_ + "/missing.json";
  EXPECT_THROW(prepare_tokenized_text(o, dir_ + "/c"), UserError);
  o = options();
  o.val_fraction = 0.0;
  EXPECT_THROW(prepare_tokenized_text(o, dir_ + "/d"), UserError);
}

}  // namespace
}  // namespace gtron

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

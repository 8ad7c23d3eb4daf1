#include "trainer/prepare.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/check.h"
#include "trainer/data/markov.h"
#include "trainer/data/shards.h"

namespace gtron {
namespace {

namespace fs = std::filesystem;

// A fresh directory under TEST_TMPDIR named after the running test.
std::string test_dir() {
  const char* root = std::getenv("TEST_TMPDIR");
  std::string dir = std::string(root != nullptr ? root : "/tmp") + "/prepare_" +
                    ::testing::UnitTest::GetInstance()->current_test_info()->name();
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

nlohmann::json read_json(const std::string& path) {
  nlohmann::json j;
  std::ifstream(path) >> j;
  return j;
}

std::vector<int32_t> as_int32(const std::vector<uint32_t>& v) { return {v.begin(), v.end()}; }

// Expects a UserError whose message contains every one of `pieces`.
template <typename F>
void expect_user_error(F&& f, const std::vector<std::string>& pieces) {
  try {
    f();
    ADD_FAILURE() << "no UserError thrown";
  } catch (const UserError& e) {
    for (const std::string& p : pieces) {
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "message lacks '" << p << "': " << e.what();
    }
  }
}

std::string sample_text() {
  std::string text;
  for (int i = 0; i < 40; ++i) text += "The quick brown fox jumps over the lazy dog. \xc3\xa9!!\n";
  return text;  // 40 * 50 = 2000 bytes, with non-ASCII bytes
}

TEST(Prepare, TextRoundTrip) {
  const std::string dir = test_dir();
  const std::string text = sample_text();
  ASSERT_EQ(text.size(), 2000u);
  write_text(dir + "/in.txt", text);
  PrepareResult r = prepare_text(dir + "/in.txt", dir + "/out", 0.1);
  EXPECT_FALSE(r.reused);
  EXPECT_EQ(r.vocab, 256);
  EXPECT_EQ(r.train_tokens, 1800);
  EXPECT_EQ(r.val_tokens, 200);

  ShardSet train(r.train_pattern, 256), val(r.val_pattern, 256);
  ASSERT_EQ(train.num_shards(), 1);
  EXPECT_EQ(train.path(0), dir + "/out/train_000.bin");
  EXPECT_EQ(train.version(0), 1);
  EXPECT_EQ(detokenize_bytes(as_int32(train.tokens(0))) + detokenize_bytes(as_int32(val.tokens(0))),
            text);  // val is the end of the text
  EXPECT_EQ(detokenize_bytes(as_int32(val.tokens(0))), text.substr(1800));

  const nlohmann::json meta = read_json(dir + "/out/meta.json");
  EXPECT_EQ(meta["tokenizer"], "bytes");
  EXPECT_EQ(meta["vocab"], 256);
  EXPECT_EQ(meta["tokens"], 1800);
  EXPECT_EQ(meta["val_tokens"], 200);
  EXPECT_EQ(meta["text_bytes"], 2000);

  // Same parameters: reused, nothing rewritten.
  const auto stamp = fs::last_write_time(dir + "/out/train_000.bin");
  PrepareResult again = prepare_text(dir + "/in.txt", dir + "/out", 0.1);
  EXPECT_TRUE(again.reused);
  EXPECT_EQ(again.train_tokens, 1800);
  EXPECT_EQ(fs::last_write_time(dir + "/out/train_000.bin"), stamp);
}

TEST(Prepare, TextRefusals) {
  const std::string dir = test_dir();
  write_text(dir + "/in.txt", sample_text());
  write_text(dir + "/empty.txt", "");
  write_text(dir + "/one.txt", "x");
  expect_user_error([&] { prepare_text(dir + "/missing.txt", dir + "/o1", 0.1); },
                    {"missing.txt", "does not exist"});
  expect_user_error([&] { prepare_text(dir + "/empty.txt", dir + "/o1", 0.1); },
                    {"empty.txt", "empty"});
  expect_user_error([&] { prepare_text(dir + "/one.txt", dir + "/o1", 0.5); },
                    {"one.txt", "0 train"});
  for (double f : {0.0, 1.0, -0.1, 1.5, std::nan("")}) {
    expect_user_error([&] { prepare_text(dir + "/in.txt", dir + "/o1", f); }, {"val_fraction"});
  }
  EXPECT_FALSE(fs::exists(dir + "/o1"));  // argument errors come before any output

  // A previous output with other parameters is refused, naming the directory and the difference.
  prepare_text(dir + "/in.txt", dir + "/out", 0.1);
  expect_user_error([&] { prepare_text(dir + "/in.txt", dir + "/out", 0.2); },
                    {"'" + dir + "/out'", "val_fraction", "0.1", "0.2", "Hint"});
  write_text(dir + "/in2.txt", sample_text() + "more");
  expect_user_error([&] { prepare_text(dir + "/in2.txt", dir + "/out", 0.1); }, {"text_bytes"});

  // A directory with foreign files, or a file in the way, is never overwritten.
  fs::create_directories(dir + "/mine");
  write_text(dir + "/mine/notes.txt", "keep me");
  expect_user_error([&] { prepare_text(dir + "/in.txt", dir + "/mine", 0.1); },
                    {"mine", "no meta.json"});
  expect_user_error([&] { prepare_text(dir + "/in.txt", dir + "/in2.txt", 0.1); },
                    {"in2.txt", "not a directory"});
}

TEST(Prepare, DamagedOrPartialOutputs) {
  const std::string dir = test_dir();
  write_text(dir + "/in.txt", sample_text());
  prepare_text(dir + "/in.txt", dir + "/out", 0.1);
  fs::resize_file(dir + "/out/val_000.bin", 1100);
  expect_user_error([&] { prepare_text(dir + "/in.txt", dir + "/out", 0.1); },
                    {"val_000.bin", "truncated"});

  // An interrupted prepare (shards but no meta.json) is completed, not refused.
  fs::create_directories(dir + "/partial");
  write_shard(dir + "/partial/train_000.bin", {1, 2, 3}, kShardVersionU16);
  write_text(dir + "/partial/val_000.bin.tmp", "half");
  PrepareResult r = prepare_text(dir + "/in.txt", dir + "/partial", 0.1);
  EXPECT_FALSE(r.reused);
  EXPECT_EQ(ShardSet(r.train_pattern, 256).total_tokens(), 1800);
}

TEST(Prepare, SyntheticMarkov) {
  const std::string dir = test_dir();
  PrepareResult r = prepare_synthetic_markov(2, 16, 0.3, 5000, 500, 77, dir + "/m");
  EXPECT_FALSE(r.reused);
  EXPECT_EQ(r.vocab, 16);
  ShardSet train(r.train_pattern, 16), val(r.val_pattern, 16);  // every token < 16
  EXPECT_EQ(train.total_tokens(), 5000);
  EXPECT_EQ(val.total_tokens(), 500);

  // The shards are one chain from MarkovSource(2, 16, 0.3, 77); val is its end.
  const MarkovSource source(2, 16, 0.3, 77);
  const nlohmann::json meta = read_json(dir + "/m/meta.json");
  EXPECT_EQ(meta["entropy_rate"].get<double>(), source.entropy_rate());
  EXPECT_EQ(meta["unigram_entropy"].get<double>(), source.unigram_entropy());
  EXPECT_EQ(meta["order"], 2);
  EXPECT_EQ(meta["seed"], 77);
  for (int64_t i = 2; i < 500; ++i) {
    const auto& v = val.tokens(0);
    EXPECT_GT(source.transition(v[i - 2] * 16 + v[i - 1], static_cast<int>(v[i])), 0.0);
  }

  EXPECT_TRUE(prepare_synthetic_markov(2, 16, 0.3, 5000, 500, 77, dir + "/m").reused);
  expect_user_error([&] { prepare_synthetic_markov(2, 16, 0.3, 5000, 500, 78, dir + "/m"); },
                    {"seed", "77", "78"});
  expect_user_error([&] { prepare_text(dir + "/none.txt", dir + "/m", 0.1); }, {"none.txt"});
  write_text(dir + "/in.txt", sample_text());
  expect_user_error([&] { prepare_text(dir + "/in.txt", dir + "/m", 0.1); },
                    {"source", "\"markov\"", "\"text\""});
  expect_user_error([&] { prepare_synthetic_markov(2, 16, 0.3, 0, 500, 77, dir + "/m2"); },
                    {"tokens 0"});
  expect_user_error([&] { prepare_synthetic_markov(2, 16, -1.0, 10, 5, 77, dir + "/m2"); },
                    {"alpha"});
  EXPECT_FALSE(fs::exists(dir + "/m2"));
}

TEST(Prepare, ByteTokenizer) {
  const std::string text = std::string("a\0\xff", 3);
  EXPECT_EQ(tokenize_bytes(text), (std::vector<int32_t>{97, 0, 255}));
  EXPECT_EQ(detokenize_bytes(tokenize_bytes(text)), text);
  EXPECT_EQ(detokenize_bytes(std::vector<int32_t>{104, 300, -1, 105}),
            "h\xEF\xBF\xBD\xEF\xBF\xBDi");
}

}  // namespace
}  // namespace gtron

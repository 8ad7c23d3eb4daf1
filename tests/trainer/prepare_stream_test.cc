// `gtron prepare` and `gtron tokenizer train` on real-corpus inputs: the same documents as text
// files, JSON lines, .jsonl.gz and .jsonl.zst give byte-identical shards; any thread count gives
// the same shards and the same tokenizer.json; a bad line is an error naming the file and the line
// (exit 2) and nothing is written; --max-docs, --text-field, directories and globs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "model/check.h"
#include "tests/trainer/cli_util.h"
#include "tests/trainer/compress_util.h"
#include "trainer/prepare.h"
#include "trainer/text/bpe_train.h"
#include "trainer/text/tokenizer.h"

namespace gtron {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::run_gtron;

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Documents with what text files and JSON strings must agree on: several lines, CRLF, tabs,
// quotes and backslashes, non-ASCII, leading and trailing spaces, a blank one (dropped by both),
// and a last one without a final newline.
std::vector<std::string> sample_documents(int n) {
  const char* words[] = {
      "river",     "stone", "\"quoted\"", "back\\slash", "caf\xc3\xa9", "\xe6\x9d\xb1\xe4\xba\xac",
      "tab\there", "42",    "1,234",      "end."};
  std::vector<std::string> docs;
  uint64_t x = 12345;
  for (int d = 0; d < n; ++d) {
    std::string doc = d % 7 == 0 ? "  " : "";
    const int lines = 1 + d % 4;
    for (int l = 0; l < lines; ++l) {
      for (int w = 0; w < 6 + d % 5; ++w) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        doc += std::string(w ? " " : "") + words[(x >> 33) % 10];
      }
      doc += d % 5 == 0 ? "\r\n" : "\n";
    }
    docs.push_back(doc);
  }
  docs[n / 2] = " \n\t \n";  // blank: no document in either form
  docs.back().pop_back();    // no final newline
  return docs;
}

std::string jsonl_of(const std::vector<std::string>& docs, const std::string& field = "text") {
  std::string out;
  for (size_t i = 0; i < docs.size(); ++i) {
    json line = {{"id", i}, {field, docs[i]}, {"meta", {{"source", "test"}}}};
    out += line.dump() + "\n";
  }
  return out;
}

class PrepareStream : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::temp_dir("prepare_stream");
    docs_ = sample_documents(120);
    std::string all;
    for (const std::string& d : docs_) all += d;
    BpeTrainOptions o;
    o.vocab_size = 400;
    o.specials = {"<|endoftext|>"};
    Tokenizer(train_bpe({all}, o), "t").save(dir_ + "/tok.json");
  }

  // gtron prepare --text ARGS... --tokenizer tok.json --out dir_/NAME plus `extra`; EXPECTs exit 0.
  std::string prepare(const std::vector<std::string>& text, const std::string& name,
                      const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {"prepare"};
    for (const std::string& t : text) args.insert(args.end(), {"--text", t});
    args.insert(args.end(), {"--tokenizer", dir_ + "/tok.json", "--out", dir_ + "/" + name,
                             "--val-fraction", "0.2"});
    args.insert(args.end(), extra.begin(), extra.end());
    testing::expect_ok(args);
    return dir_ + "/" + name;
  }

  // Shards and the identity in meta.json equal those of `want`.
  void expect_same_output(const std::string& want, const std::string& got) {
    for (const char* f : {"/train_000.bin", "/val_000.bin"}) {
      ASSERT_TRUE(fs::exists(got + f)) << got + f;
      EXPECT_EQ(read_all(got + f), read_all(want + f)) << got + f << " differs from " << want + f;
    }
    EXPECT_FALSE(fs::exists(got + "/train_001.bin"));
    const json a = json::parse(read_all(want + "/meta.json"));
    const json b = json::parse(read_all(got + "/meta.json"));
    for (const char* key : {"text_bytes", "text_fnv1a64", "documents", "val_documents", "tokens",
                            "val_tokens", "train_bytes", "val_bytes"}) {
      EXPECT_EQ(a[key], b[key]) << key << " in " << got;
    }
  }

  // Runs gtron; expects exit code 2 and every one of `needles` in the message.
  void expect_user_error(const std::vector<std::string>& args,
                         const std::vector<std::string>& needles) {
    const testing::CmdResult r = run_gtron(args);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    for (const std::string& n : needles) {
      EXPECT_NE(r.output.find(n), std::string::npos) << "wanted '" << n << "' in\n" << r.output;
    }
  }

  std::string dir_;
  std::vector<std::string> docs_;
};

TEST_F(PrepareStream, JsonLinesAndCompressedInputsGiveTheShardsOfTextFiles) {
  // The reference: one text file per document, through a directory (its files in byte order).
  fs::create_directories(dir_ + "/txt");
  for (size_t i = 0; i < docs_.size(); ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "/txt/doc_%04zu.txt", i);
    testing::write_text(dir_ + name, docs_[i]);
  }
  const std::string want = prepare({dir_ + "/txt"}, "from_txt");
  const json meta = json::parse(read_all(want + "/meta.json"));
  EXPECT_EQ(meta["documents"].get<int64_t>() + meta["val_documents"].get<int64_t>(),
            static_cast<int64_t>(docs_.size()) - 1);  // the blank one dropped

  // One text file cut at "%" lines.
  std::string joined;
  for (size_t i = 0; i < docs_.size(); ++i) joined += (i ? "%\n" : "") + docs_[i];
  testing::write_text(dir_ + "/all.txt", joined);
  expect_same_output(want,
                     prepare({dir_ + "/all.txt"}, "from_separator", {"--doc-separator", "%"}));

  const std::string lines = jsonl_of(docs_);
  testing::write_text(dir_ + "/c.jsonl", lines);
  expect_same_output(want, prepare({dir_ + "/c.jsonl"}, "from_jsonl"));
  testing::write_gzip(dir_ + "/c.jsonl.gz", lines, /*members=*/3);
  expect_same_output(want, prepare({dir_ + "/c.jsonl.gz"}, "from_gz"));
  testing::write_zstd(dir_ + "/c.jsonl.zst", lines, /*frames=*/3);
  expect_same_output(want, prepare({dir_ + "/c.jsonl.zst"}, "from_zst"));

  // Three files of three kinds through one glob (matches in byte order), and another member name.
  const std::vector<std::string> a(docs_.begin(), docs_.begin() + 40),
      b(docs_.begin() + 40, docs_.begin() + 80), c(docs_.begin() + 80, docs_.end());
  fs::create_directories(dir_ + "/parts");
  testing::write_text(dir_ + "/parts/p0.jsonl", jsonl_of(a, "content"));
  testing::write_gzip(dir_ + "/parts/p1.jsonl.gz", jsonl_of(b, "content"));
  testing::write_zstd(dir_ + "/parts/p2.jsonl.zst", jsonl_of(c, "content"));
  expect_same_output(want, prepare({dir_ + "/parts/p*"}, "from_glob", {"--text-field", "content"}));
  expect_same_output(want, prepare({dir_ + "/parts"}, "from_dir", {"--text-field", "content"}));
}

// A corpus of several read batches (over 4 MiB); shards and tokenizer.json for 1, 2 and 3 threads.
TEST_F(PrepareStream, ThreadCountDoesNotChangeShardsOrTokenizer) {
  std::vector<std::string> docs = sample_documents(4600);
  for (std::string& d : docs) d += d + d + d + d + d + d + d;  // ~5.5 MB of JSON lines
  testing::write_text(dir_ + "/big.jsonl", jsonl_of(docs));
  ASSERT_GT(fs::file_size(dir_ + "/big.jsonl"), size_t{5} << 20);
  const std::string one = prepare({dir_ + "/big.jsonl"}, "t1", {"--threads", "1"});
  expect_same_output(one, prepare({dir_ + "/big.jsonl"}, "t2", {"--threads", "2"}));
  expect_same_output(one, prepare({dir_ + "/big.jsonl"}, "t3", {"--threads", "3"}));

  for (const char* t : {"1", "3"}) {
    testing::expect_ok({"tokenizer", "train", "--text", dir_ + "/big.jsonl", "--vocab-size", "500",
                        "--special", "<|endoftext|>", "--threads", t, "--out",
                        dir_ + "/tok_" + t + ".json"});
  }
  EXPECT_EQ(read_all(dir_ + "/tok_1.json"), read_all(dir_ + "/tok_3.json"));
  // The same tokenizer as training on the documents in memory (Note [parallel BPE counting]).
  std::vector<std::string_view> texts;
  for (const std::string& d : docs) {
    if (d.find_first_not_of(" \t\r\n\f\v") != std::string::npos) texts.emplace_back(d);
  }
  BpeTrainOptions o;
  o.vocab_size = 500;
  o.specials = {"<|endoftext|>"};
  EXPECT_EQ(read_all(dir_ + "/tok_3.json"), Tokenizer(train_bpe(texts, o), "t").to_json_text());
}

TEST_F(PrepareStream, BadLinesAreNamedByFileAndLineAndNothingIsWritten) {
  const std::string good = jsonl_of(std::vector<std::string>(docs_.begin(), docs_.begin() + 5));
  const struct {
    const char* name;
    std::string line;
    const char* what;
  } cases[] = {
      {"invalid.jsonl", "{\"text\": \"unterminated}", "not valid JSON"},
      {"missing.jsonl", "{\"body\": \"x\"}", "no member \"text\" (its members: body)"},
      {"number.jsonl", "{\"text\": 7}", "is a JSON number, not a string"},
      {"array.jsonl", "[\"text\"]", "a JSON array, not an object"},
  };
  for (const auto& c : cases) {
    const std::string path = dir_ + "/" + c.name;
    testing::write_text(path, good + "\n" + c.line + "\n" + good);  // the bad line is line 7
    const std::string out = dir_ + "/out_" + c.name;
    expect_user_error({"prepare", "--text", path, "--tokenizer", dir_ + "/tok.json", "--out", out},
                      {"'" + path + "', line 7", c.what});
    EXPECT_FALSE(fs::exists(out)) << c.name;
    expect_user_error({"tokenizer", "train", "--text", path, "--vocab-size", "300", "--out",
                       dir_ + "/tok_" + c.name + ".json"},
                      {"'" + path + "', line 7", c.what});
    EXPECT_FALSE(fs::exists(dir_ + "/tok_" + c.name + ".json"));
  }
  // --max-docs stops before the bad line: nothing after it is read.
  testing::expect_ok({"prepare", "--text", dir_ + "/invalid.jsonl", "--tokenizer",
                      dir_ + "/tok.json", "--out", dir_ + "/first5", "--max-docs", "5",
                      "--val-fraction", "0.2"});
  const json meta = json::parse(read_all(dir_ + "/first5/meta.json"));
  EXPECT_EQ(meta["documents"].get<int>() + meta["val_documents"].get<int>(), 5);

  // Corrupt and truncated compressed files, also into an existing empty folder (left empty).
  const std::string lines = jsonl_of(sample_documents(3000));
  const int64_t n_lines = std::count(lines.begin(), lines.end(), '\n');
  testing::write_gzip(dir_ + "/bad.jsonl.gz", lines);
  std::string gz = read_all(dir_ + "/bad.jsonl.gz");
  gz[gz.size() - 8] = static_cast<char>(~gz[gz.size() - 8]);  // the CRC-32 of the content
  testing::write_text(dir_ + "/bad.jsonl.gz", gz);
  fs::create_directories(dir_ + "/empty");
  expect_user_error(
      {"prepare", "--text", dir_ + "/bad.jsonl.gz", "--tokenizer", dir_ + "/tok.json", "--out",
       dir_ + "/empty"},
      {"'" + dir_ + "/bad.jsonl.gz', line " + std::to_string(n_lines + 1), "corrupt gzip data"});
  EXPECT_TRUE(fs::is_empty(dir_ + "/empty"));
  testing::write_zstd(dir_ + "/cut.jsonl.zst", lines);
  const std::string zst = read_all(dir_ + "/cut.jsonl.zst");
  testing::write_text(dir_ + "/cut.jsonl.zst", zst.substr(0, zst.size() / 2));
  expect_user_error({"prepare", "--text", dir_ + "/cut.jsonl.zst", "--tokenizer",
                     dir_ + "/tok.json", "--out", dir_ + "/cut"},
                    {"'" + dir_ + "/cut.jsonl.zst', line ", "truncated zstd data"});
  EXPECT_FALSE(fs::exists(dir_ + "/cut"));
}

TEST_F(PrepareStream, InputsAndFlagsAreChecked) {
  expect_user_error({"prepare", "--text", dir_ + "/nothing_*.jsonl", "--tokenizer",
                     dir_ + "/tok.json", "--out", dir_ + "/o"},
                    {"nothing_*.jsonl", "matches no file"});
  fs::create_directories(dir_ + "/no_text");
  testing::write_text(dir_ + "/no_text/notes.md", "not a text input by its name");
  expect_user_error({"prepare", "--text", dir_ + "/no_text", "--tokenizer", dir_ + "/tok.json",
                     "--out", dir_ + "/o"},
                    {"no_text", "holds no .txt, .jsonl"});
  testing::write_text(dir_ + "/c.jsonl", jsonl_of(docs_));
  expect_user_error({"prepare", "--text", dir_ + "/c.jsonl", "--out", dir_ + "/o"},
                    {"byte-level tokenizer takes one plain text file"});
  expect_user_error({"prepare", "--text", dir_ + "/c.jsonl", "--tokenizer", dir_ + "/tok.json",
                     "--out", dir_ + "/o", "--threads", "-1"},
                    {"--threads"});
  EXPECT_FALSE(fs::exists(dir_ + "/o"));

  // The reuse of a previous output hashes the texts again: changed texts are refused.
  const std::string out = prepare({dir_ + "/c.jsonl"}, "reused");
  const auto stamp = fs::last_write_time(out + "/train_000.bin");
  const testing::CmdResult again =
      run_gtron({"prepare", "--text", dir_ + "/c.jsonl", "--tokenizer", dir_ + "/tok.json", "--out",
                 out, "--val-fraction", "0.2", "--threads", "2"});
  EXPECT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(fs::last_write_time(out + "/train_000.bin"), stamp);
  testing::write_text(dir_ + "/c.jsonl", jsonl_of(sample_documents(121)));
  expect_user_error({"prepare", "--text", dir_ + "/c.jsonl", "--tokenizer", dir_ + "/tok.json",
                     "--out", out, "--val-fraction", "0.2"},
                    {"different parameters", "text_"});
}

}  // namespace
}  // namespace gtron

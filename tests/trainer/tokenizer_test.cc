// The byte-level BPE tokenizer: hand-checked merges and ids, round trips of arbitrary bytes and of
// every file under tests/, determinism, special tokens, tokenizer.json both ways.
#include "trainer/text/tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "model/check.h"
#include "trainer/text/bpe_train.h"
#include "trainer/text/byte_level.h"
#include "trainer/text/pretokenize.h"

namespace gtron {
namespace {

using Merges = std::vector<std::pair<int32_t, int32_t>>;

TokenizerSpec train(const std::string& text, int64_t vocab, std::vector<std::string> specials = {},
                    int64_t min_count = 2) {
  BpeTrainOptions o;
  o.vocab_size = vocab;
  o.specials = std::move(specials);
  o.min_pair_count = min_count;
  return train_bpe({text}, o);
}

std::vector<std::string> pieces(const std::string& text) {
  Pretokenizer pre;
  std::vector<std::string> out;
  pre.split(text, [&](std::string_view p) { out.emplace_back(p); });
  return out;
}

std::string english() {
  std::string s;
  for (int i = 0; i < 40; ++i) {
    s += "The quick brown fox jumps over the lazy dog. It's 42 o'clock; they'll say: \"don't!\"\n";
    s += "  Naïve café, 東京 and Ünïcödé letters\t\tmix with numbers 3.14159 and  spaces.\n";
  }
  return s;
}

TEST(ByteLevel, EveryByteRoundTripsThroughItsCharacter) {
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  EXPECT_EQ(token_string_to_bytes(bytes_to_token_string(all)), all);
  EXPECT_EQ(bytes_to_token_string(" "), "\xC4\xA0");   // U+0120 'Ġ'
  EXPECT_EQ(bytes_to_token_string("\n"), "\xC4\x8A");  // U+010A 'Ċ'
  EXPECT_EQ(bytes_to_token_string("a!~"), "a!~");
  EXPECT_FALSE(token_string_to_bytes("\xE6\x9D\xB1").has_value());  // a CJK character
  EXPECT_FALSE(token_string_to_bytes(" ").has_value());             // a raw space is no token
}

TEST(Pretokenize, Gpt2SplitPattern) {
  EXPECT_EQ(pieces("Hello world's 12 cats!!  ok\n\n  x"),
            (std::vector<std::string>{"Hello", " world", "'s", " 12", " cats", "!!", " ", " ok",
                                      "\n\n ", " x"}));
  EXPECT_EQ(pieces("Ünïcödé 東京"), (std::vector<std::string>{"Ünïcödé", " 東京"}));
  EXPECT_EQ(pieces("x   "), (std::vector<std::string>{"x", "   "}));
}

TEST(Pretokenize, InvalidUtf8BytesBecomeTheirOwnPieces) {
  EXPECT_EQ(pieces("ab\xFF\xFE cd\x80"),
            (std::vector<std::string>{"ab", "\xFF\xFE", " cd", "\x80"}));
  const std::string spaces(1 << 20, ' ');  // a long backtracking run fits the JIT stack
  EXPECT_EQ(pieces(spaces + "x").size(), 2u);
}

// Corpus "ab ab ab abc": words " ab" x2, " abc" x1, "ab" x1. Pair counts (a,b)=4, (' ',a)=3,
// (b,c)=1: merge (a,b) -> 256; then (' ',256)=3 -> 257; then every pair occurs once: stop.
TEST(BpeTrain, HandCheckedMergesAndIds) {
  TokenizerSpec spec = train("ab ab ab abc", 300, {"<|endoftext|>"});
  EXPECT_EQ(spec.merges, (Merges{{'a', 'b'}, {' ', 256}}));
  ASSERT_EQ(spec.token_bytes.size(), 259u);
  EXPECT_EQ(spec.token_bytes[256], "ab");
  EXPECT_EQ(spec.token_bytes[257], " ab");
  EXPECT_EQ(spec.token_bytes[258], "<|endoftext|>");
  Tokenizer tok(spec, "test");
  EXPECT_EQ(tok.encode("ab ab<|endoftext|>abc"), (std::vector<int32_t>{256, 257, 258, 256, 'c'}));
}

// All pairs tie at count 1: the smallest (left, right) goes first. "xy zw": (' ',z) < (x,y) <
// (z,w); after (' ',z) -> 256 the word " zw" has (256,w), which comes after (x,y).
TEST(BpeTrain, TieBreakIsSmallestPair) {
  TokenizerSpec spec = train("xy zw", 260, {}, 1);
  EXPECT_EQ(spec.merges, (Merges{{' ', 'z'}, {'x', 'y'}, {256, 'w'}}));
  EXPECT_EQ(spec.token_bytes.size(), 259u);
}

// "aaaa": (a,a) occurs 3 times; merging left to right gives "aa aa"; then (256,256).
TEST(BpeTrain, OverlappingPairsMergeLeftToRight) {
  TokenizerSpec spec = train("aaaa", 300, {}, 1);
  EXPECT_EQ(spec.merges, (Merges{{'a', 'a'}, {256, 256}}));
  Tokenizer tok(spec, "test");
  EXPECT_EQ(tok.encode("aaa"), (std::vector<int32_t>{256, 'a'}));
  EXPECT_EQ(tok.encode("aaaaa"), (std::vector<int32_t>{257, 'a'}));
}

TEST(BpeTrain, StopsAtTheVocabSize) {
  TokenizerSpec spec = train(english(), 300, {"<|endoftext|>"});
  EXPECT_EQ(spec.token_bytes.size(), 300u);
  EXPECT_GE(spec.merges.size(), 43u);  // one per new token, more when bytes repeat
}

// Encoding a training word replays the training merges, so the counted words decode exactly.
TEST(Tokenizer, RoundTripsArbitraryBytes) {
  Tokenizer tok(train(english(), 400, {"<|endoftext|>"}), "test");
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::string s(rng() % 300, '\0');
    for (char& c : s) c = static_cast<char>(rng() % 256);
    if (trial % 3 == 0) s += english().substr(rng() % 500, 80);
    EXPECT_EQ(tok.decode(tok.encode(s)), s) << "trial " << trial;
  }
  const std::string invalid = "\xC3\x28 \xA0\xA1 \xE2\x28\xA1 \xF0\x90\x28\xBC \xED\xA0\x80 \xFF";
  EXPECT_EQ(tok.decode(tok.encode(invalid)), invalid);
}

TEST(Tokenizer, RoundTripsEveryFileUnderTests) {
  Tokenizer tok(train(english(), 512, {"<|endoftext|>"}), "test");
  int files = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator("tests")) {
    if (!e.is_regular_file()) continue;
    std::ifstream in(e.path(), std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string bytes = ss.str();
    const std::vector<int32_t> ids = tok.encode(bytes);
    EXPECT_EQ(tok.decode(ids), bytes) << e.path();
    if (bytes.size() > 1000) {
      EXPECT_LT(ids.size(), bytes.size()) << e.path();  // it compresses
    }
    ++files;
  }
  EXPECT_GT(files, 50);
}

TEST(Tokenizer, SpecialTokenIsNeverSplitOrMerged) {
  const std::string eot = "<|endoftext|>";
  // Training text full of the special: it must not leak into the merges.
  std::string text;
  for (int i = 0; i < 50; ++i) text += "hello" + eot + "<|endoftext|" + eot;
  TokenizerSpec spec = train(text, 400, {eot});
  for (size_t id = 256; id + 1 < spec.token_bytes.size(); ++id) {
    EXPECT_EQ(spec.token_bytes[id]->find(eot), std::string::npos) << id;
  }
  Tokenizer tok(spec, "test");
  const int32_t eot_id = *tok.special_id(eot);
  EXPECT_EQ(eot_id, static_cast<int32_t>(spec.token_bytes.size()) - 1);
  const std::vector<int32_t> ids = tok.encode("a" + eot + eot + "<|endoftext" + eot + "b");
  EXPECT_EQ(std::count(ids.begin(), ids.end(), eot_id), 3);
  EXPECT_EQ(ids[1], eot_id);
  EXPECT_EQ(ids[2], eot_id);
  EXPECT_EQ(tok.decode(ids), "a" + eot + eot + "<|endoftext" + eot + "b");
}

TEST(Tokenizer, TrainingIsDeterministicAndJsonRoundTrips) {
  const std::string a = Tokenizer(train(english(), 420, {"<|endoftext|>"}), "a").to_json_text();
  const std::string b = Tokenizer(train(english(), 420, {"<|endoftext|>"}), "b").to_json_text();
  EXPECT_EQ(a, b);
  Tokenizer back = Tokenizer::from_json_text(a, "a.json");
  EXPECT_EQ(back.to_json_text(), a);
  Tokenizer orig(train(english(), 420, {"<|endoftext|>"}), "a");
  EXPECT_EQ(back.encode(english()), orig.encode(english()));
  EXPECT_NE(a.find("\"type\": \"BPE\""), std::string::npos);
  EXPECT_NE(a.find("\"type\": \"ByteLevel\""), std::string::npos);
}

// A tokenizers-style file: its own ids (not gtron's byte order), merges as arrays, a special that
// is also in the vocab, as GPT-2's tokenizer.json has it.
TEST(Tokenizer, ReadsTokenizersFilesWithTheirIds) {
  const std::string json = R"({
    "added_tokens": [{"id": 0, "content": "<|endoftext|>", "special": true}],
    "normalizer": null,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
    "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "dropout": null, "unk_token": null,
              "vocab": {"<|endoftext|>": 0, "a": 1, "b": 2, "Ġ": 3, "ab": 4, "Ġab": 5},
              "merges": [["a", "b"], "Ġ ab"]}})";
  Tokenizer tok = Tokenizer::from_json_text(json, "hf.json");
  EXPECT_EQ(tok.encode("ab ab<|endoftext|>"), (std::vector<int32_t>{4, 5, 0}));
  EXPECT_EQ(tok.decode({5, 4, 0}), " abab<|endoftext|>");
  EXPECT_THROW(tok.encode("c"), UserError);  // 'c' has no token in this file
}

// The fields GPT-2's own tokenizer.json has: a ByteLevel post_processor (ignored: it changes no
// ids), "" subword prefix/suffix, merges as "left right" strings, the special at the end.
TEST(Tokenizer, ReadsGpt2ShapedFiles) {
  const std::string json = R"({"version": "1.0", "truncation": null, "padding": null,
    "added_tokens": [{"id": 6, "content": "<|endoftext|>", "single_word": false, "lstrip": false,
                      "rstrip": false, "normalized": true, "special": true}],
    "normalizer": null,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true},
    "post_processor": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false},
    "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true},
    "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": "",
              "end_of_word_suffix": "", "fuse_unk": false,
              "vocab": {"h": 0, "i": 1, "Ġ": 2, "hi": 3, "Ġhi": 4, "Ċ": 5, "<|endoftext|>": 6},
              "merges": ["h i", "Ġ hi"]}})";
  Tokenizer tok = Tokenizer::from_json_text(json, "gpt2.json");
  EXPECT_EQ(tok.encode("hi hi\n<|endoftext|>"), (std::vector<int32_t>{3, 4, 5, 6}));
  EXPECT_EQ(tok.vocab_size(), 7);
}

TEST(Tokenizer, RefusesOtherModelsAndCorruptFiles) {
  auto message = [](const std::string& json) {
    try {
      Tokenizer::from_json_text(json, "t.json");
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(R"({"model": {"type": "WordPiece", "vocab": {}}})").find("WordPiece"),
            std::string::npos);
  EXPECT_NE(message(R"({"model": {"type": "Unigram", "vocab": []}})").find("byte-level BPE"),
            std::string::npos);
  EXPECT_NE(message("{\"model\": {\"type\": \"BPE\", \"vo").find("not valid JSON"),
            std::string::npos);
  const std::string bad_merge = R"({"pre_tokenizer": {"type": "ByteLevel"},
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": ["a b"]}})";
  EXPECT_NE(message(bad_merge).find("merge 0"), std::string::npos);
  const std::string no_pre = R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})";
  EXPECT_NE(message(no_pre).find("pre_tokenizer"), std::string::npos);
}

TEST(BpeTrain, RefusesBadOptions) {
  EXPECT_THROW(train("abc", 256, {"<|endoftext|>"}), UserError);
  EXPECT_THROW(train("abc", 300, {"x", "x"}), UserError);
  EXPECT_THROW(train("abc", 300, {"\xFF"}), UserError);
  EXPECT_NO_THROW(train("abc", 257, {"<|endoftext|>"}));
}

}  // namespace
}  // namespace gtron

// The byte-level BPE tokenizer: hand-checked merges and ids, round trips of arbitrary bytes and of
// every file under tests/, determinism, special tokens, tokenizer.json both ways; the Llama-3 and
// Qwen2 split patterns and their file form (Split + ByteLevel, ignore_merges, a BOS template).
#include "trainer/text/tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "model/check.h"
#include "trainer/text/bpe_train.h"
#include "trainer/text/byte_level.h"
#include "trainer/text/normalize.h"
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

std::vector<std::string> pieces(const std::string& text,
                                SplitPattern pattern = SplitPattern::kGpt2) {
  Pretokenizer pre(pattern);
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

using Pieces = std::vector<std::string>;

// Each expectation follows the Llama-3 pattern's alternatives by hand, leftmost alternative first.
TEST(Pretokenize, Llama3SplitPattern) {
  const auto llama = [](const std::string& t) { return pieces(t, SplitPattern::kLlama3); };
  EXPECT_EQ(llama("abc1234567"), (Pieces{"abc", "123", "456", "7"}));  // \p{N}{1,3}
  EXPECT_EQ(llama(" 1234"), (Pieces{" ", "123", "4"}));          // a space never joins a number
  EXPECT_EQ(llama("HE'S here"), (Pieces{"HE", "'S", " here"}));  // (?i:'s)
  EXPECT_EQ(llama("she'LL'Ve"), (Pieces{"she", "'LL", "'Ve"}));
  EXPECT_EQ(llama("a\n\n\nb"), (Pieces{"a", "\n\n\n", "b"}));  // \s*[\r\n]+
  EXPECT_EQ(llama("x  \n  y"), (Pieces{"x", "  \n", " ", " y"}));
  EXPECT_EQ(llama("foo!!\r\n"), (Pieces{"foo", "!!\r\n"}));  // punctuation keeps its newlines
  EXPECT_EQ(llama("\tfoo"), (Pieces{"\tfoo"}));  // any non-letter, non-newline may lead a word
  EXPECT_EQ(llama("...hello"), (Pieces{"...", "hello"}));
  EXPECT_EQ(llama("end  "), (Pieces{"end", "  "}));  // trailing spaces: \s+(?!\S)
  EXPECT_EQ(llama("Привет, мир"), (Pieces{"Привет", ",", " мир"}));
  EXPECT_EQ(llama("東京タワー 😀😀 ok"), (Pieces{"東京タワー", " 😀😀", " ok"}));
  // Qwen2's differs only in single digits.
  EXPECT_EQ(pieces("x12345", SplitPattern::kQwen2), (Pieces{"x", "1", "2", "3", "4", "5"}));
  EXPECT_EQ(pieces("HE'S", SplitPattern::kQwen2), (Pieces{"HE", "'S"}));
  // GPT-2's has no case folding: "'S" is punctuation then a letter there.
  EXPECT_EQ(pieces("HE'S"), (Pieces{"HE", "'", "S"}));
}

// Note [split patterns]: \s is White_Space (U+180E MONGOLIAN VOWEL SEPARATOR is a format
// character, so "\u180e\u180e" is punctuation-like: one piece), and letters and numbers of
// Unicode 15-16 are \p{L} / \p{N} (U+1C89 CYRILLIC CAPITAL LETTER TJE, Unicode 16; U+1E4F0..
// NAG MUNDARI DIGITs, Unicode 15).
TEST(Pretokenize, ClassesAreTokenizersOwn) {
  const std::string mvs = "\u180e", tje = "\u1c89";
  EXPECT_EQ(pieces("a" + mvs + mvs + "b", SplitPattern::kLlama3), (Pieces{"a", mvs + mvs, "b"}));
  EXPECT_EQ(pieces("a" + mvs + mvs + "b"), (Pieces{"a", mvs + mvs, "b"}));
  EXPECT_EQ(pieces("x" + tje + "y", SplitPattern::kLlama3), (Pieces{"x" + tje + "y"}));
  const std::string digits = "\U0001E4F0\U0001E4F1\U0001E4F2\U0001E4F3";
  EXPECT_EQ(pieces(digits, SplitPattern::kLlama3),
            (Pieces{digits.substr(0, 12), digits.substr(12)}));
}

TEST(Pretokenize, PatternsByNameAndText) {
  for (SplitPattern p : {SplitPattern::kGpt2, SplitPattern::kLlama3, SplitPattern::kQwen2}) {
    EXPECT_EQ(split_pattern_from_name(split_pattern_name(p)), p);
    EXPECT_EQ(split_pattern_from_regex(split_pattern_regex(p)), p);
  }
  EXPECT_EQ(
      std::string(split_pattern_regex(SplitPattern::kLlama3)),
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)");
  EXPECT_FALSE(split_pattern_from_name("gpt4").has_value());
  EXPECT_FALSE(split_pattern_from_regex(R"(\s+)").has_value());
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

// A Llama-3-shaped tokenizer.json made by hand: byte b has id b + 3 (its byte-level character),
// merges h+e, l+l, he+ll, hell+o, 1+2, 12+3; " hello" is a token no merge builds (so only
// ignore_merges reaches it); three added tokens and a template that puts <|begin_of_text|> first.
nlohmann::ordered_json llama_style_json() {
  using nlohmann::ordered_json;
  ordered_json vocab = ordered_json::object();
  for (int b = 0; b < 256; ++b) vocab[bytes_to_token_string(std::string(1, char(b)))] = b + 3;
  int32_t next = 259;
  for (const char* t : {"he", "ll", "hell", "hello", "12", "123", "\xC4\xA0hello"})
    vocab[t] = next++;
  ordered_json merges = ordered_json::array();  // as [left, right] arrays, as tokenizers writes
  for (const auto& [a, b] : std::vector<std::pair<const char*, const char*>>{
           {"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {"1", "2"}, {"12", "3"}}) {
    merges.push_back(ordered_json::array({a, b}));
  }
  const auto added = [](int id, const char* content, bool special) {
    return ordered_json{{"id", id},          {"content", content}, {"single_word", false},
                        {"lstrip", false},   {"rstrip", false},    {"normalized", !special},
                        {"special", special}};
  };
  const ordered_json bos = {{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}};
  const ordered_json post = {
      {"type", "Sequence"},
      {"processors",
       {{{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}},
        {{"type", "TemplateProcessing"},
         {"single", {bos, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
         {"pair", ordered_json::array()},
         {"special_tokens",
          {{"<|begin_of_text|>",
            {{"id", "<|begin_of_text|>"}, {"ids", {0}}, {"tokens", {"<|begin_of_text|>"}}}}}}}}}};
  return {
      {"version", "1.0"},
      {"added_tokens",
       {added(0, "<|begin_of_text|>", true), added(1, "<|end_of_text|>", true),
        added(2, "<tool>", false)}},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern", {{"Regex", split_pattern_regex(SplitPattern::kLlama3)}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"},
           {"add_prefix_space", false},
           {"trim_offsets", true},
           {"use_regex", false}}}}}},
      {"post_processor", post},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"ignore_merges", true}, {"vocab", vocab}, {"merges", merges}}}};
}

int32_t id_of(char c) { return static_cast<unsigned char>(c) + 3; }

TEST(Tokenizer, ReadsLlama3StyleFiles) {
  Tokenizer tok = Tokenizer::from_json_text(llama_style_json().dump(), "llama.json");
  EXPECT_EQ(tok.spec().pattern, SplitPattern::kLlama3);
  EXPECT_EQ(tok.vocab_size(), 266);
  EXPECT_EQ(tok.encode("hello"), (std::vector<int32_t>{262}));   // h+e, l+l, he+ll, hell+o
  EXPECT_EQ(tok.encode(" hello"), (std::vector<int32_t>{265}));  // ignore_merges: whole
  EXPECT_EQ(tok.encode(" hellos"), (std::vector<int32_t>{id_of(' '), 262, id_of('s')}));
  EXPECT_EQ(tok.encode("12345"), (std::vector<int32_t>{264, id_of('4'), id_of('5')}));
  // Added tokens, special or not, are cut out before pre-tokenization.
  EXPECT_EQ(tok.encode("a<tool>b<|end_of_text|>"),
            (std::vector<int32_t>{id_of('a'), 2, id_of('b'), 1}));
  // The template: BOS first, only when asked for.
  EXPECT_EQ(tok.encode_with_template("hello"), (std::vector<int32_t>{0, 262}));
  EXPECT_EQ(tok.encode_with_template(""), (std::vector<int32_t>{0}));
  EXPECT_EQ(tok.encode("<|begin_of_text|>hello"), (std::vector<int32_t>{0, 262}));
}

TEST(Tokenizer, IgnoreMergesFalseMergesEveryPiece) {
  nlohmann::ordered_json j = llama_style_json();
  j["model"]["ignore_merges"] = false;
  Tokenizer tok = Tokenizer::from_json_text(j.dump(), "llama.json");
  EXPECT_EQ(tok.encode(" hello"), (std::vector<int32_t>{id_of(' '), 262}));
  EXPECT_EQ(tok.encode("hello"), (std::vector<int32_t>{262}));
}

TEST(Tokenizer, Qwen2PatternSplitsEveryDigit) {
  nlohmann::ordered_json j = llama_style_json();
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] =
      split_pattern_regex(SplitPattern::kQwen2);
  j["post_processor"] = nullptr;
  Tokenizer tok = Tokenizer::from_json_text(j.dump(), "qwen.json");
  EXPECT_EQ(tok.encode_with_template("123"),
            (std::vector<int32_t>{id_of('1'), id_of('2'), id_of('3')}));
}

// Note [NFC before pre-tokenization]: with a {"type": "NFC"} normalizer (Qwen2's files), text is
// composed before it is split and merged; NFC forms and their decomposed spellings encode alike.
TEST(Tokenizer, NfcNormalizerComposesBeforeEncoding) {
  nlohmann::ordered_json j = llama_style_json();
  j["normalizer"] = {{"type", "NFC"}};
  Tokenizer tok = Tokenizer::from_json_text(j.dump(), "qwen.json");
  Tokenizer plain = Tokenizer::from_json_text(llama_style_json().dump(), "llama.json");
  EXPECT_TRUE(tok.spec().nfc);
  EXPECT_FALSE(plain.spec().nfc);
  const std::string composed = "caf\xC3\xA9";     // café, U+00E9
  const std::string decomposed = "cafe\xCC\x81";  // e + U+0301 COMBINING ACUTE ACCENT
  const std::string hangul = "\xED\x95\x9C";      // 한 U+D55C
  const std::string jamo = "\xE1\x84\x92\xE1\x85\xA1\xE1\x86\xAB";  // ᄒ ᅡ ᆫ
  EXPECT_EQ(nfc_normalize(decomposed), composed);
  EXPECT_EQ(nfc_normalize(jamo), hangul);
  EXPECT_EQ(nfc_normalize(composed), composed);
  // U+212B ANGSTROM SIGN is canonically A-ring (U+00C5); NFC does not fold compatibility forms
  // (U+FB01 ﬁ stays).
  EXPECT_EQ(nfc_normalize("\xE2\x84\xAB"), "\xC3\x85");
  EXPECT_EQ(nfc_normalize("\xEF\xAC\x81"), "\xEF\xAC\x81");
  // Bytes outside well-formed UTF-8 are kept and split the runs around them.
  EXPECT_EQ(nfc_normalize("e\xCC\x81\xFF"
                          "e\xCC\x81\xC0"),
            "\xC3\xA9\xFF\xC3\xA9\xC0");
  EXPECT_EQ(tok.encode(decomposed), tok.encode(composed));
  EXPECT_EQ(tok.encode(jamo), tok.encode(hangul));
  EXPECT_NE(plain.encode(decomposed), plain.encode(composed));  // without it, bytes differ
  EXPECT_EQ(tok.decode(tok.encode(decomposed)), composed);
  // Added tokens matched on the raw text stay where they are; the text around them is composed.
  EXPECT_EQ(tok.encode(decomposed + "<|end_of_text|>" + decomposed),
            tok.encode(composed + "<|end_of_text|>" + composed));
  // The normalizer is written back.
  Tokenizer back = Tokenizer::from_json_text(tok.to_json_text(), "back.json");
  EXPECT_TRUE(back.spec().nfc);
  EXPECT_EQ(back.to_json_text(), tok.to_json_text());
  EXPECT_NE(tok.to_json_text().find("\"type\": \"NFC\""), std::string::npos);
}

TEST(Tokenizer, Llama3StyleRoundTripsMixedScripts) {
  Tokenizer tok = Tokenizer::from_json_text(llama_style_json().dump(), "llama.json");
  std::string text;
  for (const char* part :
       {"Hello, world! It'S 2024-12-04: 1234567890 apples\r\n", "\tindented line  \n\n",
        "東京タワーは333メートル。", " Привет, МИР!  ", "Ünïcödé ελληνικά עברית العربية ١٢٣٤\n",
        "emoji 😀👍🏽🇩🇪 and 👨‍👩‍👧 mix",
        "<|end_of_text|> <tool>call</tool>", "\u00a0\u3000 trailing   "}) {
    text += part;
  }
  const std::vector<int32_t> ids = tok.encode_with_template(text);
  EXPECT_EQ(ids[0], 0);
  EXPECT_EQ(tok.decode(ids), "<|begin_of_text|>" + text);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 1), 1);  // <|end_of_text|>
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 2), 1);  // <tool>, but not </tool>
  std::mt19937 rng(11);
  for (int trial = 0; trial < 100; ++trial) {
    const size_t from = rng() % text.size();
    std::string s = text.substr(from, rng() % 120);
    for (int k = 0; k < 3; ++k) s.insert(rng() % (s.size() + 1), 1, static_cast<char>(rng()));
    EXPECT_EQ(tok.decode(tok.encode(s)), s) << "trial " << trial;
  }
}

// gtron writes the file back with its pattern, flags and template, so it round-trips.
TEST(Tokenizer, Llama3StyleJsonRoundTrips) {
  Tokenizer tok = Tokenizer::from_json_text(llama_style_json().dump(), "llama.json");
  const std::string written = tok.to_json_text();
  Tokenizer back = Tokenizer::from_json_text(written, "written.json");
  EXPECT_EQ(back.to_json_text(), written);
  const nlohmann::json j = nlohmann::json::parse(written);
  EXPECT_EQ(j["pre_tokenizer"]["type"], "Sequence");
  EXPECT_EQ(j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"],
            split_pattern_regex(SplitPattern::kLlama3));
  EXPECT_EQ(j["pre_tokenizer"]["pretokenizers"][1]["use_regex"], false);
  EXPECT_EQ(j["model"]["ignore_merges"], true);
  EXPECT_EQ(j["post_processor"]["processors"][1]["type"], "TemplateProcessing");
  EXPECT_EQ(j["added_tokens"][2]["special"], false);
  EXPECT_EQ(j["added_tokens"][2]["normalized"], true);
  const std::string text = "It's 12345 hello  世界\n";
  EXPECT_EQ(back.encode_with_template(text), tok.encode_with_template(text));
}

// HF's order: added tokens with normalized false are cut from the whole text first, so
// "<|end_of_text|>" wins over a normalized token that starts earlier and overlaps it.
TEST(Tokenizer, UnnormalizedAddedTokensAreCutFirst) {
  nlohmann::ordered_json j = llama_style_json();
  j["added_tokens"][2]["content"] = "x<|end";
  Tokenizer tok = Tokenizer::from_json_text(j.dump(), "llama.json");
  EXPECT_EQ(tok.encode("x<|end_of_text|>"), (std::vector<int32_t>{id_of('x'), 1}));
  EXPECT_EQ(tok.encode("x<|endx"), (std::vector<int32_t>{2, id_of('x')}));
}

TEST(Tokenizer, RefusesOtherPreTokenizersNamingTheField) {
  auto message = [](const std::function<void(nlohmann::ordered_json&)>& edit) {
    nlohmann::ordered_json j = llama_style_json();
    edit(j);
    try {
      Tokenizer::from_json_text(j.dump(), "t.json");
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const auto split = [](nlohmann::ordered_json& j) -> nlohmann::ordered_json& {
    return j["pre_tokenizer"]["pretokenizers"][0];
  };
  EXPECT_NE(message([&](auto& j) {
              split(j)["behavior"] = "Removed";
            }).find("pre_tokenizer.pretokenizers[0].behavior \"Removed\""),
            std::string::npos);
  EXPECT_NE(message([&](auto& j) {
              split(j)["invert"] = true;
            }).find("pre_tokenizer.pretokenizers[0].invert true"),
            std::string::npos);
  EXPECT_NE(message([&](auto& j) {
              split(j)["pattern"]["Regex"] = R"(\s+)";
            }).find("pre_tokenizer.pretokenizers[0].pattern.Regex"),
            std::string::npos);
  EXPECT_NE(message([&](auto& j) {
              split(j)["pattern"] = {{"String", " "}};
            }).find("pre_tokenizer.pretokenizers[0].pattern"),
            std::string::npos);
  EXPECT_NE(message([](auto& j) {
              j["pre_tokenizer"]["pretokenizers"][1]["use_regex"] = true;
            }).find("pre_tokenizer.pretokenizers[1].use_regex true"),
            std::string::npos);
  EXPECT_NE(message([](auto& j) {
              j["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = true;
            }).find("pre_tokenizer.pretokenizers[1].add_prefix_space true"),
            std::string::npos);
  EXPECT_NE(message([](auto& j) {
              j["pre_tokenizer"]["pretokenizers"].erase(1);
            }).find("pre_tokenizer.pretokenizers"),
            std::string::npos);
  EXPECT_NE(message([](auto& j) {
              j["pre_tokenizer"] = {{"type", "Whitespace"}};
            }).find("pre_tokenizer {\"type\":\"Whitespace\"}"),
            std::string::npos);
  EXPECT_NE(message([](auto& j) {
              j["normalizer"] = {{"type", "NFKC"}};
            }).find("normalizer {\"type\":\"NFKC\"} is not supported"),
            std::string::npos);
  EXPECT_NE(message([](auto& j) {
              j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}}}};
            }).find("normalizer {\"normalizers\""),
            std::string::npos);
  EXPECT_NE(message([](auto& j) {
              j["post_processor"] = {{"type", "RobertaProcessing"}};
            }).find("post_processor {\"type\":\"RobertaProcessing\""),
            std::string::npos);
  EXPECT_NE(message([](auto& j) {
              j["post_processor"]["processors"][1]["single"][0]["SpecialToken"]["id"] = "<s>";
            }).find("post_processor.processors[1].single item"),
            std::string::npos);
  EXPECT_NE(message([](auto& j) {
              j["decoder"] = {{"type", "Metaspace"}};
            }).find("decoder"),
            std::string::npos);
  EXPECT_EQ(message([](auto&) {}), "no error");
}

TEST(BpeTrain, Llama3PatternTrainsAndIsWritten) {
  BpeTrainOptions o;
  o.vocab_size = 300;
  o.specials = {"<|end_of_text|>"};
  o.pattern = SplitPattern::kLlama3;
  std::string text;
  for (int i = 0; i < 20; ++i) text += "Call 5551234567 NOW'S the time\r\n";
  TokenizerSpec spec = train_bpe({text}, o);
  EXPECT_EQ(spec.pattern, SplitPattern::kLlama3);
  for (const auto& t : spec.token_bytes) {  // digits come in threes, no space before them
    EXPECT_EQ(t->find("5551"), std::string::npos) << *t;
    EXPECT_EQ(t->find(" 5"), std::string::npos) << *t;
  }
  Tokenizer tok(spec, "test");
  EXPECT_EQ(tok.decode(tok.encode(text)), text);
  Tokenizer back = Tokenizer::from_json_text(tok.to_json_text(), "t.json");
  EXPECT_EQ(back.spec().pattern, SplitPattern::kLlama3);
  EXPECT_EQ(back.encode(text), tok.encode(text));
}

TEST(BpeTrain, RefusesBadOptions) {
  EXPECT_THROW(train("abc", 256, {"<|endoftext|>"}), UserError);
  EXPECT_THROW(train("abc", 300, {"x", "x"}), UserError);
  EXPECT_THROW(train("abc", 300, {"\xFF"}), UserError);
  EXPECT_NO_THROW(train("abc", 257, {"<|endoftext|>"}));
}

}  // namespace
}  // namespace gtron

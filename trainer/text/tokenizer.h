// Byte-level BPE tokenizer (GPT-2 style) and its file, Hugging Face tokenizers' tokenizer.json.
//
// Encoding a text:
//   1. Special tokens (added_tokens) are cut out first, leftmost occurrence first and the longest
//      at one position; each becomes its own id and is never split or merged.
//   2. Every stretch between them is pre-tokenized (trainer/text/pretokenize.h, GPT-2's split
//      pattern); with add_prefix_space a stretch that does not start with a space gets one.
//   3. Each piece starts as one token per byte and is merged by BPE: repeatedly the adjacent pair
//      with the lowest merge rank is replaced by its merged token (equal ranks: leftmost first),
//      until no adjacent pair has a merge. This is tokenizers' BPE model, so both encode alike.
// Decoding concatenates the bytes of the tokens (a special token gives its content).
//
// Note [token ids]
// Ids are whatever the file says. A tokenizer gtron trains (trainer/text/bpe_train.h) gives id b to
// the single byte b (0..255, so a byte-level model's tokens mean the same), then one id per merge
// in merge order, then the special tokens in the order given.
//
// Supported tokenizer.json: model.type "BPE" without dropout, byte fallback or subword
// prefix/suffix; pre_tokenizer ByteLevel (use_regex true); decoder ByteLevel or null; normalizer
// null; added tokens without lstrip/rstrip/single_word. Anything else is refused (UserError).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "trainer/text/pretokenize.h"

namespace gtron {

struct SpecialToken {
  std::string content;
  int32_t id = 0;
};

// The contents of a byte-level BPE tokenizer, as trained or as read from tokenizer.json.
struct TokenizerSpec {
  // token_bytes[id]: the bytes of token `id`; a special token's entry is its content; ids that no
  // token has are nullopt.
  std::vector<std::optional<std::string>> token_bytes;
  std::vector<std::pair<int32_t, int32_t>> merges;  // rank order; each pair's tokens concatenate
  std::vector<SpecialToken> specials;
  bool add_prefix_space = false;
  bool ignore_merges = false;  // a piece that is itself a token is taken whole (tokenizers option)
};

// The leftmost occurrence of any special token in text[pos..] (the longest at one position), as
// (position, index into specials); position npos when there is none.
std::pair<size_t, size_t> find_special(std::string_view text, size_t pos,
                                       const std::vector<SpecialToken>& specials);

// Not thread-safe: encode() fills a cache of encoded pieces. Movable.
class Tokenizer {
 public:
  // Throws UserError (naming `what`) if the spec is inconsistent: a merge whose concatenation has
  // no token, a special without its id, a duplicated token.
  Tokenizer(TokenizerSpec spec, const std::string& what);

  // Reads tokenizer.json; every refusal is a UserError naming the file.
  static Tokenizer load(const std::string& path);
  static Tokenizer from_json_text(const std::string& text, const std::string& what);
  // The tokenizer.json text (deterministic: same tokenizer, same bytes).
  std::string to_json_text() const;
  // Writes to_json_text() atomically.
  void save(const std::string& path) const;

  const TokenizerSpec& spec() const { return spec_; }
  int64_t vocab_size() const { return static_cast<int64_t>(spec_.token_bytes.size()); }
  std::optional<int32_t> special_id(const std::string& content) const;

  // Appends the ids of `text` to *out. A byte with no token of its own is a UserError.
  void encode_append(std::string_view text, std::vector<int32_t>* out);
  std::vector<int32_t> encode(std::string_view text);
  // Ids outside the vocabulary (e.g. a padded-vocab id a model sampled) decode to U+FFFD.
  std::string decode(const int32_t* ids, int64_t n) const;
  std::string decode(const std::vector<int32_t>& ids) const;

 private:
  void encode_stretch(std::string_view text, std::vector<int32_t>* out);
  void encode_piece(std::string_view piece, std::vector<int32_t>* out);
  void merge_piece(std::string_view piece, std::vector<int32_t>* out) const;

  TokenizerSpec spec_;
  std::string what_;
  int32_t byte_id_[256];
  std::unordered_map<std::string, int32_t> id_of_bytes_;            // non-special tokens
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> rank_;  // (left, right) -> rank, id
  Pretokenizer pretokenizer_;
  std::unordered_map<std::string, std::vector<int32_t>> cache_;  // piece -> ids
};

}  // namespace gtron

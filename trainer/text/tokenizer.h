// Byte-level BPE tokenizer (GPT-2, Llama-3 and Qwen2 style) and its file, Hugging Face
// tokenizers' tokenizer.json.
//
// Encoding a text:
//   1. Added tokens (added_tokens, special or not) are cut out first, leftmost occurrence first
//      and the longest at one position; each becomes its own id and is never split or merged.
//      As in tokenizers, this runs in two passes: the tokens with normalized false over the whole
//      text, then those with normalized true over the stretches left, after the file's
//      normalizer (none, or NFC: Note [NFC before pre-tokenization] in trainer/text/normalize.h)
//      has normalized each stretch.
//   2. Every stretch between them is pre-tokenized (trainer/text/pretokenize.h, the file's split
//      pattern); with add_prefix_space a stretch that does not start with a space gets one.
//   3. Each piece starts as one token per byte and is merged by BPE: repeatedly the adjacent pair
//      with the lowest merge rank is replaced by its merged token (equal ranks: leftmost first),
//      until no adjacent pair has a merge. With ignore_merges, a piece that is itself a token is
//      that one token, merges or not. This is tokenizers' BPE model, so both encode alike.
//   4. encode_with_template also puts the post-processor's template around the ids (tokenizers'
//      add_special_tokens: Llama-3's <|begin_of_text|> in front).
// Decoding concatenates the bytes of the tokens (an added token gives its content).
//
// Note [token ids]
// Ids are whatever the file says, within bounds: a tokenizer keeps one entry per id up to the
// largest (token_bytes; holes are nullopt), so an id decides how much is allocated. Reading
// tokenizer.json therefore checks every id it gives (model.vocab, added_tokens, the
// post-processor template's special_tokens) before anything is sized by it: an integer in
// [0, min(N + 2^20, 2^24)), N the number of tokens the file lists (model.vocab's entries plus
// added_tokens'). So the table holds the file's tokens and at most 2^20 holes (about 40 MB); 2^24
// is 64 times the 262,144 tokens of Gemma 3, the largest vocabulary in common use. Anything else
// is a UserError naming the file and the field (e.g. model.vocab["ab"], added_tokens[0].id).
// A tokenizer gtron trains (trainer/text/bpe_train.h) gives id b to the single byte b (0..255, so a
// byte-level model's tokens mean the same), then one id per merge in merge order, then the special
// tokens in the order given.
//
// Supported tokenizer.json: model.type "BPE" without dropout, byte fallback or subword
// prefix/suffix, ignore_merges true or false; pre_tokenizer ByteLevel (use_regex true, the GPT-2
// pattern) or Sequence [Split (a pattern of Note [split patterns], behavior Isolated, invert
// false), ByteLevel (use_regex false, add_prefix_space false)]; post_processor null, ByteLevel,
// TemplateProcessing or a Sequence of those; decoder ByteLevel or null; normalizer null or NFC;
// added tokens without lstrip/rstrip/single_word. Anything else is refused (UserError naming the
// field).
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

// An added token (tokenizer.json's added_tokens): cut out of the text before pre-tokenization.
struct SpecialToken {
  std::string content;
  int32_t id = 0;
  bool special = true;      // tokenizers' flag (kept in the file; encoding is the same)
  bool normalized = false;  // matched in the second pass (step 1 above)
};

// The contents of a byte-level BPE tokenizer, as trained or as read from tokenizer.json.
struct TokenizerSpec {
  // token_bytes[id]: the bytes of token `id`; a special token's entry is its content; ids that no
  // token has are nullopt.
  std::vector<std::optional<std::string>> token_bytes;
  std::vector<std::pair<int32_t, int32_t>> merges;  // rank order; each pair's tokens concatenate
  std::vector<SpecialToken> specials;               // the added tokens, special or not
  SplitPattern pattern = SplitPattern::kGpt2;
  bool add_prefix_space = false;  // gpt2 pattern only
  bool ignore_merges = false;  // a piece that is itself a token is taken whole (tokenizers option)
  bool nfc = false;            // normalizer {"type": "NFC"} (Note [NFC before pre-tokenization])
  // The post-processor's single template: ids before and after the text's (e.g. Llama-3's BOS).
  std::vector<int32_t> template_before, template_after;
  // The file's post_processor object, written back as it was ("" = null). REQUIRES: it means
  // template_before/template_after.
  std::string post_processor_json;
};

// The leftmost occurrence of any special token in text[pos..] (the longest at one position), as
// (position, index into specials); position npos when there is none.
std::pair<size_t, size_t> find_special(std::string_view text, size_t pos,
                                       const std::vector<SpecialToken>& specials);

// Not thread-safe: encode() fills a cache of encoded pieces. Movable.
class Tokenizer {
 public:
  // Throws UserError (naming `what`) if the spec is inconsistent: a merge whose concatenation has
  // no token, a special without its id, a duplicated token, a template id that is no token,
  // add_prefix_space with a pattern other than gpt2.
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
  // encode() inside the post-processor's template (step 4 above).
  std::vector<int32_t> encode_with_template(std::string_view text);
  // The ids that open a document (`gtron prepare`) or a prompt (`gtron sample`): the template's
  // leading ids when the file has a post-processor template (Llama-3's <|begin_of_text|>), else
  // the added token `eot` (GPT-2's and Qwen's <|endoftext|>); nullopt when it has neither.
  std::optional<std::vector<int32_t>> document_start(const std::string& eot) const;
  // Ids outside the vocabulary (e.g. a padded-vocab id a model sampled) decode to U+FFFD.
  std::string decode(const int32_t* ids, int64_t n) const;
  std::string decode(const std::vector<int32_t>& ids) const;

 private:
  void encode_second_pass(std::string_view text, std::vector<int32_t>* out);
  void encode_stretch(std::string_view text, std::vector<int32_t>* out);
  void encode_piece(std::string_view piece, std::vector<int32_t>* out);
  void merge_piece(std::string_view piece, std::vector<int32_t>* out) const;

  TokenizerSpec spec_;
  std::string what_;
  int32_t byte_id_[256];
  std::unordered_map<std::string, int32_t> id_of_bytes_;            // non-special tokens
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> rank_;  // (left, right) -> rank, id
  std::vector<SpecialToken> first_pass_, second_pass_;              // added tokens by normalized
  Pretokenizer pretokenizer_;
  std::unordered_map<std::string, std::vector<int32_t>> cache_;  // piece -> ids
};

}  // namespace gtron

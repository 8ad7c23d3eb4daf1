// Pre-tokenization: text is cut into pieces by a split pattern before BPE runs on each piece, so
// merges never cross a word, number or punctuation boundary.
//
// Note [split patterns]
// gtron knows three patterns, the ones Hugging Face tokenizers' files use (tokenizer.json stores
// the pattern's text; SplitPattern names it):
//   gpt2    's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//           (the ByteLevel pre-tokenizer's own, use_regex true)
//   llama3  (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//           ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//   qwen2   as llama3 with \p{N} for \p{N}{1,3} (Qwen2, Qwen2.5 and Qwen3 use it)
//           (llama3 and qwen2 come as a Split pre-tokenizer, behavior Isolated, then ByteLevel
//           with use_regex false)
// A piece is a match or a stretch between two matches (tokenizers' "Isolated" behavior); these
// patterns match every valid UTF-8 character, so in practice the pieces are the matches.
//
// Matching: PCRE2 in UTF mode with Unicode properties (\p{L}, \p{N} and case folding for (?i:)
// are Unicode), JIT-compiled where PCRE2 has a JIT, searching from the end of the previous piece
// as tokenizers' regex engine (Oniguruma) does. Two differences are rewritten away before PCRE2
// compiles a pattern, so that every code point splits as in tokenizers 0.23 (checked for all of
// them, each inside a string of letters, digits, apostrophes, spaces and line breaks, against
// tokenizers' pre_tokenize_str for the gpt2 and llama3 patterns):
//   - PCRE2's \s is "Z, or tab, LF, VT, FF, CR, NEL, U+180E"; Oniguruma's is the Unicode
//     White_Space property (U+180E has not been a space since Unicode 6.3): \s becomes
//     \p{White_Space}, \S its negation.
//   - PCRE2 10.42 knows Unicode 14, Oniguruma 16: \p{L} and \p{N} gain the letters and numbers
//     assigned since (a table in pretokenize.cc; redundant under a newer PCRE2).
// Bytes that are not valid UTF-8 cannot be matched (PCRE2_MATCH_INVALID_UTF): each maximal run of
// them between two matches becomes a piece of its own, so any byte string still splits into
// pieces that concatenate back to it.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

struct pcre2_real_code_8;
struct pcre2_real_match_data_8;
struct pcre2_real_match_context_8;
struct pcre2_real_jit_stack_8;

namespace gtron {

enum class SplitPattern { kGpt2, kLlama3, kQwen2 };

// The pattern's text, as tokenizer.json holds it (Note [split patterns]).
const char* split_pattern_regex(SplitPattern pattern);
// "gpt2", "llama3", "qwen2".
const char* split_pattern_name(SplitPattern pattern);
// "gpt2|llama3|qwen2", for messages.
std::string split_pattern_names();
std::optional<SplitPattern> split_pattern_from_name(std::string_view name);
std::optional<SplitPattern> split_pattern_from_regex(std::string_view regex);

// Owns the compiled pattern and its match state. Not thread-safe (one per thread); movable.
class Pretokenizer {
 public:
  explicit Pretokenizer(SplitPattern pattern = SplitPattern::kGpt2);
  ~Pretokenizer();
  Pretokenizer(Pretokenizer&& other) noexcept;
  Pretokenizer& operator=(Pretokenizer&& other) noexcept;
  Pretokenizer(const Pretokenizer&) = delete;
  Pretokenizer& operator=(const Pretokenizer&) = delete;

  // The piece of `text` that starts at byte `pos` (REQUIRES pos < text.size()): returns its end.
  size_t piece_end(std::string_view text, size_t pos);

  // Calls fn(piece) for every piece of `text`, in order.
  template <typename Fn>
  void split(std::string_view text, Fn&& fn) {
    for (size_t pos = 0; pos < text.size();) {
      const size_t end = piece_end(text, pos);
      fn(text.substr(pos, end - pos));
      pos = end;
    }
  }

 private:
  void release();

  pcre2_real_code_8* code_ = nullptr;
  pcre2_real_match_data_8* match_ = nullptr;
  pcre2_real_match_context_8* context_ = nullptr;
  pcre2_real_jit_stack_8* stack_ = nullptr;
  bool jit_ = false;
};

}  // namespace gtron

// GPT-2 pre-tokenization: text is cut into pieces by GPT-2's split pattern before BPE runs on each
// piece, so merges never cross a word, number or punctuation boundary.
//
// Note [GPT-2 split pattern]
// The pattern, as Hugging Face tokenizers' ByteLevel pre-tokenizer uses it:
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// matched with PCRE2 in UTF mode with Unicode properties (\s, \p{L}, \p{N} are Unicode classes),
// JIT-compiled. Every valid UTF-8 character is matched by one of the alternatives, so the pieces
// cover the text. Bytes that are not valid UTF-8 cannot be matched (PCRE2_MATCH_INVALID_UTF): each
// maximal run of them between two matches becomes a piece of its own, so any byte string still
// splits into pieces that concatenate back to it.
#pragma once

#include <cstddef>
#include <string_view>

struct pcre2_real_code_8;
struct pcre2_real_match_data_8;
struct pcre2_real_match_context_8;
struct pcre2_real_jit_stack_8;

namespace gtron {

// Owns the compiled pattern and its match state. Not thread-safe (one per thread); movable.
class Pretokenizer {
 public:
  Pretokenizer();
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
};

}  // namespace gtron

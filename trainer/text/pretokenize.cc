#include "trainer/text/pretokenize.h"

#include <pcre2.h>

#include <utility>

#include "model/check.h"

namespace gtron {
namespace {

struct KnownPattern {
  SplitPattern pattern;
  const char* name;
  const char* regex;
};

constexpr KnownPattern kPatterns[] = {
    {SplitPattern::kGpt2, "gpt2",
     R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)"},
    {SplitPattern::kLlama3, "llama3",
     R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
    {SplitPattern::kQwen2, "qwen2",
     R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
};

const KnownPattern& known(SplitPattern pattern) {
  for (const KnownPattern& k : kPatterns) {
    if (k.pattern == pattern) return k;
  }
  GTRON_CHECK(false, "unknown SplitPattern ", static_cast<int>(pattern));
}

// Letters and numbers that Unicode 15.0-16.0 added where Unicode 14 (PCRE2 10.42's tables) has
// unassigned code points. tokenizers' Oniguruma knows them (Unicode 16); found by splitting every
// code point in context under both engines and keeping where they differ.
constexpr const char* kNewerLetters =
    R"(\x{1C89}-\x{1C8A}\x{A7CB}-\x{A7CD}\x{A7DA}-\x{A7DC}\x{105C0}-\x{105F3}\x{10D4A}-\x{10D65})"
    R"(\x{10D6F}-\x{10D85}\x{10EC2}-\x{10EC4}\x{1123F}-\x{11240}\x{11380}-\x{11389}\x{1138B})"
    R"(\x{1138E}\x{11390}-\x{113B5}\x{113B7}\x{113D1}\x{113D3}\x{11BC0}-\x{11BE0}\x{11F02})"
    R"(\x{11F04}-\x{11F10}\x{11F12}-\x{11F33}\x{1342F}\x{13441}-\x{13446}\x{13460}-\x{143FA})"
    R"(\x{16100}-\x{1611D}\x{16D40}-\x{16D6C}\x{18CFF}\x{1B132}\x{1B155}\x{1DF25}-\x{1DF2A})"
    R"(\x{1E030}-\x{1E06D}\x{1E4D0}-\x{1E4EB}\x{1E5D0}-\x{1E5ED}\x{1E5F0}\x{2B739})"
    R"(\x{2EBF0}-\x{2EE5D}\x{31350}-\x{323AF})";
constexpr const char* kNewerNumbers =
    R"(\x{10D40}-\x{10D49}\x{116D0}-\x{116E3}\x{11BF0}-\x{11BF9}\x{11F50}-\x{11F59})"
    R"(\x{16130}-\x{16139}\x{16D70}-\x{16D79}\x{1CCF0}-\x{1CCF9}\x{1D2C0}-\x{1D2D3})"
    R"(\x{1E4F0}-\x{1E4F9}\x{1E5F1}-\x{1E5FA})";

// The members a class escape stands for in tokenizers' engine, as the inside of a PCRE2 class.
std::string class_members(char escape) {
  switch (escape) {
    case 's':
      return R"(\p{White_Space})";
    case 'L':
      return str_cat(R"(\p{L})", kNewerLetters);
    case 'N':
      return str_cat(R"(\p{N})", kNewerNumbers);
  }
  GTRON_CHECK(false, "no class for escape ", escape);
}

// Note [split patterns]: rewrites \s, \S, \p{L} and \p{N} (outside and inside [...]) to mean
// what they mean in tokenizers' Oniguruma. The patterns are gtron's own, so the rewrite need
// not handle nested classes or escapes it does not know.
std::string for_pcre2(const std::string& regex) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < regex.size(); ++i) {
    const char c = regex[i];
    if (c != '\\' || i + 1 == regex.size()) {
      if (c == '[') in_class = true;
      if (c == ']') in_class = false;
      out += c;
      continue;
    }
    const char e = regex[++i];
    char escape = 0;
    bool negated = false;
    if (e == 's' || e == 'S') {
      escape = 's';
      negated = e == 'S';
    } else if (e == 'p' && regex.compare(i + 1, 3, "{L}") == 0) {
      escape = 'L';
    } else if (e == 'p' && regex.compare(i + 1, 3, "{N}") == 0) {
      escape = 'N';
    }
    if (escape == 0) {
      out += std::string{'\\', e};
      continue;
    }
    if (escape != 's') i += 3;
    GTRON_CHECK(!(negated && in_class), "\\S inside a class in ", regex);
    const std::string members = class_members(escape);
    out += in_class ? members : str_cat(negated ? "[^" : "[", members, "]");
  }
  return out;
}

// The JIT stack grows from 32 KiB as needed; `\s+(?!\S)` backtracks over long runs of spaces.
constexpr size_t kJitStackMin = 32 << 10;
constexpr size_t kJitStackMax = 256 << 20;

}  // namespace

const char* split_pattern_regex(SplitPattern pattern) { return known(pattern).regex; }

const char* split_pattern_name(SplitPattern pattern) { return known(pattern).name; }

std::string split_pattern_names() {
  std::string out;
  for (const KnownPattern& k : kPatterns) out += (out.empty() ? "" : "|") + std::string(k.name);
  return out;
}

std::optional<SplitPattern> split_pattern_from_name(std::string_view name) {
  for (const KnownPattern& k : kPatterns) {
    if (name == k.name) return k.pattern;
  }
  return std::nullopt;
}

std::optional<SplitPattern> split_pattern_from_regex(std::string_view regex) {
  for (const KnownPattern& k : kPatterns) {
    if (regex == k.regex) return k.pattern;
  }
  return std::nullopt;
}

Pretokenizer::Pretokenizer(SplitPattern pattern) {
  const std::string regex = for_pcre2(split_pattern_regex(pattern));
  int error = 0;
  PCRE2_SIZE offset = 0;
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(regex.c_str()), regex.size(),
                        PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &offset, nullptr);
  GTRON_CHECK(code_ != nullptr, "pcre2_compile failed with code ", error, " at ", offset);
  jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;  // the interpreter where JIT is not
  match_ = pcre2_match_data_create_from_pattern(code_, nullptr);
  context_ = pcre2_match_context_create(nullptr);
  stack_ = pcre2_jit_stack_create(kJitStackMin, kJitStackMax, nullptr);
  GTRON_CHECK(match_ && context_ && stack_, "pcre2 allocation failed");
  pcre2_jit_stack_assign(context_, nullptr, stack_);
}

Pretokenizer::~Pretokenizer() { release(); }

void Pretokenizer::release() {
  if (stack_) pcre2_jit_stack_free(stack_);
  if (context_) pcre2_match_context_free(context_);
  if (match_) pcre2_match_data_free(match_);
  if (code_) pcre2_code_free(code_);
  code_ = nullptr;
  match_ = nullptr;
  context_ = nullptr;
  stack_ = nullptr;
}

Pretokenizer::Pretokenizer(Pretokenizer&& other) noexcept { *this = std::move(other); }

Pretokenizer& Pretokenizer::operator=(Pretokenizer&& other) noexcept {
  if (this != &other) {
    release();
    std::swap(code_, other.code_);
    std::swap(match_, other.match_);
    std::swap(context_, other.context_);
    std::swap(stack_, other.stack_);
    std::swap(jit_, other.jit_);
  }
  return *this;
}

size_t Pretokenizer::piece_end(std::string_view text, size_t pos) {
  GTRON_CHECK(pos < text.size(), "piece_end at ", pos, " of ", text.size());
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const int rc = jit_ ? pcre2_jit_match(code_, subject, text.size(), pos, 0, match_, context_)
                      : pcre2_match(code_, subject, text.size(), pos, 0, match_, context_);
  if (rc == PCRE2_ERROR_NOMATCH) return text.size();  // only invalid UTF-8 is left
  GTRON_CHECK(rc > 0, "pcre2 match failed with code ", rc, " at byte ", pos);
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(match_);
  GTRON_CHECK(ov[1] > ov[0], "empty pre-tokenizer match at byte ", ov[0]);
  return ov[0] > pos ? ov[0] : ov[1];  // a stretch before the match is its own piece
}

}  // namespace gtron

#include "trainer/text/pretokenize.h"

#include <pcre2.h>

#include <utility>

#include "model/check.h"

namespace gtron {
namespace {

constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// The JIT stack grows from 32 KiB as needed; `\s+(?!\S)` backtracks over long runs of spaces.
constexpr size_t kJitStackMin = 32 << 10;
constexpr size_t kJitStackMax = 256 << 20;

}  // namespace

Pretokenizer::Pretokenizer() {
  int error = 0;
  PCRE2_SIZE offset = 0;
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kGpt2Pattern), PCRE2_ZERO_TERMINATED,
                        PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &offset, nullptr);
  GTRON_CHECK(code_ != nullptr, "pcre2_compile failed with code ", error, " at ", offset);
  GTRON_CHECK(pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0, "pcre2_jit_compile failed");
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
  }
  return *this;
}

size_t Pretokenizer::piece_end(std::string_view text, size_t pos) {
  GTRON_CHECK(pos < text.size(), "piece_end at ", pos, " of ", text.size());
  const int rc = pcre2_jit_match(code_, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), pos,
                                 0, match_, context_);
  if (rc == PCRE2_ERROR_NOMATCH) return text.size();  // only invalid UTF-8 is left
  GTRON_CHECK(rc > 0, "pcre2_jit_match failed with code ", rc, " at byte ", pos);
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(match_);
  GTRON_CHECK(ov[1] > ov[0], "empty pre-tokenizer match at byte ", ov[0]);
  return ov[0] > pos ? ov[0] : ov[1];  // a run of invalid bytes before the match is its own piece
}

}  // namespace gtron

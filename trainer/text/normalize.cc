#include "trainer/text/normalize.h"

#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include "model/check.h"

namespace gtron {

namespace {

// The length of the well-formed UTF-8 sequence at s[i] (RFC 3629: no overlong forms, no
// surrogates, nothing above U+10FFFF), or 0 when the byte there starts none.
size_t utf8_length(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  const size_t left = s.size() - i;
  auto cont = [&](size_t k) { return k < left && (b(i + k) & 0xC0) == 0x80; };
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return cont(1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    if (!cont(1) || !cont(2)) return 0;
    const unsigned char c1 = b(i + 1);
    if ((c == 0xE0 && c1 < 0xA0) || (c == 0xED && c1 >= 0xA0)) return 0;  // overlong, surrogate
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (!cont(1) || !cont(2) || !cont(3)) return 0;
    const unsigned char c1 = b(i + 1);
    if ((c == 0xF0 && c1 < 0x90) || (c == 0xF4 && c1 >= 0x90)) return 0;  // overlong, > U+10FFFF
    return 4;
  }
  return 0;
}

const icu::Normalizer2& nfc() {
  static const icu::Normalizer2* n = [] {
    UErrorCode err = U_ZERO_ERROR;
    const icu::Normalizer2* p = icu::Normalizer2::getNFCInstance(err);
    GTRON_CHECK(U_SUCCESS(err) && p != nullptr, "ICU's NFC normalizer: ", u_errorName(err));
    return p;
  }();
  return *n;
}

void append_nfc(std::string_view run, std::string* out) {
  if (run.empty()) return;
  bool ascii = true;
  for (char c : run) ascii = ascii && static_cast<unsigned char>(c) < 0x80;
  if (ascii) {  // ASCII is NFC
    out->append(run);
    return;
  }
  UErrorCode err = U_ZERO_ERROR;
  const icu::UnicodeString u =
      icu::UnicodeString::fromUTF8(icu::StringPiece(run.data(), static_cast<int32_t>(run.size())));
  const icu::UnicodeString n = nfc().normalize(u, err);
  GTRON_CHECK(U_SUCCESS(err), "NFC normalization: ", u_errorName(err));
  n.toUTF8String(*out);
}

}  // namespace

std::string nfc_normalize(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t run = 0;  // start of the current valid run
  for (size_t i = 0; i < text.size();) {
    const size_t n = utf8_length(text, i);
    if (n > 0) {
      i += n;
      continue;
    }
    append_nfc(text.substr(run, i - run), &out);
    out.push_back(text[i]);  // not part of a well-formed sequence: kept as it is
    run = ++i;
  }
  append_nfc(text.substr(run), &out);
  return out;
}

}  // namespace gtron

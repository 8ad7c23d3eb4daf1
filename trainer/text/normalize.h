// Unicode normalization of the text a tokenizer encodes, for tokenizer.json files whose
// "normalizer" asks for it (Qwen2's and Qwen3's: {"type": "NFC"}).
//
// Note [NFC before pre-tokenization]
// Hugging Face tokenizers normalizes each stretch of text left between the added tokens that are
// matched on the raw text (normalized false), then matches the other added tokens on the
// normalized text, then pre-tokenizes (trainer/text/tokenizer.h, step 1). gtron does the same
// through ICU's NFC (Debian's libicu-dev): canonical decomposition then canonical composition, so
// "e" + U+0301 becomes "é" (U+00E9) and a Hangul syllable spelled in jamo becomes the syllable.
// Python strings and Rust &str are always valid UTF-8, while gtron encodes bytes: a byte that is
// not part of a well-formed UTF-8 sequence is kept as it is and splits the text, each valid run
// normalized on its own.
#pragma once

#include <string>
#include <string_view>

namespace gtron {

// The NFC form of `text` (see the Note); text already in NFC comes back unchanged.
std::string nfc_normalize(std::string_view text);

}  // namespace gtron

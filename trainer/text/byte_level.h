// GPT-2's byte-level alphabet: every byte value has one printable Unicode character, so any byte
// string is a printable token string (the form Hugging Face tokenizers' ByteLevel stores in
// tokenizer.json: a space is "Ġ", a newline "Ċ").
//
// The mapping (GPT-2's bytes_to_unicode): the bytes 0x21-0x7E, 0xA1-0xAC and 0xAE-0xFF map to the
// code point of the same value; the other 68 bytes (controls, space, 0x7F-0xA0, 0xAD) map, in
// increasing byte order, to U+0100, U+0101, ...
#pragma once

#include <optional>
#include <string>

namespace gtron {

// The UTF-8 string of the byte-level characters of `bytes` (one character per byte).
std::string bytes_to_token_string(const std::string& bytes);

// The bytes a byte-level token string stands for; nullopt when `token` is not valid UTF-8 or holds
// a character outside the 256-character alphabet.
std::optional<std::string> token_string_to_bytes(const std::string& token);

}  // namespace gtron

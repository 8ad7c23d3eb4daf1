#include "trainer/text/byte_level.h"

#include <array>
#include <cstdint>
#include <unordered_map>

namespace gtron {
namespace {

bool maps_to_itself(int b) {
  return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

// byte -> code point of its character.
const std::array<uint32_t, 256>& byte_to_code_point() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    uint32_t next = 0x100;
    for (int b = 0; b < 256; ++b) t[b] = maps_to_itself(b) ? static_cast<uint32_t>(b) : next++;
    return t;
  }();
  return table;
}

// code point -> byte (only the 256 characters of the alphabet are present).
const std::unordered_map<uint32_t, unsigned char>& code_point_to_byte() {
  static const std::unordered_map<uint32_t, unsigned char> table = [] {
    std::unordered_map<uint32_t, unsigned char> t;
    for (int b = 0; b < 256; ++b) t[byte_to_code_point()[b]] = static_cast<unsigned char>(b);
    return t;
  }();
  return table;
}

// Every code point of the alphabet is below U+0800, so one or two UTF-8 bytes.
void append_utf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace

std::string bytes_to_token_string(const std::string& bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) append_utf8(byte_to_code_point()[b], &out);
  return out;
}

std::optional<std::string> token_string_to_bytes(const std::string& token) {
  std::string out;
  const auto& table = code_point_to_byte();
  for (size_t i = 0; i < token.size();) {
    const auto c0 = static_cast<unsigned char>(token[i]);
    uint32_t cp = 0;
    if (c0 < 0x80) {
      cp = c0;
      i += 1;
    } else if ((c0 & 0xE0) == 0xC0 && i + 1 < token.size() &&
               (static_cast<unsigned char>(token[i + 1]) & 0xC0) == 0x80) {
      cp = ((c0 & 0x1Fu) << 6) | (static_cast<unsigned char>(token[i + 1]) & 0x3Fu);
      i += 2;
    } else {
      return std::nullopt;  // not UTF-8, or a character of three or more bytes: not in the alphabet
    }
    auto it = table.find(cp);
    if (it == table.end()) return std::nullopt;
    out.push_back(static_cast<char>(it->second));
  }
  return out;
}

}  // namespace gtron

// SHA-256 (FIPS 180-4), for recording which tokenizer.json a prepared dataset was made with.
#pragma once

#include <string>

namespace gtron {

// The digest of `bytes` as 64 lowercase hex digits.
std::string sha256_hex(const std::string& bytes);

}  // namespace gtron

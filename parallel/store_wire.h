// Note [store wire format]
//
// Every integer is little-endian. A client sends one request and reads its reply before sending
// the next (one request in flight per connection).
//
//   request := magic u32 = 0x31535447 ("GTS1") | op u8 | timeout_ms u32 | key_count u32
//              | key_count x (key_len u32 | key bytes) | value_len u64 | value bytes
//   reply   := status u8 | value_len u64 | value bytes
//
//   op     keys     request value          reply value (status kOk)
//   1 SET  1        the bytes to store     empty
//   2 GET  1        empty                  the stored bytes (waits until the key exists)
//   3 ADD  1        delta, i64 (8 bytes)   the new counter value, i64
//   4 WAIT 1..4096  empty                  empty (waits until every key exists)
//   5 CHECK 1..4096 empty                  1 byte: 1 if every key exists now, else 0
//
//   status 0 kOk; 1 kTimeout (GET/WAIT: timeout_ms passed; value = missing count u32 | the first
//   missing key); 2 kError (value = a message, e.g. ADD on a key that is not a counter).
//
// Limits, checked as soon as the bytes arrive (before any body is buffered): a wrong magic, an
// unknown op, a key count outside the op's range, an empty key or one over kMaxKeyBytes, a value
// over kMaxValueBytes or of the wrong size for the op. Any violation closes the connection.
//
// This header is private to the store's sources.
#pragma once

#include <fcntl.h>

#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

namespace gtron::parallel::wire {

constexpr uint32_t kMagic = 0x31535447;
constexpr uint8_t kSet = 1, kGet = 2, kAdd = 3, kWait = 4, kCheck = 5;
constexpr uint8_t kOk = 0, kTimeout = 1, kError = 2;
constexpr uint32_t kMaxKeys = 4096;
constexpr size_t kHeaderBytes = 4 + 1 + 4 + 4;

inline void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

inline void put_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

inline uint64_t get_le(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

inline std::string encode_i64(int64_t v) {
  std::string out;
  put_u64(out, static_cast<uint64_t>(v));
  return out;
}

inline std::string seconds_str(std::chrono::milliseconds ms) {
  char buf[32];
  if (ms.count() % 1000 == 0) {
    std::snprintf(buf, sizeof buf, "%lld s", static_cast<long long>(ms.count() / 1000));
  } else {
    std::snprintf(buf, sizeof buf, "%.1f s", ms.count() / 1000.0);
  }
  return buf;
}

// strerror with a lower-case first letter, to sit inside a sentence.
inline std::string errno_str(int err) {
  std::string s = std::strerror(err);
  if (!s.empty()) s[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(s[0])));
  return s;
}

inline void set_nonblocking(int fd, bool on) {
  int flags = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK));
}

}  // namespace gtron::parallel::wire

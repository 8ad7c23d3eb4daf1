#include "tests/trainer/tfevents_reader.h"

#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>

namespace gtron::testing {

uint32_t bitwise_crc32c(const std::string& s) {
  uint32_t c = 0xffffffffu;
  for (unsigned char byte : s) {
    c ^= byte;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82f63b78u & (0u - (c & 1)));
  }
  return ~c;
}

uint32_t unmask(uint32_t m) {
  const uint32_t r = m - 0xa282ead8u;
  return (r >> 17) | (r << 15);
}

uint64_t read_le(const std::string& s, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i)
    v |= static_cast<uint64_t>(static_cast<uint8_t>(s[at + i])) << (8 * i);
  return v;
}

std::vector<std::string> read_records(const std::string& bytes) {
  std::vector<std::string> records;
  size_t at = 0;
  while (at < bytes.size()) {
    const std::string where = "record " + std::to_string(records.size());
    if (bytes.size() - at < 12) throw std::runtime_error(where + ": truncated header");
    const uint64_t length = read_le(bytes, at, 8);
    if (unmask(static_cast<uint32_t>(read_le(bytes, at + 8, 4))) !=
        bitwise_crc32c(bytes.substr(at, 8))) {
      throw std::runtime_error(where + ": length CRC mismatch");
    }
    if (bytes.size() - at - 12 < length + 4) throw std::runtime_error(where + ": truncated data");
    std::string payload = bytes.substr(at + 12, length);
    if (unmask(static_cast<uint32_t>(read_le(bytes, at + 12 + length, 4))) !=
        bitwise_crc32c(payload)) {
      throw std::runtime_error(where + ": data CRC mismatch");
    }
    records.push_back(std::move(payload));
    at += 12 + length + 4;
  }
  return records;
}

uint64_t read_varint(const std::string& s, size_t& at) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (at >= s.size()) throw std::runtime_error("truncated varint");
    const uint8_t b = static_cast<uint8_t>(s[at++]);
    v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if ((b & 0x80) == 0) return v;
  }
  throw std::runtime_error("varint longer than 10 bytes");
}

std::vector<Field> parse_message(const std::string& s) {
  std::vector<Field> fields;
  size_t at = 0;
  while (at < s.size()) {
    const uint64_t key = read_varint(s, at);
    Field f{static_cast<uint32_t>(key >> 3), static_cast<uint32_t>(key & 7)};
    switch (f.type) {
      case 0:
        f.scalar = read_varint(s, at);
        break;
      case 1:
      case 5: {
        const int n = f.type == 1 ? 8 : 4;
        if (s.size() - at < static_cast<size_t>(n)) throw std::runtime_error("truncated fixed");
        f.scalar = read_le(s, at, n);
        at += n;
        break;
      }
      case 2: {
        const uint64_t n = read_varint(s, at);
        if (s.size() - at < n) throw std::runtime_error("truncated bytes");
        f.bytes = s.substr(at, n);
        at += n;
        break;
      }
      default:
        throw std::runtime_error("unexpected wire type " + std::to_string(f.type));
    }
    fields.push_back(std::move(f));
  }
  return fields;
}

Event decode_event(const std::string& payload) {
  Event e;
  for (const Field& f : parse_message(payload)) {
    if (f.number == 1 && f.type == 1) {
      e.has_wall_time = true;
      std::memcpy(&e.wall_time, &f.scalar, 8);
    } else if (f.number == 2 && f.type == 0) {
      e.step = static_cast<int64_t>(f.scalar);
    } else if (f.number == 3 && f.type == 2) {
      e.file_version = f.bytes;
    } else if (f.number == 5 && f.type == 2) {
      e.has_summary = true;
      for (const Field& v : parse_message(f.bytes)) {
        if (v.number != 1 || v.type != 2) throw std::runtime_error("unexpected Summary field");
        std::string tag;
        float value = std::numeric_limits<float>::quiet_NaN();
        for (const Field& x : parse_message(v.bytes)) {
          if (x.number == 1 && x.type == 2) {
            tag = x.bytes;
          } else if (x.number == 2 && x.type == 5) {
            const uint32_t bits = static_cast<uint32_t>(x.scalar);
            std::memcpy(&value, &bits, 4);
          } else {
            throw std::runtime_error("unexpected Summary.Value field");
          }
        }
        e.values.emplace_back(tag, value);
      }
    } else {
      throw std::runtime_error("unexpected Event field " + std::to_string(f.number));
    }
  }
  return e;
}

std::vector<Event> read_event_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::vector<Event> events;
  for (const std::string& r : read_records(ss.str())) events.push_back(decode_event(r));
  return events;
}

}  // namespace gtron::testing

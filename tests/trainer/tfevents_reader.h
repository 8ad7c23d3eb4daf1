// A reader of TensorBoard event files of our own, independent of trainer/tensorboard.cc: TFRecord
// framing with both CRCs checked (CRC-32C computed bit by bit, not by the writer's table), the
// tensorflow.Event protobuf decoded field by field. Errors throw std::runtime_error naming the
// record and what is wrong.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace gtron::testing {

// CRC-32C bit by bit, and TFRecord's unmasking of a stored CRC.
uint32_t bitwise_crc32c(const std::string& s);
uint32_t unmask(uint32_t m);
// `bytes` little-endian bytes of `s` from `at`.
uint64_t read_le(const std::string& s, size_t at, int bytes);

// The payloads of a TFRecord file ("record N: length CRC mismatch", "... data CRC mismatch",
// "... truncated ...").
std::vector<std::string> read_records(const std::string& bytes);

// A protobuf message as (field number, wire type, raw value) triples: a varint's value, a fixed
// field's bits, or a length-delimited field's bytes.
struct Field {
  uint32_t number;
  uint32_t type;
  uint64_t scalar = 0;
  std::string bytes;
};
uint64_t read_varint(const std::string& s, size_t& at);
std::vector<Field> parse_message(const std::string& s);

struct Event {
  bool has_wall_time = false;
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;
  bool has_summary = false;
  std::vector<std::pair<std::string, float>> values;  // (tag, simple_value), in order
};
// One tensorflow.Event; unknown fields are errors.
Event decode_event(const std::string& payload);

// Every event of the file at `path`, in order.
std::vector<Event> read_event_file(const std::string& path);

}  // namespace gtron::testing

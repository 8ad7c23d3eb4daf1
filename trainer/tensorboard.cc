#include "trainer/tensorboard.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "model/check.h"

namespace gtron {

namespace {

// The byte-at-a-time table of the reflected CRC-32C: entry b is the CRC register after shifting
// byte b through eight steps.
constexpr std::array<uint32_t, 256> make_crc32c_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t c = b;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
    table[b] = c;
  }
  return table;
}

constexpr std::array<uint32_t, 256> kCrc32cTable = make_crc32c_table();

// --- Protobuf wire format: a field is a key varint (field number << 3 | wire type), then the
// value: a varint (type 0), 8 little-endian bytes (type 1), a varint length and that many bytes
// (type 2), or 4 little-endian bytes (type 5).
enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_key(std::string& out, uint32_t field, WireType type) {
  put_varint(out, (static_cast<uint64_t>(field) << 3) | type);
}

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}

void put_double(std::string& out, uint32_t field, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_key(out, field, kFixed64);
  put_le(out, bits, 8);
}

void put_float(std::string& out, uint32_t field, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_key(out, field, kFixed32);
  put_le(out, bits, 4);
}

// int64 fields are varints of the two's-complement bits (a negative step takes 10 bytes).
void put_int64(std::string& out, uint32_t field, int64_t v) {
  put_key(out, field, kVarint);
  put_varint(out, static_cast<uint64_t>(v));
}

void put_bytes(std::string& out, uint32_t field, const std::string& bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out += bytes;
}

// Field numbers of tensorflow.Event, Summary and Summary.Value.
constexpr uint32_t kEventWallTime = 1;
constexpr uint32_t kEventStep = 2;
constexpr uint32_t kEventFileVersion = 3;
constexpr uint32_t kEventSummary = 5;
constexpr uint32_t kSummaryValue = 1;
constexpr uint32_t kValueTag = 1;
constexpr uint32_t kValueSimpleValue = 2;

double wall_time_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

std::string scalar_event(int64_t step, const std::vector<std::pair<std::string, double>>& values) {
  std::string summary;
  for (const auto& [tag, value] : values) {
    std::string v;
    put_bytes(v, kValueTag, tag);
    put_float(v, kValueSimpleValue, static_cast<float>(value));
    put_bytes(summary, kSummaryValue, v);
  }
  std::string event;
  put_double(event, kEventWallTime, wall_time_now());
  put_int64(event, kEventStep, step);
  put_bytes(event, kEventSummary, summary);
  return event;
}

}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; ++i) c = kCrc32cTable[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    throw UserError("cannot create the TensorBoard directory '" + dir + "': " + ec.message());
  }
  // Exclusive create ("x"): two writers started in the same second must not share a file.
  const std::string base = dir + "/events.out.tfevents." +
                           std::to_string(static_cast<int64_t>(wall_time_now())) + "." +
                           host_name();
  for (int n = 0; f_ == nullptr; ++n) {
    path_ = n == 0 ? base : base + "." + std::to_string(n);
    f_ = std::fopen(path_.c_str(), "wbx");
    if (f_ == nullptr && (errno != EEXIST || n == 1000)) {
      throw UserError("cannot create the TensorBoard event file '" + path_ +
                      "': " + std::strerror(errno) + " (is the directory writable?)");
    }
  }
  std::string event;
  put_double(event, kEventWallTime, wall_time_now());
  put_bytes(event, kEventFileVersion, "brain.Event:2");
  try {
    write_record(event);
    flush();  // TensorBoard sees a valid (empty) run at once
  } catch (...) {
    std::fclose(f_);
    throw;
  }
}

TensorBoardWriter::~TensorBoardWriter() {
  if (f_ != nullptr) std::fclose(f_);  // flushes; errors cannot be reported here
}

void TensorBoardWriter::add_scalar(const std::string& tag, int64_t step, double value) {
  write_record(scalar_event(step, {{tag, value}}));
}

void TensorBoardWriter::add_scalars(int64_t step,
                                    const std::vector<std::pair<std::string, double>>& values) {
  if (values.empty()) return;
  write_record(scalar_event(step, values));
}

void TensorBoardWriter::flush() {
  if (std::fflush(f_) != 0) {
    throw UserError("cannot write the TensorBoard event file '" + path_ +
                    "': " + std::strerror(errno));
  }
}

void TensorBoardWriter::write_record(const std::string& payload) {
  // The constructor either opens the file or throws, and the writer cannot be moved from.
  GTRON_CHECK(f_ != nullptr, "TensorBoardWriter without a file");
  std::string record;
  put_le(record, payload.size(), 8);
  const uint32_t length_crc = masked_crc32c(record.data(), 8);
  put_le(record, length_crc, 4);
  record += payload;
  put_le(record, masked_crc32c(payload.data(), payload.size()), 4);
  if (std::fwrite(record.data(), 1, record.size(), f_) != record.size()) {
    throw UserError("cannot write the TensorBoard event file '" + path_ +
                    "': " + std::strerror(errno));
  }
}

}  // namespace gtron

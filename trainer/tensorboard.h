// TensorBoard scalars without TensorFlow: an event file that `tensorboard --logdir DIR` reads.
//
// What it writes: DIR/events.out.tfevents.<unix seconds>.<hostname> (".<n>" appended, n = 1, 2,
// ..., when another writer made that name first). The file is a sequence of TFRecord records:
//   uint64 length (little-endian), uint32 masked CRC-32C of those 8 bytes, `length` payload
//   bytes, uint32 masked CRC-32C of the payload; mask(c) = ((c >> 15) | (c << 17)) + 0xa282ead8.
// Each payload is a serialized tensorflow.Event protobuf message (encoded here by hand, no
// protobuf library):
//   - the first record: wall_time (field 1, double) and file_version (field 3) "brain.Event:2";
//   - then one record per add_scalar() / add_scalars() call: wall_time, step (field 2, int64) and
//     summary (field 5, a Summary: repeated value (field 1), each a Summary.Value with tag
//     (field 1, string) and simple_value (field 2, float)).
// Values are stored as float32 (TensorBoard's simple_value): a double is rounded to nearest.
// NaN and infinities are written as they are (TensorBoard plots them as such).
//
// Thread safety: none. Calls on one writer must be serialized by the caller (the trainer logs
// from one thread, on rank 0 only). Different writers are independent, also in one directory.
//
// Errors: a directory that cannot be created or a file that cannot be created or written is a
// UserError naming the path and the system's reason (like MetricsWriter). Records go through a
// stdio buffer; flush() pushes them to the kernel so that a running TensorBoard (or a crash)
// sees every record added so far, and reports a write error then. The destructor flushes and
// closes but cannot throw: call flush() first to see errors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace gtron {

// CRC-32C (Castagnoli: reflected polynomial 0x82f63b78, initial value and final xor 0xffffffff),
// the checksum of TFRecord. crc32c("123456789") == 0xe3069283.
uint32_t crc32c(const void* data, size_t n);

// TFRecord's masked form of crc32c(data, n) (see the top of this file).
uint32_t masked_crc32c(const void* data, size_t n);

class TensorBoardWriter {
 public:
  // Creates `dir` (and its parents) if missing, then a new event file in it, and writes the
  // file_version event. Throws UserError when either cannot be made.
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();

  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One event at `step` with the value of one tag. `tag` may be any string (TensorBoard groups
  // tags by their prefix before '/'). Throws UserError on a write error.
  void add_scalar(const std::string& tag, int64_t step, double value);
  // One event at `step` holding every (tag, value) pair, in order (nothing for an empty list).
  void add_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values);
  // Hands every record added so far to the kernel. Throws UserError on a write error.
  void flush();

  // The event file's path.
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& payload);

  std::string path_;
  std::FILE* f_ = nullptr;
};

}  // namespace gtron

// Reading an input file in chunks, decompressed on the way: gzip through zlib, zstd through
// libzstd. Memory stays at two fixed buffers whatever the file's size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace gtron {

enum class Compression { kNone, kGzip, kZstd };

// kGzip for a name ending in .gz, kZstd for .zst, else kNone.
Compression compression_of(const std::string& path);

// One open input file. Non-copyable, movable; not thread-safe (one reader at a time).
class ByteSource {
 public:
  // Throws UserError naming the path when it cannot be opened (or a decoder cannot start).
  ByteSource(const std::string& path, Compression compression);
  ~ByteSource();
  ByteSource(ByteSource&&) noexcept;
  ByteSource& operator=(ByteSource&&) noexcept;
  ByteSource(const ByteSource&) = delete;
  ByteSource& operator=(const ByteSource&) = delete;

  // Reads up to `cap` (> 0) bytes of content into buf; returns how many, 0 only at the end.
  // Throws UserError for a read error or corrupt or truncated compressed data; its message says
  // what is wrong but not where, so callers name the file and the line. gzip: every member of a
  // multi-member file is read (as gzip -d does); zstd: every frame.
  size_t read(char* buf, size_t cap);

  // Bytes read from the file so far (compressed bytes for .gz and .zst; at most one buffer ahead
  // of what read() has decoded).
  int64_t file_bytes_read() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gtron

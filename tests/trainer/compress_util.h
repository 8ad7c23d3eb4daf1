// Test helpers that write gzip and zstd files with the libraries gtron reads them with.
#pragma once

#include <zstd.h>

#include <cstdio>
#include <string>

namespace gtron::testing {

// Writes `text` to `path` as gzip, cut into `members` gzip members (gzip -d reads them all).
void write_gzip(const std::string& path, const std::string& text, int members = 1);
// Writes `text` to `path` as zstd, cut into `frames` frames.
void write_zstd(const std::string& path, const std::string& text, int frames = 1);

// A .zst file written piece by piece (one frame), so a test can make a large input without
// holding it. Non-copyable.
class ZstdFileWriter {
 public:
  explicit ZstdFileWriter(const std::string& path);
  ~ZstdFileWriter();  // ends the frame and closes the file
  ZstdFileWriter(const ZstdFileWriter&) = delete;
  ZstdFileWriter& operator=(const ZstdFileWriter&) = delete;
  void write(const std::string& text);

 private:
  void drain(ZSTD_inBuffer* in, ZSTD_EndDirective mode);
  std::FILE* f_;
  ZSTD_CCtx* cctx_;
  std::string out_;
};

}  // namespace gtron::testing

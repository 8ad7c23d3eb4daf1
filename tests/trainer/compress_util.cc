#include "tests/trainer/compress_util.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>

namespace gtron::testing {

void write_gzip(const std::string& path, const std::string& text, int members) {
  const size_t piece = text.size() / static_cast<size_t>(members) + 1;
  for (int m = 0; m < members; ++m) {
    // "ab" appends a new member to the file; the first one starts it.
    gzFile f = gzopen(path.c_str(), m == 0 ? "wb" : "ab");
    ASSERT_NE(f, nullptr) << path;
    const size_t at = std::min(text.size(), piece * static_cast<size_t>(m));
    const size_t n = std::min(piece, text.size() - at);
    if (n > 0)
      ASSERT_EQ(gzwrite(f, text.data() + at, static_cast<unsigned>(n)), static_cast<int>(n));
    ASSERT_EQ(gzclose(f), Z_OK);
  }
}

void write_zstd(const std::string& path, const std::string& text, int frames) {
  const size_t piece = text.size() / static_cast<size_t>(frames) + 1;
  std::string out;
  for (int k = 0; k < frames; ++k) {
    const size_t at = std::min(text.size(), piece * static_cast<size_t>(k));
    const size_t n = std::min(piece, text.size() - at);
    std::string frame(ZSTD_compressBound(n), '\0');
    const size_t got = ZSTD_compress(frame.data(), frame.size(), text.data() + at, n, 3);
    ASSERT_FALSE(ZSTD_isError(got));
    out.append(frame.data(), got);
  }
  std::FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  ASSERT_EQ(std::fwrite(out.data(), 1, out.size(), f), out.size());
  std::fclose(f);
}

ZstdFileWriter::ZstdFileWriter(const std::string& path)
    : f_(std::fopen(path.c_str(), "wb")),
      cctx_(ZSTD_createCCtx()),
      out_(ZSTD_CStreamOutSize(), '\0') {
  EXPECT_NE(f_, nullptr) << path;
  ZSTD_CCtx_setParameter(cctx_, ZSTD_c_compressionLevel, 1);
}

ZstdFileWriter::~ZstdFileWriter() {
  ZSTD_inBuffer in{nullptr, 0, 0};
  drain(&in, ZSTD_e_end);
  ZSTD_freeCCtx(cctx_);
  if (f_ != nullptr) std::fclose(f_);
}

void ZstdFileWriter::write(const std::string& text) {
  ZSTD_inBuffer in{text.data(), text.size(), 0};
  drain(&in, ZSTD_e_continue);
}

void ZstdFileWriter::drain(ZSTD_inBuffer* in, ZSTD_EndDirective mode) {
  for (;;) {
    ZSTD_outBuffer out{out_.data(), out_.size(), 0};
    const size_t left = ZSTD_compressStream2(cctx_, &out, in, mode);
    EXPECT_FALSE(ZSTD_isError(left));
    if (f_ != nullptr) std::fwrite(out_.data(), 1, out.pos, f_);
    const bool done = mode == ZSTD_e_end ? left == 0 : in->pos == in->size;
    if (done || ZSTD_isError(left)) return;
  }
}

}  // namespace gtron::testing

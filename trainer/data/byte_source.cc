#include "trainer/data/byte_source.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "model/check.h"

namespace gtron {
namespace {

constexpr size_t kInputBuffer = size_t{1} << 20;  // compressed bytes read per read(2)

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

}  // namespace

Compression compression_of(const std::string& path) {
  if (ends_with(path, ".gz")) return Compression::kGzip;
  if (ends_with(path, ".zst")) return Compression::kZstd;
  return Compression::kNone;
}

struct ByteSource::Impl {
  Compression compression = Compression::kNone;
  int fd = -1;
  int64_t file_bytes = 0;
  bool eof = false;
  std::vector<char> in;  // compressed input (gzip, zstd)
  z_stream z{};
  bool z_ready = false;
  bool member_open = false;  // gzip: inside a member (its end not seen yet)
  ZSTD_DStream* zs = nullptr;
  ZSTD_inBuffer zin{nullptr, 0, 0};
  bool frame_open = false;  // zstd: inside a frame
  // A decoding error found after some bytes were decoded: those are returned first, the error
  // at the next read, so the reader has seen every line before the damage.
  std::string pending_error;

  // Throws `what` now, or after returning the `produced` bytes already decoded.
  size_t fail(std::string what, size_t produced) {
    if (produced == 0) throw UserError(what);
    pending_error = std::move(what);
    return produced;
  }

  ~Impl() {
    if (z_ready) inflateEnd(&z);
    if (zs != nullptr) ZSTD_freeDStream(zs);
    if (fd >= 0) ::close(fd);
  }

  // read(2) into buf; 0 at the end of the file.
  size_t read_file(char* buf, size_t cap) {
    for (;;) {
      const ssize_t n = ::read(fd, buf, cap);
      if (n >= 0) {
        file_bytes += n;
        if (n == 0) eof = true;
        return static_cast<size_t>(n);
      }
      if (errno != EINTR) throw UserError(str_cat("cannot be read: ", std::strerror(errno)));
    }
  }

  size_t read_gzip(char* buf, size_t cap) {
    z.next_out = reinterpret_cast<Bytef*>(buf);
    z.avail_out = static_cast<uInt>(cap);
    while (z.avail_out == cap) {
      if (z.avail_in == 0 && !eof) {
        z.avail_in = static_cast<uInt>(read_file(in.data(), in.size()));
        z.next_in = reinterpret_cast<Bytef*>(in.data());
      }
      if (z.avail_in == 0 && eof && !member_open) break;
      member_open = true;
      const int rc = inflate(&z, Z_NO_FLUSH);
      if (rc == Z_STREAM_END) {
        member_open = false;  // another member may follow (gzip -d reads them all)
        inflateReset(&z);
      } else if (rc == Z_BUF_ERROR) {
        if (z.avail_in == 0 && eof) {
          return fail("truncated gzip data: the file ends inside a gzip member", cap - z.avail_out);
        }
      } else if (rc != Z_OK) {
        return fail(str_cat("corrupt gzip data (zlib: ", z.msg != nullptr ? z.msg : "error", ")"),
                    cap - z.avail_out);
      }
    }
    return cap - z.avail_out;
  }

  size_t read_zstd(char* buf, size_t cap) {
    ZSTD_outBuffer out{buf, cap, 0};
    while (out.pos == 0) {
      if (zin.pos == zin.size && !eof) zin = {in.data(), read_file(in.data(), in.size()), 0};
      if (zin.pos == zin.size && eof && !frame_open) break;
      const size_t rc = ZSTD_decompressStream(zs, &out, &zin);
      if (ZSTD_isError(rc)) {
        return fail(str_cat("corrupt zstd data (libzstd: ", ZSTD_getErrorName(rc), ")"), out.pos);
      }
      frame_open = rc != 0;
      if (out.pos == 0 && zin.pos == zin.size && eof && frame_open) {
        return fail("truncated zstd data: the file ends inside a zstd frame", 0);
      }
    }
    return out.pos;
  }
};

ByteSource::ByteSource(const std::string& path, Compression compression)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.compression = compression;
  s.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (s.fd < 0) {
    throw UserError(str_cat("text input '", path, "': cannot be opened: ", std::strerror(errno)));
  }
  if (compression == Compression::kNone) return;
  s.in.resize(kInputBuffer);
  if (compression == Compression::kGzip) {
    // 15 + 32: the largest window, and a gzip or zlib header detected automatically.
    if (inflateInit2(&s.z, 15 + 32) != Z_OK) {
      throw UserError(str_cat("text input '", path, "': zlib cannot start a decoder"));
    }
    s.z_ready = true;
  } else {
    s.zs = ZSTD_createDStream();
    if (s.zs == nullptr || ZSTD_isError(ZSTD_initDStream(s.zs))) {
      throw UserError(str_cat("text input '", path, "': libzstd cannot start a decoder"));
    }
  }
}

ByteSource::~ByteSource() = default;
ByteSource::ByteSource(ByteSource&&) noexcept = default;
ByteSource& ByteSource::operator=(ByteSource&&) noexcept = default;

size_t ByteSource::read(char* buf, size_t cap) {
  if (!impl_->pending_error.empty()) throw UserError(impl_->pending_error);
  switch (impl_->compression) {
    case Compression::kGzip:
      return impl_->read_gzip(buf, cap);
    case Compression::kZstd:
      return impl_->read_zstd(buf, cap);
    case Compression::kNone:
      break;
  }
  return impl_->eof ? 0 : impl_->read_file(buf, cap);
}

int64_t ByteSource::file_bytes_read() const { return impl_->file_bytes; }

}  // namespace gtron

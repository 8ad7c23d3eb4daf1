#include "trainer/data/shard_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "model/check.h"
#include "trainer/data/shards.h"

namespace gtron {
namespace {

constexpr size_t kBufferBytes = size_t{1} << 20;

void put_u32(char* out, uint32_t v) {
  for (int b = 0; b < 4; ++b) out[b] = static_cast<char>((v >> (8 * b)) & 0xff);
}

[[noreturn]] void write_failed(const std::string& path) {
  throw UserError(str_cat("cannot write '", path, "': ", std::strerror(errno),
                          ". Hint: check free disk space."));
}

void write_all(int fd, const char* p, size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t k = ::write(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) write_failed(path);
    p += k;
    n -= static_cast<size_t>(k);
  }
}

}  // namespace

ShardWriter::ShardWriter(std::string dir, std::string prefix, int version, int64_t max_tokens)
    : dir_(std::move(dir)), prefix_(std::move(prefix)), version_(version), max_tokens_(max_tokens) {
  GTRON_CHECK(version == kShardVersionU16 || version == kShardVersionU32, "shard version ",
              version);
  GTRON_CHECK(max_tokens >= 1 && max_tokens <= std::numeric_limits<int32_t>::max(), "max_tokens ",
              max_tokens);
  buf_.reserve(kBufferBytes);
}

ShardWriter::~ShardWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (committed_) return;
  for (size_t f = 0; f < files_; ++f) ::unlink((path_of(f) + ".tmp").c_str());
}

std::string ShardWriter::path_of(size_t file) const {
  char name[32];
  std::snprintf(name, sizeof name, "_%03zu.bin", file);
  return dir_ + "/" + prefix_ + name;
}

void ShardWriter::open_next() {
  const std::string tmp = path_of(files_) + ".tmp";
  fd_ = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    throw UserError(str_cat("cannot create '", tmp, "': ", std::strerror(errno),
                            ". Hint: check that the directory exists and is writable."));
  }
  ++files_;
  in_file_ = 0;
  buf_.assign(static_cast<size_t>(kShardHeaderBytes), '\0');  // the header, filled in at close
}

void ShardWriter::flush() {
  write_all(fd_, buf_.data(), buf_.size(), path_of(files_ - 1) + ".tmp");
  buf_.clear();
}

// Writes the header's count, fsyncs and closes the open file.
void ShardWriter::close_current() {
  const std::string tmp = path_of(files_ - 1) + ".tmp";
  flush();
  char header[12];
  put_u32(header, static_cast<uint32_t>(kShardMagic));
  put_u32(header + 4, static_cast<uint32_t>(version_));
  put_u32(header + 8, static_cast<uint32_t>(in_file_));
  if (::pwrite(fd_, header, sizeof header, 0) != static_cast<ssize_t>(sizeof header) ||
      ::fsync(fd_) != 0) {
    write_failed(tmp);
  }
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) write_failed(tmp);
}

void ShardWriter::append(const int32_t* tokens, size_t n) {
  const size_t width = version_ == kShardVersionU16 ? 2 : 4;
  const int64_t limit = width == 2 ? 65536 : int64_t{1} << 31;
  while (n > 0) {
    if (fd_ < 0) open_next();
    // As many tokens as the open file and the buffer take, converted in place.
    const size_t room = std::min<size_t>(static_cast<size_t>(max_tokens_ - in_file_),
                                         std::max<size_t>(1, (kBufferBytes - buf_.size()) / width));
    const size_t k = std::min(n, room);
    const size_t at = buf_.size();
    buf_.resize(at + k * width);
    char* out = buf_.data() + at;
    for (size_t i = 0; i < k; ++i, out += width) {
      const int32_t t = tokens[i];
      if (t < 0 || t >= limit) {
        throw UserError(str_cat("token ", t, " does not fit shard version ", version_, " (uint",
                                8 * width, ")."));
      }
      out[0] = static_cast<char>(t & 0xff);
      out[1] = static_cast<char>((t >> 8) & 0xff);
      if (width == 4) put_u32(out, static_cast<uint32_t>(t));
    }
    tokens += k;
    n -= k;
    total_ += static_cast<int64_t>(k);
    in_file_ += static_cast<int64_t>(k);
    if (buf_.size() >= kBufferBytes) flush();
    if (in_file_ == max_tokens_) close_current();
  }
}

std::vector<std::string> ShardWriter::commit() {
  if (total_ == 0) {
    throw UserError(str_cat("no tokens for '", path_of(0), "'; a shard holds at least 1."));
  }
  if (fd_ >= 0) close_current();
  std::vector<std::string> paths;
  for (size_t f = 0; f < files_; ++f) {
    paths.push_back(path_of(f));
    if (::rename((paths.back() + ".tmp").c_str(), paths.back().c_str()) != 0) {
      throw UserError(str_cat("cannot move '", paths.back(), ".tmp' to '", paths.back(),
                              "': ", std::strerror(errno), "."));
    }
  }
  committed_ = true;
  const int dir_fd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {  // the renames are durable once the directory is on disk
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
  return paths;
}

}  // namespace gtron

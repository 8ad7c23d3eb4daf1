#include "trainer/data/shards.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "model/check.h"

namespace gtron {
namespace {

constexpr const char* kPrepareHint = "Hint: re-run gtron prepare to regenerate the shards.";

std::string errno_text() { return std::strerror(errno); }

std::string shard_error(const std::string& path, const std::string& what) {
  return str_cat("data shard '", path, "': ", what);
}

int64_t token_width(int version) { return version == kShardVersionU16 ? 2 : 4; }

void put_u32(std::string& out, size_t at, uint32_t v) {
  for (int b = 0; b < 4; ++b) out[at + b] = static_cast<char>((v >> (8 * b)) & 0xff);
}

uint32_t get_u32(const unsigned char* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

// Writes all of `bytes` to fd, retrying short writes and EINTR. Returns false with errno set.
bool write_all(int fd, const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return true;
}

std::string parent_dir(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// Reads a whole regular file. Throws UserError (as a shard error) if it cannot.
std::string read_whole_file(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    throw UserError(shard_error(path, str_cat("cannot stat: ", errno_text(), ".")));
  }
  if (!S_ISREG(st.st_mode)) {
    throw UserError(shard_error(path,
                                "is not a regular file. Hint: the data pattern must match "
                                "only shard files."));
  }
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw UserError(shard_error(path, str_cat("cannot open: ", errno_text(), ".")));
  std::string bytes(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::read(fd, &bytes[done], bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      std::string why = n < 0 ? errno_text() : "file shrank while reading";
      ::close(fd);
      throw UserError(shard_error(path, str_cat("read failed: ", why, ".")));
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return bytes;
}

}  // namespace

void write_file_atomic(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) {
    throw UserError(str_cat("cannot create '", tmp, "': ", errno_text(),
                            ". Hint: check that the directory exists and is writable."));
  }
  if (!write_all(fd, bytes) || ::fsync(fd) != 0) {
    std::string why = errno_text();
    ::close(fd);
    ::unlink(tmp.c_str());
    throw UserError(str_cat("cannot write '", tmp, "': ", why, ". Hint: check free disk space."));
  }
  if (::close(fd) != 0 || ::rename(tmp.c_str(), path.c_str()) != 0) {
    std::string why = errno_text();
    ::unlink(tmp.c_str());
    throw UserError(str_cat("cannot move '", tmp, "' to '", path, "': ", why, "."));
  }
  // The rename is durable only once the directory entry is on disk.
  int dir_fd = ::open(parent_dir(path).c_str(), O_RDONLY | O_DIRECTORY);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
}

void write_shard(const std::string& path, const std::vector<uint32_t>& tokens, int version) {
  if (version != kShardVersionU16 && version != kShardVersionU32) {
    throw UserError(
        shard_error(path, str_cat("cannot write version ", version,
                                  "; expected 1 (uint16 tokens) or 7 (uint32 tokens).")));
  }
  if (tokens.empty() || tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    throw UserError(shard_error(path, str_cat("cannot write ", tokens.size(),
                                              " tokens; a shard holds 1 to 2^31-1 tokens.")));
  }
  const int64_t width = token_width(version);
  std::string bytes(static_cast<size_t>(kShardHeaderBytes + width * tokens.size()), '\0');
  put_u32(bytes, 0, static_cast<uint32_t>(kShardMagic));
  put_u32(bytes, 4, static_cast<uint32_t>(version));
  put_u32(bytes, 8, static_cast<uint32_t>(tokens.size()));
  for (size_t i = 0; i < tokens.size(); ++i) {
    const uint32_t t = tokens[i];
    const size_t at = kShardHeaderBytes + width * i;
    if (version == kShardVersionU16) {
      if (t >= 65536) {
        throw UserError(shard_error(path, str_cat("token ", t, " at index ", i,
                                                  " does not fit version 1 (uint16). Hint: use "
                                                  "version 7 (uint32) for vocabularies > 65536.")));
      }
      bytes[at] = static_cast<char>(t & 0xff);
      bytes[at + 1] = static_cast<char>(t >> 8);
    } else {
      put_u32(bytes, at, t);
    }
  }
  write_file_atomic(path, bytes);
}

std::vector<uint32_t> read_shard(const std::string& path, int64_t vocab, int* version_out) {
  const std::string bytes = read_whole_file(path);
  const int64_t size = static_cast<int64_t>(bytes.size());
  if (size < kShardHeaderBytes) {
    throw UserError(
        shard_error(path, str_cat("too small: ", size, " bytes, but the header alone is ",
                                  kShardHeaderBytes, " bytes. ", kPrepareHint)));
  }
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const int32_t magic = static_cast<int32_t>(get_u32(p));
  const int32_t version = static_cast<int32_t>(get_u32(p + 4));
  const int32_t count = static_cast<int32_t>(get_u32(p + 8));
  if (magic != kShardMagic) {
    throw UserError(shard_error(path, str_cat("bad magic ", magic, " (expected ", kShardMagic,
                                              "): not an llm.c token shard. ", kPrepareHint)));
  }
  if (version != kShardVersionU16 && version != kShardVersionU32) {
    throw UserError(shard_error(path, str_cat("unsupported version ", version,
                                              " (expected 1 = uint16 tokens or 7 = uint32 "
                                              "tokens). ",
                                              kPrepareHint)));
  }
  if (count < 1) {
    throw UserError(shard_error(
        path, str_cat("header says ", count, " tokens; a shard needs at least 1. ", kPrepareHint)));
  }
  const int64_t width = token_width(version);
  const int64_t expected = int64_t{count} * width;
  const int64_t got = size - kShardHeaderBytes;
  if (got != expected) {
    throw UserError(
        shard_error(path, str_cat(got < expected ? "truncated" : "trailing bytes", ": header says ",
                                  count, " tokens (", expected, " bytes) but file has ", got,
                                  " bytes of tokens. ", kPrepareHint)));
  }
  std::vector<uint32_t> tokens(static_cast<size_t>(count));
  const unsigned char* body = p + kShardHeaderBytes;
  for (int64_t i = 0; i < count; ++i) {
    const unsigned char* q = body + i * width;
    tokens[i] = version == kShardVersionU16 ? (uint32_t{q[0]} | uint32_t{q[1]} << 8) : get_u32(q);
    if (vocab > 0 && tokens[i] >= static_cast<uint64_t>(vocab)) {
      throw UserError(shard_error(
          path, str_cat("token ", tokens[i], " at token index ", i, " (byte offset ",
                        kShardHeaderBytes + i * width, ") is >= the model vocab ", vocab,
                        ". Hint: the shard was made for a larger vocabulary; raise the model's "
                        "vocab or re-run gtron prepare.")));
    }
  }
  if (version_out != nullptr) *version_out = version;
  return tokens;
}

ShardSet::ShardSet(const std::string& pattern, int64_t vocab) : pattern_(pattern) {
  glob_t g;
  std::memset(&g, 0, sizeof(g));
  const int rc = ::glob(pattern.c_str(), GLOB_ERR, nullptr, &g);
  std::vector<std::string> paths;
  if (rc == 0) paths.assign(g.gl_pathv, g.gl_pathv + g.gl_pathc);
  globfree(&g);
  if (rc != 0 && rc != GLOB_NOMATCH) {
    throw UserError(str_cat("data pattern '", pattern, "': glob failed (code ", rc,
                            "). Hint: check that the directories exist and are readable."));
  }
  if (paths.empty()) {
    throw UserError(str_cat("data pattern '", pattern,
                            "' matches no files. Hint: check the path, or run gtron prepare."));
  }
  // Byte order, not the locale's collation: the same files in the same order on every machine.
  std::sort(paths.begin(), paths.end());
  for (const std::string& path : paths) {
    Shard s;
    s.path = path;
    s.tokens = read_shard(path, vocab, &s.version);
    total_tokens_ += static_cast<int64_t>(s.tokens.size());
    max_token_ = std::max(max_token_, *std::max_element(s.tokens.begin(), s.tokens.end()));
    shards_.push_back(std::move(s));
  }
}

const std::string& ShardSet::path(int64_t i) const {
  GTRON_CHECK(i >= 0 && i < num_shards(), "shard index ", i, " of ", num_shards());
  return shards_[i].path;
}

int ShardSet::version(int64_t i) const {
  GTRON_CHECK(i >= 0 && i < num_shards(), "shard index ", i, " of ", num_shards());
  return shards_[i].version;
}

const std::vector<uint32_t>& ShardSet::tokens(int64_t i) const {
  GTRON_CHECK(i >= 0 && i < num_shards(), "shard index ", i, " of ", num_shards());
  return shards_[i].tokens;
}

}  // namespace gtron

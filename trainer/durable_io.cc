#include "trainer/durable_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "model/check.h"

namespace gtron {
namespace {

[[noreturn]] void fail(const char* what, const std::string& path, int err) {
  throw UserError(str_cat("cannot ", what, " '", path, "': ", std::strerror(err),
                          "; hint: check permissions and free space on that file system"));
}

}  // namespace

void fsync_path(const std::string& path, bool is_dir) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (is_dir ? O_DIRECTORY : 0));
  if (fd < 0) fail("open for fsync", path, errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) fail("fsync", path, err);
}

void write_file_bytes(const std::string& path, const std::string& bytes, bool sync) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) fail("create", path, errno);
  bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  ok = ok && std::fflush(f) == 0 && (!sync || ::fsync(::fileno(f)) == 0);
  const int err = errno;
  const bool closed = std::fclose(f) == 0;
  if (!ok) fail("write", path, err);
  if (!closed) fail("write", path, errno);
}

bool exchange_paths(const std::string& a, const std::string& b) {
  if (::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) == 0) return true;
  if (errno == EINVAL || errno == ENOSYS || errno == ENOTSUP) return false;
  fail("swap with", b, errno);
}

long process_id() { return static_cast<long>(::getpid()); }

}  // namespace gtron

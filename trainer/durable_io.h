// POSIX durability primitives for checkpoint_io: fsync of files and folders, durable writes, an
// atomic folder swap, the process id.
//
// Why a separate library: it must not depend on nlohmann_json. That repository is rooted at
// /usr/include, so Bazel puts `-iquote external/nlohmann_json` on every compile that depends on it,
// and glibc's <unistd.h> then resolves its `#include "linux/close_range.h"` through that path,
// which Bazel's header check rejects as undeclared. Keeping <unistd.h> here sidesteps that.
//
// Errors are UserErrors naming the path and the OS error. Thread safety: no shared state.
#pragma once

#include <string>

namespace gtron {

// fsync a regular file (is_dir false) or a folder (true). A rename is durable only once the folder
// holding it is synced.
void fsync_path(const std::string& path, bool is_dir);

// Creates or truncates `path`, writes `bytes`, and fsyncs it when `sync`.
void write_file_bytes(const std::string& path, const std::string& bytes, bool sync);

// Atomically swaps the names of two existing paths (Linux renameat2 RENAME_EXCHANGE). Returns false
// when the file system cannot swap (the caller falls back to two renames); throws on other errors.
bool exchange_paths(const std::string& a, const std::string& b);

// This process's id (names temporary files so concurrent processes never collide).
long process_id();

}  // namespace gtron

#include "trainer/io/checkpoint_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "model/check.h"
#include "trainer/io/safetensors.h"  // crc32

namespace gtron {
namespace {

namespace fs = std::filesystem;

constexpr char kManifestFormat[] = "gtron-checkpoint";
constexpr int kManifestVersion = 1;
constexpr char kStepPrefix[] = "step_";
constexpr char kTmpPrefix[] = ".tmp-step_";
constexpr char kOldPrefix[] = ".old-step_";
constexpr size_t kIoChunk = 8u << 20;

[[noreturn]] void fs_fail(const std::string& what, const std::string& path, int err) {
  throw UserError(str_cat("cannot ", what, " '", path, "': ", std::strerror(err),
                          "; hint: check permissions and free space on that file system"));
}

[[noreturn]] void fs_fail(const std::string& what, const std::string& path,
                          const std::error_code& ec) {
  fs_fail(what, path, ec.value());
}

// fsync a file or a folder: a rename is durable only once the folder holding it is synced.
void fsync_path(const std::string& path, bool is_dir) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (is_dir ? O_DIRECTORY : 0));
  if (fd < 0) fs_fail("open for fsync", path, errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) fs_fail("fsync", path, err);
}

// Creates or truncates `path`, writes `bytes`, and fsyncs it when `sync`.
void write_file_bytes(const std::string& path, const std::string& bytes, bool sync) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) fs_fail("create", path, errno);
  bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  ok = ok && std::fflush(f) == 0 && (!sync || ::fsync(::fileno(f)) == 0);
  const int err = errno;
  const bool closed = std::fclose(f) == 0;
  if (!ok) fs_fail("write", path, err);
  if (!closed) fs_fail("write", path, errno);
}

// Atomically swaps the names of two existing paths (Linux renameat2 RENAME_EXCHANGE). Returns false
// when the file system cannot swap (the caller falls back to two renames).
bool exchange_paths(const std::string& a, const std::string& b) {
  if (::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) == 0) return true;
  if (errno == EINVAL || errno == ENOSYS || errno == ENOTSUP) return false;
  fs_fail("swap with", b, errno);
}

// CRC32 of a whole file; also returns its size through `bytes`.
uint32_t file_crc(const std::string& path, uint64_t* bytes) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) fs_fail("open", path, errno);
  std::vector<char> buf(kIoChunk);
  uint32_t crc = 0;
  *bytes = 0;
  size_t got;
  while ((got = std::fread(buf.data(), 1, buf.size(), f)) > 0) {
    crc = crc32(buf.data(), got, crc);
    *bytes += got;
  }
  const bool failed = std::ferror(f) != 0;
  const int err = errno;
  std::fclose(f);
  if (failed) fs_fail("read", path, err);
  return crc;
}

// Parses "step_<digits>" into a step; false for any other name.
bool parse_step_name(const std::string& name, int64_t* step) {
  const size_t n = std::strlen(kStepPrefix);
  if (name.size() <= n || name.size() > n + 18 || name.compare(0, n, kStepPrefix) != 0)
    return false;
  int64_t v = 0;
  for (size_t i = n; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return false;
    v = v * 10 + (name[i] - '0');
  }
  *step = v;
  return true;
}

bool starts_with(const std::string& s, const char* prefix) {
  return s.compare(0, std::strlen(prefix), prefix) == 0;
}

// MANIFEST.json of checkpoint `step` listing `files` (relative to `dir`) with sizes and CRC32s.
void write_manifest(const std::string& dir, int64_t step, const std::vector<std::string>& files) {
  nlohmann::ordered_json manifest = {{"format", kManifestFormat},
                                     {"version", kManifestVersion},
                                     {"step", step},
                                     {"files", nlohmann::ordered_json::array()}};
  for (const std::string& rel : files) {
    uint64_t bytes = 0;
    const uint32_t crc = file_crc(dir + "/" + rel, &bytes);
    manifest["files"].push_back({{"path", rel}, {"bytes", bytes}, {"crc32", crc32_hex(crc)}});
  }
  write_file_bytes(dir + "/" + kManifestName, manifest.dump(2) + "\n", /*sync=*/true);
}

// Writes MANIFEST.json listing every regular file under `dir` (unless step < 0), then fsyncs every
// file and folder.
void seal_dir(const std::string& dir, int64_t step) {
  std::vector<std::string> files;
  std::vector<std::string> dirs = {dir};
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::file_status st = it->symlink_status();
    const std::string rel = it->path().lexically_relative(dir).generic_string();
    if (fs::is_directory(st)) {
      dirs.push_back(it->path().string());
    } else {
      GTRON_CHECK(fs::is_regular_file(st), "checkpoint writer left '", rel,
                  "', which is not a regular file or folder");
      GTRON_CHECK(rel != kManifestName, "checkpoint writer must not write ", kManifestName);
      files.push_back(rel);
    }
  }
  if (ec) fs_fail("list", dir, ec);
  std::sort(files.begin(), files.end());
  if (step >= 0) write_manifest(dir, step, files);
  for (const std::string& rel : files) fsync_path(dir + "/" + rel, /*is_dir=*/false);
  // Children before parents, so each folder's sync covers entries that are already durable.
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) fsync_path(*it, /*is_dir=*/true);
}

// Moves `tmp` to `final_path`, replacing an existing checkpoint there (Note [checkpoint
// atomicity]). Leaves `root` synced.
void install_dir(const std::string& root, const std::string& tmp, const std::string& final_path) {
  std::error_code ec;
  if (!fs::exists(final_path, ec)) {
    if (std::rename(tmp.c_str(), final_path.c_str()) != 0)
      fs_fail("rename into", final_path, errno);
    fsync_path(root, /*is_dir=*/true);
    return;
  }
  std::string old = tmp;  // after an exchange the old checkpoint sits at the tmp path
  if (!exchange_paths(tmp, final_path)) {
    old = str_cat(root, "/.old-", fs::path(final_path).filename().string(), "-", ::getpid());
    fs::remove_all(old, ec);
    if (std::rename(final_path.c_str(), old.c_str()) != 0) fs_fail("move aside", final_path, errno);
    if (std::rename(tmp.c_str(), final_path.c_str()) != 0) {
      const int err = errno;
      std::rename(old.c_str(), final_path.c_str());  // put the old checkpoint back
      fs_fail("rename into", final_path, err);
    }
  }
  fsync_path(root, /*is_dir=*/true);
  fs::remove_all(old, ec);
  // The new checkpoint is in place; a failed cleanup is worth a warning, not a failed save.
  if (ec)
    std::cerr << "gtron: warning: cannot delete replaced checkpoint '" << old
              << "': " << ec.message() << "\n";
}

void apply_retention(const std::string& root, const std::string& saved, int keep) {
  std::vector<CheckpointEntry> all = list_checkpoints(root);
  int kept = 0;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    std::error_code ec;
    if (!fs::exists(it->path + "/" + kManifestName, ec)) continue;
    if (kept < keep) {
      ++kept;
      continue;
    }
    if (it->path == saved) continue;  // older than the `keep` newest, but just written
    fs::remove_all(it->path, ec);
    // The new checkpoint is safe already; a failed cleanup is worth a warning, not a failed save.
    if (ec)
      std::cerr << "gtron: warning: cannot delete old checkpoint '" << it->path
                << "': " << ec.message() << "\n";
  }
}

// Empty when `dir` is a good checkpoint; otherwise what is wrong, to follow "checkpoint '<dir>' ":
// "is corrupt: <why>", "is incomplete: <why>" or "does not exist ...".
std::string checkpoint_problem_unchecked(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return "does not exist or is not a folder";
  const std::string manifest_path = dir + "/" + kManifestName;
  if (!fs::exists(manifest_path, ec)) return str_cat("is incomplete: it has no ", kManifestName);
  nlohmann::json manifest;
  try {
    manifest = nlohmann::json::parse(read_file(manifest_path));
  } catch (const nlohmann::json::exception& e) {
    return str_cat("is corrupt: ", kManifestName, " is not valid JSON (", e.what(), ")");
  }
  const bool shaped = manifest.is_object() && manifest.contains("format") &&
                      manifest["format"] == kManifestFormat && manifest.contains("files") &&
                      manifest["files"].is_array();
  if (!shaped) return str_cat("is corrupt: ", kManifestName, " is not a gtron checkpoint manifest");
  struct Listed {
    std::string path;
    uint64_t bytes;
    std::string crc;
  };
  std::vector<Listed> listed;
  for (const auto& f : manifest["files"]) {
    if (!f.is_object() || !f.contains("path") || !f["path"].is_string() || !f.contains("bytes") ||
        !f["bytes"].is_number_unsigned() || !f.contains("crc32") || !f["crc32"].is_string())
      return str_cat("is corrupt: ", kManifestName, " has a malformed entry ", f.dump());
    const fs::path rel(f["path"].get<std::string>());
    if (rel.empty() || rel.is_absolute() || *rel.lexically_normal().begin() == "..")
      return str_cat("is corrupt: ", kManifestName, " lists an unsafe path '", rel.string(), "'");
    listed.push_back({rel.string(), f["bytes"].get<uint64_t>(), f["crc32"].get<std::string>()});
  }
  // Sizes first: a truncated file is found without reading gigabytes.
  for (const Listed& l : listed) {
    const std::string path = dir + "/" + l.path;
    if (!fs::is_regular_file(path, ec)) return str_cat("is corrupt: ", l.path, " is missing");
    const uint64_t size = fs::file_size(path, ec);
    if (ec) return str_cat("is corrupt: cannot stat ", l.path, " (", ec.message(), ")");
    if (size != l.bytes)
      return str_cat("is corrupt: ", l.path, " has ", size, " bytes, manifest says ", l.bytes);
  }
  for (const Listed& l : listed) {
    uint64_t bytes = 0;
    const std::string crc = crc32_hex(file_crc(dir + "/" + l.path, &bytes));
    if (crc != l.crc)
      return str_cat("is corrupt: ", l.path, " has CRC32 ", crc, ", manifest says ", l.crc);
  }
  return "";
}

// As above, with an unreadable file (permissions, I/O error) reported as a problem, not thrown.
std::string checkpoint_problem(const std::string& dir) {
  try {
    return checkpoint_problem_unchecked(dir);
  } catch (const UserError& e) {
    return str_cat("is unreadable: ", e.what());
  }
}

// Writes root/<name> through the temporary folder root/.tmp-<name>-<pid>: write_files, then the
// manifest of checkpoint `step` (none when step < 0, only fsyncs), then the rename.
void save_sealed(const std::string& root, const std::string& name, int64_t step,
                 const std::function<void(const std::string& tmp_dir)>& write_files) {
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) fs_fail("create checkpoint root", root, ec);
  const std::string tmp = str_cat(root, "/.tmp-", name, "-", ::getpid());
  fs::remove_all(tmp, ec);  // a stale leftover of an earlier process with the same pid
  if (!fs::create_directory(tmp, ec)) fs_fail("create temporary checkpoint folder", tmp, ec);
  try {
    write_files(tmp);
    seal_dir(tmp, step);
    install_dir(root, tmp, str_cat(root, "/", name));
  } catch (...) {
    fs::remove_all(tmp, ec);  // best effort; an interrupted save must not leave half a checkpoint
    throw;
  }
}

}  // namespace

std::string checkpoint_dir_name(int64_t step) {
  GTRON_CHECK(step >= 0, "negative checkpoint step ", step);
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%s%08lld", kStepPrefix, static_cast<long long>(step));
  return buf;
}

std::string save_checkpoint_dir(const std::string& root, int64_t step,
                                const std::function<void(const std::string& tmp_dir)>& write_files,
                                int keep) {
  GTRON_CHECK(keep >= 0, "keep = ", keep);
  const std::string name = checkpoint_dir_name(step);
  save_sealed(root, name, step, write_files);
  const std::string final_path = str_cat(root, "/", name);
  if (keep > 0) apply_retention(root, final_path, keep);
  return final_path;
}

void require_new_folder(const std::string& dir) {
  std::error_code ec;
  if (dir.empty() || fs::exists(dir, ec))
    throw UserError(str_cat("output folder '", dir,
                            "' already exists; hint: choose a new path (nothing is overwritten)"));
}

void save_folder_as(const std::string& dir, int64_t step,
                    const std::function<void(const std::string& tmp_dir)>& write_files) {
  require_new_folder(dir);
  const fs::path path = fs::path(dir).lexically_normal();
  const fs::path clean = path.has_filename() ? path : path.parent_path();
  const std::string root = clean.has_parent_path() ? clean.parent_path().string() : ".";
  save_sealed(root, clean.filename().string(), step, write_files);
}

std::optional<std::string> find_latest_complete(const std::string& root) {
  std::error_code ec;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (starts_with(name, kTmpPrefix) || starts_with(name, kOldPrefix))
      std::cerr << "ignoring leftover temporary checkpoint folder '" << it->path().string()
                << "' (from an interrupted save; safe to delete)\n";
  }
  std::vector<CheckpointEntry> all = list_checkpoints(root);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    const std::string problem = checkpoint_problem(it->path);
    if (problem.empty()) return it->path;
    std::cerr << "checkpoint '" << it->path << "' " << problem << "; skipping it\n";
  }
  return std::nullopt;
}

void verify_checkpoint_dir(const std::string& dir) {
  const std::string problem = checkpoint_problem(dir);
  if (!problem.empty())
    throw UserError(str_cat("checkpoint '", dir, "' ", problem,
                            "; hint: pass another step_ folder, or the run's checkpoint root to "
                            "resume from its newest good checkpoint"));
}

std::vector<CheckpointEntry> list_checkpoints(const std::string& root) {
  std::vector<CheckpointEntry> out;
  std::error_code ec;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    int64_t step = 0;
    std::error_code dir_ec;
    if (parse_step_name(it->path().filename().string(), &step) && it->is_directory(dir_ec))
      out.push_back({step, str_cat(root, "/", it->path().filename().string())});
  }
  std::sort(out.begin(), out.end(),
            [](const CheckpointEntry& a, const CheckpointEntry& b) { return a.step < b.step; });
  return out;
}

void write_file_atomic_in_dir(const std::string& dir, const std::string& name,
                              const std::string& bytes) {
  GTRON_CHECK(!name.empty() && name.find('/') == std::string::npos, "bad file name '", name, "'");
  const std::string tmp = str_cat(dir, "/.", name, ".tmp-", ::getpid());
  const std::string path = str_cat(dir, "/", name);
  try {
    write_file_bytes(tmp, bytes, /*sync=*/true);
  } catch (const UserError&) {
    std::remove(tmp.c_str());
    throw;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    fs_fail("rename into", path, err);
  }
  fsync_path(dir, /*is_dir=*/true);
}

std::string read_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) fs_fail("open", path, errno);
  std::string out;
  std::vector<char> buf(1 << 16);
  size_t got;
  while ((got = std::fread(buf.data(), 1, buf.size(), f)) > 0) out.append(buf.data(), got);
  const bool failed = std::ferror(f) != 0;
  const int err = errno;
  std::fclose(f);
  if (failed) fs_fail("read", path, err);
  return out;
}

}  // namespace gtron

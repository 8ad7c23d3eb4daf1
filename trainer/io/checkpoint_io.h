// Checkpoint directories: atomic save, integrity manifest, discovery of the newest good one. This
// layer knows nothing about models; it moves files around a root directory.
//
//   root/
//     step_00000040/            a complete checkpoint (step zero-padded to 8 digits)
//       MANIFEST.json           {"format": "gtron-checkpoint", "version": 1, "step": 40,
//                                "files": [{"path": "model.safetensors", "bytes": 4096,
//                                           "crc32": "1a2b3c4d"}, ...]}
//       model.safetensors ...   whatever the caller's write_files put there (subfolders allowed)
//     .tmp-step_00000080-4242/  a save in progress (or interrupted) by process 4242
//
// Policy (Note [checkpoint atomicity]):
// - A save writes everything into root/.tmp-step_<N>-<pid>, writes MANIFEST.json last, fsyncs every
//   file and folder in it, renames it to root/step_<N> and fsyncs root. A step_ folder therefore
//   appears complete or not at all, even across a power cut. If write_files throws, the temporary
//   folder is removed and the exception passes through; no step_ folder changes.
// - Replacing an existing step_<N>: the new folder and the old one swap names atomically
//   (renameat2 RENAME_EXCHANGE) and the old one is then removed. Where the file system cannot swap,
//   the old one is renamed to root/.old-step_<N>-<pid> first, the new one renamed into place, then
//   the old one removed.
// - A checkpoint is good when its MANIFEST.json parses and every listed file exists with the listed
//   size and CRC32. Files not listed in the manifest are ignored.
// - Retention (keep > 0): after a save, step_ folders that have a MANIFEST.json are kept newest
//   first by step number, `keep` of them; older ones are deleted. The folder just saved is never
//   deleted, even when newer steps exist (a run resumed from an earlier step). Folders without a
//   manifest and temporary folders are left alone (reported by find_latest_complete).
// - Errors from the file system (permissions, full disk) are UserErrors naming the path.
//
// Thread safety: none of these functions share state, but two savers of the same root and step at
// once are not supported (one process, normally global rank 0, saves).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace gtron {

inline constexpr char kManifestName[] = "MANIFEST.json";

// "step_00000040".
std::string checkpoint_dir_name(int64_t step);

// Saves checkpoint `step` under `root` (created if missing) and returns the final folder path
// (root/step_<N>). `write_files(tmp_dir)` writes the checkpoint's files into tmp_dir; it must not
// write MANIFEST.json or leave anything but regular files and folders. keep > 0 applies retention;
// keep == 0 keeps everything. REQUIRES: step >= 0, keep >= 0.
std::string save_checkpoint_dir(const std::string& root, int64_t step,
                                const std::function<void(const std::string& tmp_dir)>& write_files,
                                int keep = 0);

// Writes the folder `dir` itself atomically, as save_checkpoint_dir() writes a step_ folder:
// write_files(tmp_dir) in a temporary folder beside it, then MANIFEST.json of checkpoint `step`
// (step < 0: no manifest, a plain folder), fsync, rename. Throws UserError when `dir` exists
// already (nothing is overwritten). Its parent is created when missing.
void save_folder_as(const std::string& dir, int64_t step,
                    const std::function<void(const std::string& tmp_dir)>& write_files);

// Throws the UserError of save_folder_as() when `dir` exists (callers check before long work).
void require_new_folder(const std::string& dir);

// The path of the newest good checkpoint under `root`, or nullopt when there is none (or no root).
// Every bad step_ folder met on the way (newest first) and every leftover temporary folder is
// reported on stderr, e.g. "checkpoint 'root/step_00000040' is corrupt: model.safetensors has 100
// bytes, manifest says 4096; skipping it". Older folders than the one returned are not verified.
std::optional<std::string> find_latest_complete(const std::string& root);

// Throws UserError naming `dir` and the first problem found when it is not a good checkpoint.
void verify_checkpoint_dir(const std::string& dir);

struct CheckpointEntry {
  int64_t step;
  std::string path;  // root/step_<N>
};

// Every step_<digits> folder under `root`, ascending by step, without verifying anything (empty
// when root does not exist).
std::vector<CheckpointEntry> list_checkpoints(const std::string& root);

// Writes `bytes` to dir/name atomically: dir/.name.tmp-<pid>, fsync, rename, fsync dir. A reader
// sees the old content or the new one, never a mix. `name` is a plain file name (no '/').
void write_file_atomic_in_dir(const std::string& dir, const std::string& name,
                              const std::string& bytes);

// The whole file as bytes. Throws UserError naming the path when it cannot be read.
std::string read_file(const std::string& path);

}  // namespace gtron

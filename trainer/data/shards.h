// Token shards in the llm.c format, and the set of shards a run trains or evaluates on.
//
// File format (all integers little-endian):
//   bytes [0, 1024)  header: 256 int32; [0] magic 20240520, [1] version, [2] token count (>= 1),
//                    the rest zero.
//   bytes [1024, ..) the tokens: uint16 for version 1, uint32 for version 7.
// So a valid file is exactly 1024 + count * width bytes long.
//
// Policy: a shard is validated completely when it is opened (header, exact size, every token below
// the model's vocab), so a bad file fails at startup with its name, never mid-run. Shards are small
// here, so a ShardSet holds every token in memory, widened to uint32.
//
// Writes are atomic: the bytes go to `path + ".tmp"`, are fsync'ed, then renamed over `path` (and
// the directory is fsync'ed), so a crash never leaves a half-written shard under its final name.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gtron {

constexpr int32_t kShardMagic = 20240520;
constexpr int32_t kShardVersionU16 = 1;  // uint16 tokens
constexpr int32_t kShardVersionU32 = 7;  // uint32 tokens
constexpr int64_t kShardHeaderBytes = 1024;

// Writes `bytes` to `path` atomically (tmp file, fsync, rename, fsync of the directory).
// Throws UserError naming the path if any step fails (missing directory, no permission, full disk).
void write_file_atomic(const std::string& path, const std::string& bytes);

// Writes one shard atomically. REQUIRES (else UserError): version is 1 or 7; 1 <= tokens.size() <=
// INT32_MAX; under version 1 every token < 65536.
void write_shard(const std::string& path, const std::vector<uint32_t>& tokens, int version);

// Reads and validates one shard. vocab > 0: every token must be < vocab; vocab <= 0: no vocab
// check. Throws UserError naming the file and what is wrong (with the offset and value of a bad
// token).
std::vector<uint32_t> read_shard(const std::string& path, int64_t vocab,
                                 int* version_out = nullptr);

// The shards matching a glob pattern, sorted by path (byte order), all loaded and validated.
// Immutable after construction; const methods are safe from any thread.
class ShardSet {
 public:
  // Throws UserError if the pattern matches nothing (naming the pattern) or any file is invalid.
  // vocab > 0 checks every token against it; vocab <= 0 skips that check.
  ShardSet(const std::string& pattern, int64_t vocab);

  const std::string& pattern() const { return pattern_; }
  int64_t num_shards() const { return static_cast<int64_t>(shards_.size()); }
  const std::string& path(int64_t i) const;
  int version(int64_t i) const;
  const std::vector<uint32_t>& tokens(int64_t i) const;
  int64_t num_tokens(int64_t i) const { return static_cast<int64_t>(tokens(i).size()); }
  int64_t total_tokens() const { return total_tokens_; }
  uint32_t max_token() const { return max_token_; }  // largest token over all shards

 private:
  struct Shard {
    std::string path;
    int version = 0;
    std::vector<uint32_t> tokens;
  };
  std::string pattern_;
  std::vector<Shard> shards_;
  int64_t total_tokens_ = 0;
  uint32_t max_token_ = 0;
};

}  // namespace gtron

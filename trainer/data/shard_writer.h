// Writing token shards as the tokens arrive, without holding them in memory (`gtron prepare` of
// a corpus of any size).
//
// A ShardWriter writes DIR/PREFIX_000.bin, then PREFIX_001.bin, ... in the format of
// trainer/data/shards.h, each with up to max_tokens tokens (the format's limit by default, so a
// corpus that fits one shard gives exactly one). A file is written as NAME.tmp, its header's count
// filled in and fsync'ed when it is full or at commit(); commit() then renames every file to its
// name and fsyncs the directory, so the shards appear complete or not at all. A writer destroyed
// before commit() removes its temporaries.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace gtron {

// Not thread-safe. Non-copyable, non-movable.
class ShardWriter {
 public:
  // REQUIRES: version is kShardVersionU16 or kShardVersionU32; 1 <= max_tokens <= INT32_MAX.
  ShardWriter(std::string dir, std::string prefix, int version,
              int64_t max_tokens = std::numeric_limits<int32_t>::max());
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // Throws UserError for a token that does not fit the version (negative, or >= 65536 under
  // version 1) and for a failed write (naming the file).
  void append(const int32_t* tokens, size_t n);
  void append(const std::vector<int32_t>& tokens) { append(tokens.data(), tokens.size()); }

  // Completes the files and renames them; returns their paths. REQUIRES (else UserError): at
  // least one token was appended.
  std::vector<std::string> commit();

  int64_t tokens() const { return total_; }

 private:
  void open_next();
  void flush();
  void close_current();
  std::string path_of(size_t file) const;

  std::string dir_, prefix_;
  int version_;
  int64_t max_tokens_;
  int fd_ = -1;
  int64_t in_file_ = 0;  // tokens in the open file
  int64_t total_ = 0;
  size_t files_ = 0;  // files begun
  bool committed_ = false;
  std::vector<char> buf_;
};

}  // namespace gtron

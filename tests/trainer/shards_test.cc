#include "trainer/data/shards.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "model/check.h"

namespace gtron {
namespace {

// A fresh directory under TEST_TMPDIR named after the running test.
std::string test_dir() {
  const char* root = std::getenv("TEST_TMPDIR");
  std::string dir = std::string(root != nullptr ? root : "/tmp") + "/shards_" +
                    ::testing::UnitTest::GetInstance()->current_test_info()->name();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// Writes a file byte by byte: a header of int32 words (the rest zero) then raw token bytes.
void write_raw(const std::string& path, std::vector<int32_t> header, const std::string& body,
               int64_t header_bytes = kShardHeaderBytes) {
  std::string bytes(static_cast<size_t>(header_bytes), '\0');
  for (size_t w = 0; w < header.size() && 4 * w + 3 < bytes.size(); ++w) {
    for (int b = 0; b < 4; ++b) bytes[4 * w + b] = static_cast<char>((header[w] >> (8 * b)) & 0xff);
  }
  std::ofstream(path, std::ios::binary) << bytes << body;
}

// Expects a UserError whose message contains every one of `pieces`.
template <typename F>
void expect_user_error(F&& f, const std::vector<std::string>& pieces) {
  try {
    f();
    ADD_FAILURE() << "no UserError thrown";
  } catch (const UserError& e) {
    for (const std::string& p : pieces) {
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "message lacks '" << p << "': " << e.what();
    }
  }
}

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

TEST(Shards, RoundTripVersion1) {
  const std::string path = test_dir() + "/a.bin";
  const std::vector<uint32_t> tokens = {0, 1, 255, 256, 65535, 7};
  write_shard(path, tokens, kShardVersionU16);
  EXPECT_FALSE(exists(path + ".tmp"));
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 1024 + 2 * 6);
  int version = 0;
  EXPECT_EQ(read_shard(path, 65536, &version), tokens);
  EXPECT_EQ(version, 1);
}

TEST(Shards, RoundTripVersion7) {
  const std::string path = test_dir() + "/a.bin";
  const std::vector<uint32_t> tokens = {0, 65536, 1u << 20, 123456789, 3};
  write_shard(path, tokens, kShardVersionU32);
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 1024 + 4 * 5);
  int version = 0;
  EXPECT_EQ(read_shard(path, 0, &version), tokens);
  EXPECT_EQ(version, 7);
}

TEST(Shards, HeaderBytesAreLittleEndianLlmcLayout) {
  const std::string path = test_dir() + "/a.bin";
  write_shard(path, {0x0102, 0x0304}, kShardVersionU16);
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_EQ(bytes.size(), 1028u);
  auto word = [&](int w) {
    uint32_t v = 0;
    for (int b = 3; b >= 0; --b) v = v << 8 | static_cast<unsigned char>(bytes[4 * w + b]);
    return v;
  };
  EXPECT_EQ(word(0), 20240520u);
  EXPECT_EQ(word(1), 1u);
  EXPECT_EQ(word(2), 2u);
  for (int w = 3; w < 256; ++w) EXPECT_EQ(word(w), 0u);
  EXPECT_EQ(bytes.substr(1024), std::string("\x02\x01\x04\x03", 4));
}

TEST(Shards, WriteRefusesBadInput) {
  const std::string dir = test_dir();
  expect_user_error(
      [&] {
        write_shard(dir + "/a.bin", {1, 70000}, kShardVersionU16);
      },
      {"a.bin", "70000", "version 7"});
  expect_user_error([&] { write_shard(dir + "/b.bin", {1}, 3); }, {"b.bin", "version 3"});
  expect_user_error([&] { write_shard(dir + "/c.bin", {}, kShardVersionU16); },
                    {"c.bin", "0 tokens"});
  expect_user_error([&] { write_shard(dir + "/no/such/dir/d.bin", {1}, kShardVersionU16); },
                    {"no/such/dir/d.bin.tmp"});
  EXPECT_FALSE(exists(dir + "/a.bin"));
  EXPECT_FALSE(exists(dir + "/a.bin.tmp"));
}

TEST(Shards, CorruptionIsDetectedWithTheFileNamed) {
  const std::string dir = test_dir();
  const std::string two_tokens("\x05\x00\x06\x00", 4);

  write_raw(dir + "/small.bin", {kShardMagic, 1, 1}, "", 500);
  expect_user_error([&] { read_shard(dir + "/small.bin", 0); },
                    {"data shard '" + dir + "/small.bin'", "too small: 500 bytes", "prepare"});

  write_raw(dir + "/magic.bin", {1234, 1, 2}, two_tokens);
  expect_user_error([&] { read_shard(dir + "/magic.bin", 0); },
                    {"magic.bin", "bad magic 1234", "20240520"});

  write_raw(dir + "/version.bin", {kShardMagic, 2, 2}, two_tokens);
  expect_user_error([&] { read_shard(dir + "/version.bin", 0); },
                    {"version.bin", "unsupported version 2"});

  write_raw(dir + "/empty.bin", {kShardMagic, 1, 0}, "");
  expect_user_error([&] { read_shard(dir + "/empty.bin", 0); }, {"empty.bin", "0 tokens"});

  write_raw(dir + "/trunc.bin", {kShardMagic, 1, 1000}, std::string(1500, '\0'));
  expect_user_error([&] { read_shard(dir + "/trunc.bin", 0); },
                    {"data shard '" + dir +
                     "/trunc.bin': truncated: header says 1000 tokens (2000 bytes) but file has "
                     "1500 bytes of tokens. Hint: re-run gtron prepare"});

  write_raw(dir + "/long.bin", {kShardMagic, 7, 1}, std::string(6, '\0'));
  expect_user_error([&] { read_shard(dir + "/long.bin", 0); },
                    {"long.bin", "trailing bytes", "1 tokens (4 bytes)", "6 bytes"});

  // Token 6 at index 1 (byte offset 1026) is out of a vocab of 6.
  write_raw(dir + "/vocab.bin", {kShardMagic, 1, 2}, two_tokens);
  EXPECT_EQ(read_shard(dir + "/vocab.bin", 7), (std::vector<uint32_t>{5, 6}));
  expect_user_error([&] { read_shard(dir + "/vocab.bin", 6); },
                    {"vocab.bin", "token 6", "token index 1", "byte offset 1026", "vocab 6"});

  expect_user_error([&] { read_shard(dir + "/missing.bin", 0); }, {"missing.bin", "cannot stat"});
}

TEST(Shards, SetOpensGlobSortedAndValidatesEveryFile) {
  const std::string dir = test_dir();
  write_shard(dir + "/part_10.bin", {10, 11}, kShardVersionU16);
  write_shard(dir + "/part_2.bin", {2, 2, 2}, kShardVersionU32);
  write_shard(dir + "/part_1.bin", {1}, kShardVersionU16);
  write_shard(dir + "/other.bin", {99}, kShardVersionU16);

  ShardSet set(dir + "/part_*.bin", 64);
  ASSERT_EQ(set.num_shards(), 3);
  EXPECT_EQ(set.path(0), dir + "/part_1.bin");  // byte order: "1" < "10" < "2"
  EXPECT_EQ(set.path(1), dir + "/part_10.bin");
  EXPECT_EQ(set.path(2), dir + "/part_2.bin");
  EXPECT_EQ(set.tokens(1), (std::vector<uint32_t>{10, 11}));
  EXPECT_EQ(set.version(2), 7);
  EXPECT_EQ(set.num_tokens(2), 3);
  EXPECT_EQ(set.total_tokens(), 6);
  EXPECT_EQ(set.max_token(), 11u);

  // One bad file among good ones fails the whole set, naming that file.
  expect_user_error([&] { ShardSet(dir + "/part_*.bin", 11); }, {"part_10.bin", "token 11"});
  expect_user_error([&] { ShardSet(dir + "/nothing_*.bin", 64); },
                    {"'" + dir + "/nothing_*.bin'", "matches no files"});
}

}  // namespace
}  // namespace gtron

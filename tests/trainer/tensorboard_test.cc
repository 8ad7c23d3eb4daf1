// TensorBoardWriter against a reader of our own (tests/trainer/tfevents_reader.h): TFRecord framing
// with both CRCs checked, the protobuf decoded field by field, the file_version event first, values
// float-exact, and corruption caught by the CRCs. The reader computes CRC-32C bit by bit,
// independently of the writer's table.
#include "trainer/tensorboard.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>

#include "model/check.h"
#include "tests/trainer/tfevents_reader.h"

namespace gtron {
namespace {

namespace fs = std::filesystem;

// --- The reader: tests/trainer/tfevents_reader.h.

using testing::bitwise_crc32c;
using testing::decode_event;
using testing::Event;
using testing::read_le;
using testing::read_records;

// --- Helpers.

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void spit(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A fresh, empty directory per test under TEST_TMPDIR.
std::string fresh_dir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  const fs::path dir = fs::path(base ? base : "/tmp") / ("tensorboard_test_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

bool same_float(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// --- Tests.

TEST(Crc32c, KnownCheckValue) {
  EXPECT_EQ(crc32c("123456789", 9), 0xe3069283u);
  EXPECT_EQ(bitwise_crc32c("123456789"), 0xe3069283u);  // the reader's own
  EXPECT_EQ(crc32c("", 0), 0u);
  // The writer's table and the reader's bit loop agree on every byte value.
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  EXPECT_EQ(crc32c(all.data(), all.size()), bitwise_crc32c(all));
  const uint32_t c = crc32c("123456789", 9);
  EXPECT_EQ(masked_crc32c("123456789", 9), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

TEST(TensorBoardWriter, WritesEventsThatDecode) {
  const std::string dir = fresh_dir("decode");
  const double before = now_s();
  std::string path;
  {
    TensorBoardWriter w(dir);
    path = w.path();
    w.add_scalar("train/loss", 1, 2.5);
    w.add_scalars(2, {{"train/loss", 1.1}, {"train/lr", 3e-4}, {"tokens/s", 123456.789}});
    w.add_scalars(3, {});  // nothing
    w.add_scalar("neg", -7, -0.0);
    w.add_scalar("big", int64_t{1} << 40, 1e30);
    w.add_scalar("nan", 4, std::numeric_limits<double>::quiet_NaN());
  }  // the destructor flushes
  const double after = now_s();

  // The name: events.out.tfevents.<unix seconds>.<hostname>, the only file in the folder.
  char host[256] = {};
  ASSERT_EQ(gethostname(host, sizeof host - 1), 0);
  const std::string prefix = "events.out.tfevents.";
  ASSERT_EQ(files_in(dir), std::vector<std::string>{fs::path(path).filename().string()});
  const std::string name = fs::path(path).filename().string();
  ASSERT_EQ(name.rfind(prefix, 0), 0u) << name;
  const size_t dot = name.find('.', prefix.size());
  ASSERT_NE(dot, std::string::npos) << name;
  const long long secs = std::stoll(name.substr(prefix.size(), dot - prefix.size()));
  EXPECT_GE(secs, static_cast<long long>(before)) << name;
  EXPECT_LE(secs, static_cast<long long>(after)) << name;
  EXPECT_EQ(name.substr(dot + 1), host);

  const std::vector<std::string> records = read_records(slurp(path));
  ASSERT_EQ(records.size(), 6u);
  std::vector<Event> ev;
  for (const std::string& r : records) ev.push_back(decode_event(r));

  EXPECT_EQ(ev[0].file_version, "brain.Event:2");
  EXPECT_FALSE(ev[0].has_summary);
  for (const Event& e : ev) {
    EXPECT_TRUE(e.has_wall_time);
    EXPECT_GE(e.wall_time, before - 1e-3);
    EXPECT_LE(e.wall_time, after + 1e-3);
  }
  for (size_t i = 1; i < ev.size(); ++i) {
    EXPECT_TRUE(ev[i].file_version.empty()) << i;
    EXPECT_TRUE(ev[i].has_summary) << i;
  }

  using Values = std::vector<std::pair<std::string, float>>;
  EXPECT_EQ(ev[1].step, 1);
  EXPECT_EQ(ev[1].values, (Values{{"train/loss", 2.5f}}));
  EXPECT_EQ(ev[2].step, 2);
  ASSERT_EQ(ev[2].values.size(), 3u);
  EXPECT_EQ(ev[2].values[0].first, "train/loss");
  EXPECT_EQ(ev[2].values[1].first, "train/lr");
  EXPECT_EQ(ev[2].values[2].first, "tokens/s");
  EXPECT_TRUE(same_float(ev[2].values[0].second, static_cast<float>(1.1)));
  EXPECT_TRUE(same_float(ev[2].values[1].second, static_cast<float>(3e-4)));
  EXPECT_TRUE(same_float(ev[2].values[2].second, static_cast<float>(123456.789)));
  EXPECT_EQ(ev[3].step, -7);  // ten-byte varint
  ASSERT_EQ(ev[3].values.size(), 1u);
  EXPECT_TRUE(same_float(ev[3].values[0].second, -0.0f));  // the sign bit survives
  EXPECT_EQ(ev[4].step, int64_t{1} << 40);
  ASSERT_EQ(ev[4].values.size(), 1u);
  EXPECT_TRUE(same_float(ev[4].values[0].second, 1e30f));
  ASSERT_EQ(ev[5].values.size(), 1u);
  EXPECT_EQ(ev[5].values[0].first, "nan");
  EXPECT_TRUE(std::isnan(ev[5].values[0].second));
}

TEST(TensorBoardWriter, FlushMakesRecordsVisible) {
  const std::string dir = fresh_dir("flush");
  TensorBoardWriter w(dir);
  EXPECT_EQ(read_records(slurp(w.path())).size(), 1u);  // file_version, flushed on open
  w.add_scalar("a", 1, 1.0);
  w.add_scalar("a", 2, 2.0);
  w.flush();
  const std::vector<std::string> records = read_records(slurp(w.path()));
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(decode_event(records[2]).step, 2);
}

TEST(TensorBoardWriter, CorruptionIsCaughtByTheCrcs) {
  const std::string dir = fresh_dir("corrupt");
  std::string path;
  {
    TensorBoardWriter w(dir);
    path = w.path();
    w.add_scalar("loss", 5, 0.25);
  }
  const std::string good = slurp(path);
  ASSERT_EQ(read_records(good).size(), 2u);
  const size_t second = 12 + read_le(good, 0, 8) + 4;  // where record 1 starts

  // A flipped bit in the payload of record 1 (its last value byte): the data CRC.
  std::string bad = good;
  bad[bad.size() - 5] ^= 0x01;
  spit(path, bad);
  try {
    read_records(slurp(path));
    ADD_FAILURE() << "a corrupted payload byte went unnoticed";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "record 1: data CRC mismatch");
  }

  // A flipped bit in the length of record 1: the length CRC.
  bad = good;
  bad[second] ^= 0x04;
  try {
    read_records(bad);
    ADD_FAILURE() << "a corrupted length byte went unnoticed";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "record 1: length CRC mismatch");
  }

  // A flipped bit in the stored CRC itself.
  bad = good;
  bad[bad.size() - 1] ^= 0x80;
  EXPECT_THROW(read_records(bad), std::runtime_error);
}

TEST(TensorBoardWriter, TwoWritersInOneSecondGetTwoFiles) {
  const std::string dir = fresh_dir("two");
  TensorBoardWriter a(dir);
  TensorBoardWriter b(dir);
  EXPECT_NE(a.path(), b.path());
  a.add_scalar("x", 1, 1.0);
  b.add_scalar("x", 1, 2.0);
  a.flush();
  b.flush();
  EXPECT_EQ(files_in(dir).size(), 2u);
  EXPECT_EQ(decode_event(read_records(slurp(a.path()))[1]).values[0].second, 1.0f);
  EXPECT_EQ(decode_event(read_records(slurp(b.path()))[1]).values[0].second, 2.0f);
}

TEST(TensorBoardWriter, CreatesAMissingDirectory) {
  const std::string dir = fresh_dir("nested") + "/runs/a";
  TensorBoardWriter w(dir);
  EXPECT_TRUE(fs::is_regular_file(w.path()));
  EXPECT_EQ(fs::path(w.path()).parent_path(), fs::path(dir));
}

// A directory under a regular file cannot be made, even as root (permission bits would not stop
// root): the error names the path.
TEST(TensorBoardWriter, UnwritableDirectoryIsAUserError) {
  const std::string file = fresh_dir("unwritable") + "/a_file";
  spit(file, "x");
  const std::string dir = file + "/runs";
  try {
    TensorBoardWriter w(dir);
    ADD_FAILURE() << "no error for " << dir;
  } catch (const UserError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("cannot create the TensorBoard directory '" + dir + "'"), std::string::npos)
        << msg;
  }
}

// A folder that exists but takes no new file, even from root: procfs.
TEST(TensorBoardWriter, UncreatableFileIsAUserError) {
  try {
    TensorBoardWriter w("/proc/self");
    ADD_FAILURE() << "no error for /proc/self";
  } catch (const UserError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("cannot create the TensorBoard event file '/proc/self/events.out.tfevents."),
              std::string::npos)
        << msg;
  }
}

}  // namespace
}  // namespace gtron

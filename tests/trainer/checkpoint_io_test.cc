#include "trainer/io/checkpoint_io.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "model/check.h"
#include "trainer/io/safetensors.h"

namespace gtron {
namespace {

namespace fs = std::filesystem;

// A fresh, empty root per test under TEST_TMPDIR.
std::string fresh_root() {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string root = std::string(dir ? dir : "/tmp") + "/ckpt_" +
                           ::testing::UnitTest::GetInstance()->current_test_info()->name();
  fs::remove_all(root);
  return root;
}

// Writes "a.bin" (8 bytes) and "sub/b.bin" holding `tag`.
std::function<void(const std::string&)> two_files(const std::string& tag) {
  return [tag](const std::string& dir) {
    write_file_atomic_in_dir(dir, "a.bin", "01234567");
    fs::create_directory(dir + "/sub");
    write_file_atomic_in_dir(dir + "/sub", "b.bin", tag);
  };
}

std::vector<std::string> names_in(const std::string& root) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(root)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

void expect_verify_fails(const std::string& dir, const std::string& phrase) {
  try {
    verify_checkpoint_dir(dir);
    ADD_FAILURE() << "no error for " << dir << " (expected '" << phrase << "')";
  } catch (const UserError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("checkpoint '" + dir + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find(phrase), std::string::npos) << msg;
  }
}

TEST(CheckpointIo, SaveWritesManifestAndRenames) {
  const std::string root = fresh_root();
  std::string seen_tmp;
  const std::string dir = save_checkpoint_dir(root, 40, [&](const std::string& tmp) {
    seen_tmp = tmp;
    // Nothing is visible under the final name while files are being written.
    EXPECT_FALSE(fs::exists(root + "/step_00000040"));
    two_files("hello")(tmp);
  });
  EXPECT_EQ(dir, root + "/step_00000040");
  EXPECT_EQ(seen_tmp.rfind(root + "/.tmp-step_00000040-", 0), 0u) << seen_tmp;
  EXPECT_FALSE(fs::exists(seen_tmp));
  EXPECT_EQ(names_in(root), std::vector<std::string>{"step_00000040"});
  EXPECT_EQ(read_file(dir + "/sub/b.bin"), "hello");

  const nlohmann::json m = nlohmann::json::parse(read_file(dir + "/MANIFEST.json"));
  EXPECT_EQ(m["format"], "gtron-checkpoint");
  EXPECT_EQ(m["step"], 40);
  ASSERT_EQ(m["files"].size(), 2u);
  EXPECT_EQ(m["files"][0]["path"], "a.bin");
  EXPECT_EQ(m["files"][0]["bytes"], 8);
  EXPECT_EQ(m["files"][0]["crc32"], crc32_hex(crc32("01234567", 8)));
  EXPECT_EQ(m["files"][1]["path"], "sub/b.bin");
  EXPECT_EQ(m["files"][1]["bytes"], 5);
  EXPECT_EQ(m["files"][1]["crc32"], crc32_hex(crc32("hello", 5)));

  verify_checkpoint_dir(dir);
  EXPECT_EQ(find_latest_complete(root), dir);
}

TEST(CheckpointIo, CrashInWriteFilesLeavesPreviousCheckpoint) {
  const std::string root = fresh_root();
  const std::string good = save_checkpoint_dir(root, 10, two_files("ten"));
  auto crash = [](const std::string& tmp) {
    write_file_atomic_in_dir(tmp, "a.bin", "partial");
    throw std::runtime_error("simulated crash");
  };
  EXPECT_THROW(save_checkpoint_dir(root, 20, crash), std::runtime_error);
  EXPECT_EQ(names_in(root), std::vector<std::string>{"step_00000010"});
  // A crash while replacing the same step leaves the old one untouched too.
  EXPECT_THROW(save_checkpoint_dir(root, 10, crash), std::runtime_error);
  EXPECT_EQ(names_in(root), std::vector<std::string>{"step_00000010"});
  EXPECT_EQ(read_file(good + "/sub/b.bin"), "ten");
  verify_checkpoint_dir(good);
  EXPECT_EQ(find_latest_complete(root), good);
}

TEST(CheckpointIo, ReplacesExistingStep) {
  const std::string root = fresh_root();
  save_checkpoint_dir(root, 7, [](const std::string& tmp) {
    two_files("old")(tmp);
    write_file_atomic_in_dir(tmp, "only_old.bin", "x");
  });
  const std::string dir = save_checkpoint_dir(root, 7, two_files("newer"));
  EXPECT_EQ(names_in(root), std::vector<std::string>{"step_00000007"});  // no .tmp/.old left
  EXPECT_EQ(read_file(dir + "/sub/b.bin"), "newer");
  EXPECT_FALSE(fs::exists(dir + "/only_old.bin"));
  verify_checkpoint_dir(dir);
}

TEST(CheckpointIo, KeepDeletesOldestButNeverTheNewSave) {
  const std::string root = fresh_root();
  for (int step = 1; step <= 5; ++step) save_checkpoint_dir(root, step * 10, two_files("s"), 2);
  EXPECT_EQ(names_in(root), (std::vector<std::string>{"step_00000040", "step_00000050"}));
  // A run resumed from an earlier step: its save survives next to the two newest.
  save_checkpoint_dir(root, 15, two_files("s"), 2);
  EXPECT_EQ(names_in(root),
            (std::vector<std::string>{"step_00000015", "step_00000040", "step_00000050"}));
  // keep = 0 keeps everything.
  save_checkpoint_dir(root, 60, two_files("s"), 0);
  EXPECT_EQ(names_in(root).size(), 4u);
}

TEST(CheckpointIo, FindLatestSkipsCorruptAndReportsLeftovers) {
  const std::string root = fresh_root();
  save_checkpoint_dir(root, 10, two_files("ten"));
  const std::string twenty = save_checkpoint_dir(root, 20, two_files("twenty"));
  const std::string thirty = save_checkpoint_dir(root, 30, two_files("thirty"));
  const std::string forty = save_checkpoint_dir(root, 40, two_files("forty"));
  fs::resize_file(forty + "/a.bin", 3);                          // truncated
  write_file_atomic_in_dir(thirty + "/sub", "b.bin", "THIRTY");  // same size, other bytes
  fs::create_directories(root + "/.tmp-step_00000050-999");      // an interrupted save
  fs::create_directories(root + "/step_00000060");               // no manifest

  ::testing::internal::CaptureStderr();
  const std::optional<std::string> latest = find_latest_complete(root);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(latest, twenty);
  EXPECT_NE(err.find("checkpoint '" + forty +
                     "' is corrupt: a.bin has 3 bytes, manifest says 8; skipping it"),
            std::string::npos)
      << err;
  EXPECT_NE(
      err.find("checkpoint '" + thirty + "' is corrupt: sub/b.bin has CRC32 " +
               crc32_hex(crc32("THIRTY", 6)) + ", manifest says " + crc32_hex(crc32("thirty", 6))),
      std::string::npos)
      << err;
  EXPECT_NE(err.find(root + "/step_00000060' is incomplete"), std::string::npos) << err;
  EXPECT_NE(err.find("leftover temporary checkpoint folder '" + root + "/.tmp-step_00000050-999'"),
            std::string::npos)
      << err;
}

TEST(CheckpointIo, FindLatestWithNothingToFind) {
  const std::string root = fresh_root();
  EXPECT_EQ(find_latest_complete(root), std::nullopt);  // no root at all
  EXPECT_TRUE(list_checkpoints(root).empty());
  fs::create_directories(root + "/.tmp-step_00000001-5");
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(find_latest_complete(root), std::nullopt);
  ::testing::internal::GetCapturedStderr();
}

TEST(CheckpointIo, VerifyNamesEveryProblem) {
  const std::string root = fresh_root();
  auto fresh = [&](int step) { return save_checkpoint_dir(root, step, two_files("abc")); };
  expect_verify_fails(root + "/step_00000099", "does not exist");

  std::string dir = fresh(1);
  fs::remove(dir + "/MANIFEST.json");
  expect_verify_fails(dir, "is incomplete: it has no MANIFEST.json");

  dir = fresh(2);
  fs::remove(dir + "/sub/b.bin");
  expect_verify_fails(dir, "is corrupt: sub/b.bin is missing");

  dir = fresh(3);
  write_file_atomic_in_dir(dir, "a.bin", "0123456789");
  expect_verify_fails(dir, "is corrupt: a.bin has 10 bytes, manifest says 8");

  dir = fresh(4);
  write_file_atomic_in_dir(dir, "a.bin", "01234568");
  expect_verify_fails(dir, "is corrupt: a.bin has CRC32");

  dir = fresh(5);
  write_file_atomic_in_dir(dir, "MANIFEST.json", "{\"format\": ");
  expect_verify_fails(dir, "MANIFEST.json is not valid JSON");

  dir = fresh(6);
  write_file_atomic_in_dir(dir, "MANIFEST.json", R"({"format": "other", "files": []})");
  expect_verify_fails(dir, "not a gtron checkpoint manifest");

  dir = fresh(7);
  write_file_atomic_in_dir(
      dir, "MANIFEST.json",
      R"({"format": "gtron-checkpoint", "files": [{"path": "../x", "bytes": 1, "crc32": "0"}]})");
  expect_verify_fails(dir, "unsafe path '../x'");
}

TEST(CheckpointIo, ListCheckpointsParsesStepsNumerically) {
  const std::string root = fresh_root();
  for (const char* d : {"step_00000099", "step_100000000", "step_00000005", "step_abc", "stepx",
                        "step_", ".tmp-step_00000001-1"})
    fs::create_directories(root + "/" + d);
  write_file_atomic_in_dir(root, "step_00000007", "a file, not a folder");
  const std::vector<CheckpointEntry> all = list_checkpoints(root);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].step, 5);
  EXPECT_EQ(all[1].step, 99);
  EXPECT_EQ(all[2].step, 100000000);
  EXPECT_EQ(all[2].path, root + "/step_100000000");
  EXPECT_EQ(checkpoint_dir_name(123456789), "step_123456789");
}

TEST(CheckpointIo, AtomicFileHelpers) {
  const std::string root = fresh_root();
  fs::create_directories(root);
  write_file_atomic_in_dir(root, "blob.bin", std::string("a\0b", 3));
  EXPECT_EQ(read_file(root + "/blob.bin"), std::string("a\0b", 3));
  write_file_atomic_in_dir(root, "blob.bin", "second");
  EXPECT_EQ(read_file(root + "/blob.bin"), "second");
  EXPECT_EQ(names_in(root), std::vector<std::string>{"blob.bin"});  // no temporary left
  try {
    read_file(root + "/missing.bin");
    ADD_FAILURE() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(root + "/missing.bin"), std::string::npos) << e.what();
  }
  EXPECT_THROW(write_file_atomic_in_dir(root + "/no/such/dir", "x", "y"), UserError);
}

TEST(CheckpointIo, SafetensorsInsideACheckpoint) {
  const std::string root = fresh_root();
  Tensor w = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3}, DType::kF32);
  save_checkpoint_dir(root, 3, [&](const std::string& tmp) {
    write_safetensors(tmp + "/model.safetensors", {{"w", w}}, {{"step", "3"}});
    write_file_atomic_in_dir(tmp, "trainer_state.json", R"({"step": 3})");
  });
  const std::optional<std::string> dir = find_latest_complete(root);
  ASSERT_TRUE(dir.has_value());
  const SafetensorsFile f = read_safetensors(*dir + "/model.safetensors");
  ASSERT_EQ(f.tensors.size(), 1u);
  EXPECT_EQ(f.tensors[0].tensor.to_vector(), w.to_vector());
  EXPECT_EQ(f.metadata.at("step"), "3");
}

}  // namespace
}  // namespace gtron

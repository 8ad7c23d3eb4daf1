// Runs the independent Python checker (tests/trainer/check_safetensors.py, standard library only)
// on files written by the C++ writer: a second implementation of the format agrees with ours, and
// it rejects what it should.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "trainer/io/safetensors.h"

namespace gtron {
namespace {

std::string tmp_path(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct CheckerRun {
  int code;
  std::string output;
};

// Runs the checker (the test's working directory is the workspace's runfiles root).
CheckerRun check(const std::string& file, const std::string& args = "") {
  const std::string out = tmp_path("checker_output.txt");
  const std::string cmd = "/usr/bin/python3 tests/trainer/check_safetensors.py '" + file + "' " +
                          args + " > '" + out + "' 2>&1";
  const int status = std::system(cmd.c_str());
  EXPECT_TRUE(WIFEXITED(status)) << cmd;
  return {WEXITSTATUS(status), slurp(out)};
}

class SafetensorsPy : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = tmp_path("py_check.safetensors");
    write_safetensors(path_,
                      {{"wte.weight", Tensor::from_vector({1, 2, 3, 4, 5, 6}, {3, 2}, DType::kF32)},
                       {"h.0.bias", Tensor::from_vector({0.5, -1}, {2}, DType::kBF16)},
                       {"f64", Tensor::from_vector({1, 2, 3, 4}, {1, 1, 2, 2}, DType::kF64)},
                       {"ids", Tensor::from_ints({1, 2, 3}, {3})},
                       {"scalar", Tensor::from_vector({3}, Shape{}, DType::kF32)},
                       {"empty", Tensor::zeros({0, 4}, DType::kF32)}},
                      {{"note", "hi"}});
    good_ = slurp(path_);
  }
  void write(const std::string& bytes) {
    std::ofstream out(path_, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  std::string path_;
  std::string good_;
};

TEST_F(SafetensorsPy, AcceptsGoodFileAndExpectations) {
  const CheckerRun r = check(path_,
                             "--expect wte.weight=F32:3x2 --expect h.0.bias=BF16:2 --expect "
                             "f64=F64:1x1x2x2 --expect ids=I32:3 --expect scalar=F32: --expect "
                             "empty=F32:0x4");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("wte.weight F32 [3, 2]"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("scalar F32 []"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("metadata note=hi"), std::string::npos) << r.output;
}

TEST_F(SafetensorsPy, RejectsWrongExpectation) {
  CheckerRun r = check(path_, "--expect wte.weight=F32:2x3");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("expected F32[2, 3]"), std::string::npos) << r.output;
  r = check(path_, "--expect missing=F32:1");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("'missing' is missing"), std::string::npos) << r.output;
}

TEST_F(SafetensorsPy, RejectsCorruptFiles) {
  std::string flipped = good_;
  flipped[flipped.size() - 40] ^= 1;  // inside the data section
  write(flipped);
  CheckerRun r = check(path_);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("CRC32"), std::string::npos) << r.output;

  write(good_.substr(0, good_.size() - 5));
  r = check(path_);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("beyond"), std::string::npos) << r.output;

  std::string bad_len = good_;
  bad_len[5] = 1;  // header length field far beyond the file
  write(bad_len);
  r = check(path_);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("bad header length"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace gtron

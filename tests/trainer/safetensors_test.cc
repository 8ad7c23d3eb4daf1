#include "trainer/io/safetensors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

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

void spit(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(v >> (8 * i));
  return s;
}

// A file as another tool would write it: our own header text and data bytes, no CRC.
void write_raw(const std::string& path, const std::string& header, const std::string& data) {
  spit(path, le64(header.size()) + header + data);
}

std::string bytes_of(const Tensor& t) {
  return std::string(static_cast<const char*>(t.raw()), t.nbytes());
}

// Expects read_safetensors(path) to throw a UserError naming the file and containing `phrase`.
void expect_rejected(const std::string& path, const std::string& phrase) {
  try {
    read_safetensors(path);
    ADD_FAILURE() << "no error for " << path << " (expected '" << phrase << "')";
  } catch (const UserError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'" + path + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find(phrase), std::string::npos) << msg;
  }
}

std::vector<NamedTensor> sample_tensors() {
  return {
      {"f32.matrix", Tensor::from_vector({1.5, -2, 3.25, 0, 1e-8, 7}, {2, 3}, DType::kF32)},
      {"bf16.vec", Tensor::from_vector({1, -0.5, 3.140625, 1024}, {4}, DType::kBF16)},
      {"f64.rank4", Tensor::from_vector({0.1, -0.2, 0.3, 1e300}, {1, 2, 2, 1}, DType::kF64)},
      {"i32.ids", Tensor::from_ints({0, -7, 2147483647}, {3})},
      {"scalar", Tensor::from_vector({42.5}, Shape{}, DType::kF32)},
      {"empty.f32", Tensor::zeros({0, 5}, DType::kF32)},
      {"empty.bf16", Tensor::zeros({0}, DType::kBF16)},
  };
}

TEST(Crc32, KnownValuesAndChaining) {
  const std::string check = "123456789";
  EXPECT_EQ(crc32(check.data(), check.size()), 0xCBF43926u);  // the standard check value
  EXPECT_EQ(crc32(nullptr, 0), 0u);
  EXPECT_EQ(crc32_hex(0xCBF43926u), "cbf43926");
  EXPECT_EQ(crc32_hex(0x1u), "00000001");
  // Bit-at-a-time reference over unaligned starts and lengths around the 8-byte fast path.
  std::mt19937 rng(7);
  std::string buf(203, '\0');
  for (char& c : buf) c = static_cast<char>(rng());
  for (size_t start : {0, 1, 3, 7}) {
    for (size_t len : {0, 1, 7, 8, 9, 15, 16, 17, 64, 195}) {
      uint32_t ref = 0xFFFFFFFFu;
      for (size_t i = start; i < start + len; ++i) {
        ref ^= static_cast<unsigned char>(buf[i]);
        for (int k = 0; k < 8; ++k) ref = (ref & 1u) ? (ref >> 1) ^ 0xEDB88320u : ref >> 1;
      }
      ref = ~ref;
      EXPECT_EQ(crc32(buf.data() + start, len), ref) << start << "+" << len;
      const size_t cut = len / 3;
      EXPECT_EQ(crc32(buf.data() + start + cut, len - cut, crc32(buf.data() + start, cut)), ref);
    }
  }
}

TEST(Safetensors, RoundTripEveryDtypeAndShape) {
  const std::string path = tmp_path("roundtrip.safetensors");
  const std::vector<NamedTensor> in = sample_tensors();
  const SafetensorsMetadata meta = {{"format", "pt"}, {"gtron.step", "40"}};
  write_safetensors(path, in, meta);
  const SafetensorsFile out = read_safetensors(path);
  EXPECT_EQ(out.metadata, meta);  // the CRC key is consumed by the reader
  ASSERT_EQ(out.tensors.size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    SCOPED_TRACE(in[i].name);
    EXPECT_EQ(out.tensors[i].name, in[i].name);
    EXPECT_EQ(out.tensors[i].tensor.dtype(), in[i].tensor.dtype());
    EXPECT_EQ(out.tensors[i].tensor.shape(), in[i].tensor.shape());
    EXPECT_TRUE(out.tensors[i].tensor.device().is_cpu());
    EXPECT_EQ(bytes_of(out.tensors[i].tensor), bytes_of(in[i].tensor));
    EXPECT_EQ(out.tensors[i].tensor.to_vector(), in[i].tensor.to_vector());
  }
  EXPECT_EQ(out.tensors[4].tensor.rank(), 0);
  EXPECT_EQ(out.tensors[4].tensor.item(), 42.5);
  EXPECT_EQ(out.tensors[5].tensor.numel(), 0);
}

TEST(Safetensors, NoTensorsAndViews) {
  const std::string empty = tmp_path("none.safetensors");
  write_safetensors(empty, {});
  EXPECT_TRUE(read_safetensors(empty).tensors.empty());

  // A rows() view writes its own rows only.
  Tensor full = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {3, 2}, DType::kF32);
  const std::string path = tmp_path("view.safetensors");
  write_safetensors(path, {{"mid", full.rows(1, 2)}});
  const SafetensorsFile out = read_safetensors(path);
  ASSERT_EQ(out.tensors.size(), 1u);
  EXPECT_EQ(out.tensors[0].tensor.shape(), Shape({1, 2}));
  EXPECT_EQ(out.tensors[0].tensor.to_vector(), (std::vector<double>{3, 4}));
}

TEST(Safetensors, HeaderBytes) {
  const std::string path = tmp_path("header.safetensors");
  Tensor w = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {3, 2}, DType::kF32);  // 24 bytes
  Tensor b = Tensor::from_vector({7, 8, 9, 10}, {4}, DType::kBF16);         // 8 bytes
  write_safetensors(path, {{"w", w}, {"b", b}}, {{"note", "x"}});
  const std::string file = slurp(path);
  ASSERT_GE(file.size(), 8u);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i)
    n |= static_cast<uint64_t>(static_cast<unsigned char>(file[i])) << (8 * i);
  EXPECT_EQ((8 + n) % 8, 0u);
  EXPECT_EQ(file.size(), 8 + n + 32);
  const std::string header = file.substr(8, n);
  EXPECT_EQ(header.front(), '{');
  const size_t close = header.find_last_of('}');
  EXPECT_EQ(header.find_first_not_of(' ', close + 1), std::string::npos) << "pads with spaces";
  EXPECT_LT(header.size() - close - 1, 8u) << "at most 7 bytes of padding";
  EXPECT_LT(header.find("\"w\""), header.find("\"b\"")) << "entries appear in data order";

  const nlohmann::json j = nlohmann::json::parse(header);
  EXPECT_EQ(j["w"]["dtype"], "F32");
  EXPECT_EQ(j["w"]["shape"], nlohmann::json::array({3, 2}));
  EXPECT_EQ(j["w"]["data_offsets"], nlohmann::json::array({0, 24}));
  EXPECT_EQ(j["b"]["dtype"], "BF16");
  EXPECT_EQ(j["b"]["shape"], nlohmann::json::array({4}));
  EXPECT_EQ(j["b"]["data_offsets"], nlohmann::json::array({24, 32}));
  EXPECT_EQ(j["__metadata__"]["note"], "x");

  const std::string data = file.substr(8 + n);
  EXPECT_EQ(data, bytes_of(w) + bytes_of(b));
  EXPECT_EQ(j["__metadata__"][kSafetensorsCrcKey], crc32_hex(crc32(data.data(), data.size())));
}

TEST(Safetensors, ForeignFileWithoutCrcReads) {
  const std::string path = tmp_path("foreign.safetensors");
  const std::string data = bytes_of(Tensor::from_ints({5, 6}, {2}));
  write_raw(path, R"({"t":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}})", data);
  const SafetensorsFile out = read_safetensors(path);
  ASSERT_EQ(out.tensors.size(), 1u);
  EXPECT_EQ(out.tensors[0].tensor.to_vector(), (std::vector<double>{5, 6}));
  EXPECT_TRUE(out.metadata.empty());
}

class SafetensorsCorruption : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = tmp_path(std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) +
                     ".safetensors");
    write_safetensors(path_, sample_tensors());
    good_ = slurp(path_);
    for (int i = 0; i < 8; ++i)
      n_ |= static_cast<uint64_t>(static_cast<unsigned char>(good_[i])) << (8 * i);
  }
  std::string path_;
  std::string good_;
  uint64_t n_ = 0;
};

TEST_F(SafetensorsCorruption, TruncatedData) {
  spit(path_, good_.substr(0, good_.size() - 4));
  expect_rejected(path_, "out of bounds");
}

TEST_F(SafetensorsCorruption, TruncatedInsideLengthField) {
  spit(path_, good_.substr(0, 5));
  expect_rejected(path_, "truncated");
}

TEST_F(SafetensorsCorruption, TruncatedInsideHeader) {
  spit(path_, good_.substr(0, 8 + n_ / 2));
  expect_rejected(path_, "bad header length");
}

TEST_F(SafetensorsCorruption, BadHeaderLength) {
  spit(path_, le64(uint64_t{1} << 40) + good_.substr(8));
  expect_rejected(path_, "bad header length");
}

TEST_F(SafetensorsCorruption, BadJson) {
  std::string bad = good_;
  bad[8] = 'x';  // the opening brace
  spit(path_, bad);
  expect_rejected(path_, "not valid JSON");
}

TEST_F(SafetensorsCorruption, CrcMismatch) {
  std::string bad = good_;
  bad[8 + n_ + 3] ^= 0x10;  // one bit of the first tensor
  spit(path_, bad);
  expect_rejected(path_, "CRC mismatch");
}

TEST_F(SafetensorsCorruption, TrailingBytes) {
  spit(path_, good_ + "junk");
  expect_rejected(path_, "trailing bytes");
}

TEST_F(SafetensorsCorruption, MissingFile) {
  std::remove(path_.c_str());
  expect_rejected(path_, "cannot open");
}

TEST(SafetensorsHeader, EveryInvalidHeaderIsNamed) {
  const std::string path = tmp_path("bad_header.safetensors");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", "out of bounds"},
      {R"({"t":{"dtype":"F16","shape":[4],"data_offsets":[0,8]}})", "dtype"},
      {R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", "needs 12"},
      {R"({"t":{"dtype":"F32","shape":[1,1,1,1,2],"data_offsets":[0,8]}})", "at most 4"},
      {R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", "non-negative"},
      {R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", "data_offsets"},
      {R"({"t":{"dtype":"F32","shape":[2]}})", "no \"data_offsets\""},
      {R"({"t":[1,2]})", "expected an object"},
      {R"([1,2])", "expected an object"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", "gap of 4 bytes"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
       R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
       "overlaps"},
      {R"({"__metadata__":{"k":1},"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
       "expected a string"},
      {R"({"__metadata__":{"gtron.crc32":"00000000"},)"
       R"("t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
       "CRC mismatch"},
  };
  for (const auto& [header, phrase] : cases) {
    SCOPED_TRACE(header);
    // 8 bytes of 0x01 so that an all-zero CRC cannot match by accident.
    write_raw(path, header, std::string(8, '\x01'));
    expect_rejected(path, phrase);
  }
}

// The value of IEEE half `h`, from the format's definition (not from bit shuffling).
double half_value(uint16_t h) {
  const int exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (exp == 0x1f) return man ? std::nan("") : sign * INFINITY;
  if (exp == 0) return sign * std::ldexp(man, -24);
  return sign * std::ldexp(1024 + man, exp - 25);
}

// The value of bfloat16 `b`: 8 exponent bits (bias 127), 7 mantissa bits.
double bf16_value(uint16_t b) {
  const int exp = (b >> 7) & 0xff, man = b & 0x7f;
  const double sign = (b & 0x8000) ? -1.0 : 1.0;
  if (exp == 0xff) return man ? std::nan("") : sign * INFINITY;
  if (exp == 0) return sign * std::ldexp(man, -133);
  return sign * std::ldexp(128 + man, exp - 134);
}

// Every 16-bit pattern once, little-endian.
std::string all_16_bit_patterns() {
  std::string bytes;
  for (uint32_t v = 0; v < 65536; ++v) {
    bytes.push_back(static_cast<char>(v & 0xff));
    bytes.push_back(static_cast<char>(v >> 8));
  }
  return bytes;
}

void expect_value(float got, double want, uint32_t bits) {
  if (std::isnan(want)) {
    EXPECT_TRUE(std::isnan(got)) << "pattern " << bits;
  } else {
    EXPECT_EQ(static_cast<double>(got), want) << "pattern " << bits;
    EXPECT_EQ(std::signbit(got), std::signbit(want)) << "pattern " << bits;  // -0 stays -0
  }
}

TEST(SafetensorsF32, WidensEveryBf16AndF16ValueExactly) {
  const std::string path = tmp_path("widen.safetensors");
  const std::string all = all_16_bit_patterns();
  const std::string f32 = bytes_of(Tensor::from_vector({1.5, -3}, {2}, DType::kF32));
  write_raw(path,
            R"({"h":{"dtype":"F16","shape":[256,256],"data_offsets":[0,131072]},)"
            R"("b":{"dtype":"BF16","shape":[65536],"data_offsets":[131072,262144]},)"
            R"("f":{"dtype":"F32","shape":[2],"data_offsets":[262144,262152]}})",
            all + all + f32);
  const SafetensorsFile out = read_safetensors_f32(path);
  ASSERT_EQ(out.tensors.size(), 3u);
  for (const NamedTensor& nt : out.tensors) EXPECT_EQ(nt.tensor.dtype(), DType::kF32) << nt.name;
  EXPECT_EQ(out.tensors[0].tensor.shape(), Shape({256, 256}));
  const float* h = out.tensors[0].tensor.data<float>();
  const float* b = out.tensors[1].tensor.data<float>();
  for (uint32_t v = 0; v < 65536; ++v) {
    expect_value(h[v], half_value(static_cast<uint16_t>(v)), v);
    expect_value(b[v], bf16_value(static_cast<uint16_t>(v)), v);
  }
  EXPECT_EQ(h[0x0001], std::ldexp(1.0f, -24));  // the smallest subnormal half
  EXPECT_EQ(h[0x7bff], 65504.0f);               // the largest finite half
  EXPECT_EQ(out.tensors[2].tensor.to_vector(), (std::vector<double>{1.5, -3}));
  // The plain reader keeps BF16 as BF16 and has no F16.
  expect_rejected(path, "has dtype \"F16\"");
}

TEST(SafetensorsF32, CrcCoversTheBytesOnDisk) {
  const std::string path = tmp_path("widen_crc.safetensors");
  write_safetensors(path,
                    {{"b", Tensor::from_vector({1, -0.5, 3.140625, 1024}, {4}, DType::kBF16)}});
  const SafetensorsFile out = read_safetensors_f32(path);
  ASSERT_EQ(out.tensors.size(), 1u);
  EXPECT_EQ(out.tensors[0].tensor.dtype(), DType::kF32);
  EXPECT_EQ(out.tensors[0].tensor.to_vector(), (std::vector<double>{1, -0.5, 3.140625, 1024}));
  std::string bytes = slurp(path);
  bytes[bytes.size() - 1] ^= 0x01;
  spit(path, bytes);
  EXPECT_THROW(read_safetensors_f32(path), UserError);
}

TEST(SafetensorsF32, OtherDtypesAreRefusedNamingTheTensor) {
  const std::string path = tmp_path("widen_refused.safetensors");
  for (const char* dtype : {"F64", "I32", "I8", "U8", "F8_E4M3", "BOOL"}) {
    SCOPED_TRACE(dtype);
    const int bytes = std::string(dtype) == "F64" ? 8 : std::string(dtype) == "I32" ? 4 : 1;
    write_raw(path,
              str_cat(R"({"ok":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)",
                      R"("layers.3.w":{"dtype":")", dtype, R"(","shape":[8],"data_offsets":[8,)",
                      8 + 8 * bytes, "]}}"),
              std::string(8 + 8 * bytes, '\0'));
    try {
      read_safetensors_f32(path);
      ADD_FAILURE() << "no error";
    } catch (const UserError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(str_cat("tensor 'layers.3.w' has dtype \"", dtype, "\"")),
                std::string::npos)
          << msg;
      EXPECT_NE(msg.find("F32, BF16, F16"), std::string::npos) << msg;
    }
  }
}

}  // namespace
}  // namespace gtron

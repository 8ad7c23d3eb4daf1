// The GEMM key and the pinned-algorithm table's matching (model/cuda/gemm_table.h), without a
// GPU: alignments in the key, exact matches on device, cuBLASLt version and every key field,
// malformed entries refused, the committed table well formed, the entry line format.
#include "model/cuda/gemm_table.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <tuple>

#include "model/check.h"

namespace gtron::cuda {
namespace {

void* at(uintptr_t address) { return reinterpret_cast<void*>(address); }

GemmArgs sample_args() {
  GemmArgs g;
  g.a = at(0x10000);
  g.b = at(0x20000);
  g.c = at(0x30000);
  g.m = 256;
  g.n = 384;
  g.k = 512;
  g.ab = DType::kBF16;
  g.c_type = DType::kBF16;
  g.trans_b = true;
  return g;
}

GemmKey sample_key() {
  GemmKey key{};
  for (int i = 0; i < kGemmKeyFields; ++i) key[i] = 10 + i;
  return key;
}

TEST(GemmTable, KeyRecordsProblemAndAlignments) {
  GemmArgs g = sample_args();
  GemmKey key = gemm_key(g);
  EXPECT_EQ(key[kKeyM], 256);
  EXPECT_EQ(key[kKeyN], 384);
  EXPECT_EQ(key[kKeyK], 512);
  EXPECT_EQ(key[kKeyTransA], 0);
  EXPECT_EQ(key[kKeyTransB], 1);
  EXPECT_EQ(key[kKeyAbType], static_cast<int64_t>(DType::kBF16));
  EXPECT_EQ(key[kKeyAlignA], 256);
  EXPECT_EQ(key[kKeyAlignB], 256);
  EXPECT_EQ(key[kKeyAlignC], 256);
  EXPECT_EQ(key[kKeyAlignBias], 0);
  EXPECT_EQ(key[kKeyHasBias], 0);
  EXPECT_EQ(key[kKeyBiasType], -1);
  EXPECT_EQ(key[kKeyBetaZero], 1);
  EXPECT_EQ(key[kKeyAux], 0);

  g.a = at(0x10006);  // 2-byte aligned
  g.bias = at(0x40010);
  g.bias_type = DType::kF32;
  g.beta = 1.0f;
  g.epilogue = Epilogue::kGeluAux;
  g.aux = at(0x50040);
  g.aux_ld = 384;
  key = gemm_key(g);
  EXPECT_EQ(key[kKeyAlignA], 2);
  EXPECT_EQ(key[kKeyAlignBias], 16);
  EXPECT_EQ(key[kKeyHasBias], 1);
  EXPECT_EQ(key[kKeyBiasType], static_cast<int64_t>(DType::kF32));
  EXPECT_EQ(key[kKeyBetaZero], 0);
  EXPECT_EQ(key[kKeyEpilogue], static_cast<int64_t>(Epilogue::kGeluAux));
  EXPECT_EQ(key[kKeyAux], 64 + 1000 * 384);
}

TEST(GemmTable, BatchStrideLowersTheAlignment) {
  GemmArgs g = sample_args();
  g.batch = 3;
  g.stride_a = 256 * 512 + 3;  // bf16: a stride of 2 · odd bytes
  g.stride_b = 512 * 384;
  g.stride_c = 256 * 384;
  const GemmKey key = gemm_key(g);
  EXPECT_EQ(key[kKeyAlignA], 2);
  EXPECT_EQ(key[kKeyAlignB], 256);
  EXPECT_EQ(key[kKeyStrideA], 256 * 512 + 3);
}

TEST(GemmTable, MatchesOnlyTheExactDeviceVersionAndKey) {
  clear_added_tuned_gemms();
  const GemmKey key = sample_key();
  add_tuned_gemm(TunedGemm{"NVIDIA H200", 130100, key, 3, 16});
  const auto hit = find_tuned_gemm("NVIDIA H200", 130100, key);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->index, 3);
  EXPECT_EQ(hit->requested, 16);
  EXPECT_FALSE(find_tuned_gemm("NVIDIA H100 80GB HBM3", 130100, key).has_value());
  EXPECT_FALSE(find_tuned_gemm("NVIDIA H200", 130101, key).has_value());
  for (int i = 0; i < kGemmKeyFields; ++i) {
    GemmKey other = key;
    other[i] += 1;
    EXPECT_FALSE(find_tuned_gemm("NVIDIA H200", 130100, other).has_value()) << "field " << i;
  }
  clear_added_tuned_gemms();
  EXPECT_FALSE(find_tuned_gemm("NVIDIA H200", 130100, key).has_value());
}

TEST(GemmTable, LatestAdditionWins) {
  clear_added_tuned_gemms();
  add_tuned_gemm(TunedGemm{"NVIDIA H200", 130100, sample_key(), 1, 4});
  add_tuned_gemm(TunedGemm{"NVIDIA H200", 130100, sample_key(), 2, 8});
  const auto hit = find_tuned_gemm("NVIDIA H200", 130100, sample_key());
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->index, 2);
  EXPECT_EQ(hit->requested, 8);
  clear_added_tuned_gemms();
}

TEST(GemmTable, MalformedEntryIsRefused) {
  EXPECT_DEATH(add_tuned_gemm(TunedGemm{"NVIDIA H200", 1, sample_key(), 4, 4}),
               "index 4 of 4 requested");
  EXPECT_DEATH(add_tuned_gemm(TunedGemm{"NVIDIA H200", 1, sample_key(), -1, 4}),
               "index -1 of 4 requested");
}

TEST(GemmTable, CommittedTableIsWellFormed) {
  std::set<std::tuple<std::string, size_t, GemmKey>> seen;
  for (const TunedGemm& e : committed_tuned_gemms()) {
    EXPECT_FALSE(e.device.empty());
    EXPECT_GT(e.cublaslt_version, 0u);
    EXPECT_GT(e.key[kKeyM], 0);
    EXPECT_GT(e.key[kKeyN], 0);
    EXPECT_GT(e.key[kKeyK], 0);
    EXPECT_GE(e.index, 1) << "an entry for result 0 changes nothing";
    EXPECT_GT(e.requested, e.index);
    EXPECT_TRUE(seen.emplace(e.device, e.cublaslt_version, e.key).second)
        << "duplicate entry m " << e.key[kKeyM] << " n " << e.key[kKeyN] << " k " << e.key[kKeyK];
  }
}

TEST(GemmTable, EntryLineAndJson) {
  const TunedGemm e{"NVIDIA H200", 130100, sample_key(), 3, 16};
  EXPECT_EQ(tuned_gemm_entry(e),
            "{\"NVIDIA H200\", 130100, {10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, "
            "24, 25, 26, 27, 28, 29, 30}, 3, 16},");
  const GemmKey key = gemm_key(sample_args());
  EXPECT_EQ(gemm_key_json(key),
            "\"m\": 256, \"n\": 384, \"k\": 512, \"batch\": 1, \"trans_a\": false, \"trans_b\": "
            "true, \"ab\": \"bf16\", \"c\": \"bf16\", \"epilogue\": \"none\", \"bias\": false, "
            "\"beta0\": true, \"fp8\": 0");
}

TEST(GemmTable, TableTextParsesBackWhatEntryLinesPrint) {
  const TunedGemm a{"NVIDIA H200", 130100, sample_key(), 3, 16};
  GemmKey k2 = sample_key();
  k2[kKeyM] = -1;  // negative fields (bias type -1) parse too
  const TunedGemm b{"Some GPU", 7, k2, 1, 4};
  const std::string text = "// comment\n\n  " + tuned_gemm_entry(a) + "\r\n" + tuned_gemm_entry(b);
  const std::vector<TunedGemm> got = parse_tuned_gemm_entries(text, "t.inc");
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].device, a.device);
  EXPECT_EQ(got[0].cublaslt_version, a.cublaslt_version);
  EXPECT_EQ(got[0].key, a.key);
  EXPECT_EQ(got[0].index, 3);
  EXPECT_EQ(got[0].requested, 16);
  EXPECT_EQ(got[1].device, "Some GPU");
  EXPECT_EQ(got[1].key, k2);
  EXPECT_EQ(got[1].requested, 4);
}

TEST(GemmTable, MalformedTableTextNamesTheLine) {
  const std::string good = tuned_gemm_entry(TunedGemm{"NVIDIA H200", 1, sample_key(), 1, 2});
  auto message = [](const std::string& text) {
    try {
      parse_tuned_gemm_entries(text, "t.inc");
    } catch (const gtron::UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(good + "\n{\"NVIDIA H200\", 1, {1, 2}, 0, 2},").find("t.inc:2: 5 numbers"),
            std::string::npos);
  EXPECT_NE(message("{NVIDIA H200, 1}").find("t.inc:1: no quoted device name"), std::string::npos);
  EXPECT_NE(message(good.substr(0, good.size() - 6) + "x 1, 2},").find("unexpected 'x'"),
            std::string::npos);
  const std::string idx = tuned_gemm_entry(TunedGemm{"G", 1, sample_key(), 1, 2});
  EXPECT_NE(message(idx.substr(0, idx.size() - 6) + "2, 2},").find("index 2 of 2 requested"),
            std::string::npos);
}

}  // namespace
}  // namespace gtron::cuda

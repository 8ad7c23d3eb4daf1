// The attention sweep's host logic (tests/model/attention_sweep.h), without a GPU: the cells of
// the default flags and of moved ones, the FLOP convention against hand-counted numbers, the
// median, and the flag errors.
#include "tests/model/attention_sweep.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace gtron::bench {
namespace {

std::string parse(std::vector<const char*> args, SweepFlags* f) {
  args.insert(args.begin(), "bench_attention");
  return parse_sweep_flags(static_cast<int>(args.size()), args.data(), f);
}

TEST(AttentionSweep, DefaultCellsAreTheIssuesTwenty) {
  SweepFlags f;
  ASSERT_EQ(parse({}, &f), "");
  const std::vector<AttentionCell> cells = sweep_cells(f);
  ASSERT_EQ(cells.size(), 20u);
  for (const AttentionCell& c : cells) {
    EXPECT_EQ(c.B * c.T, 16384);
    EXPECT_EQ(c.NH * c.HS, 2048);
    EXPECT_TRUE(c.NKV == c.NH || c.NKV * 4 == c.NH);
  }
  EXPECT_EQ(cell_json(cells.front()),
            "{\"hs\": 64, \"T\": 512, \"B\": 32, \"nh\": 32, \"nkv\": 32}");
  EXPECT_EQ(cell_json(cells[5]), "{\"hs\": 64, \"T\": 512, \"B\": 32, \"nh\": 32, \"nkv\": 8}");
  EXPECT_EQ(cell_json(cells.back()),
            "{\"hs\": 128, \"T\": 8192, \"B\": 2, \"nh\": 16, \"nkv\": 4}");
  EXPECT_EQ(f.variants, (std::vector<std::string>{"plain", "rope", "bias"}));
  EXPECT_FALSE(f.list);
}

TEST(AttentionSweep, FlagsMoveTheCells) {
  SweepFlags f;
  ASSERT_EQ(parse({"--hs", "128", "--modes", "gqa", "--T", "256,1024", "--tokens", "4096",
                   "--width", "512", "--group", "2", "--variants", "rope", "--list"},
                  &f),
            "");
  const std::vector<AttentionCell> cells = sweep_cells(f);
  ASSERT_EQ(cells.size(), 2u);
  EXPECT_EQ(cell_json(cells[0]), "{\"hs\": 128, \"T\": 256, \"B\": 16, \"nh\": 4, \"nkv\": 2}");
  EXPECT_EQ(cell_json(cells[1]), "{\"hs\": 128, \"T\": 1024, \"B\": 4, \"nh\": 4, \"nkv\": 2}");
  EXPECT_EQ(f.variants, std::vector<std::string>{"rope"});
  EXPECT_TRUE(f.list);
}

// The FA3 variants (the one-CTA-a-tile forward and its persistent schedules) are asked by name.
TEST(AttentionSweep, Fa3VariantsParse) {
  SweepFlags f;
  ASSERT_EQ(parse({"--variants", "plain,fa3,fa3p,fa3pairs,fa3dq", "--list"}, &f), "");
  EXPECT_EQ(f.variants, (std::vector<std::string>{"plain", "fa3", "fa3p", "fa3pairs", "fa3dq"}));
  EXPECT_NE(sweep_usage().find("fa3pairs"), std::string::npos);
  EXPECT_NE(sweep_usage().find("fa3dq"), std::string::npos);
}

TEST(AttentionSweep, FlopsAreFlashAttentionsCausalCount) {
  // HS 128, T 8192, B 2, NH 16: 4·2·16·8192²·128 / 2 = 2^2·2·2^4·2^26·2^7 / 2 = 2^39.
  const AttentionCell c{128, 8192, 2, 16, 4};
  EXPECT_DOUBLE_EQ(forward_flops(c), 549755813888.0);
  EXPECT_DOUBLE_EQ(backward_flops(c), 2.5 * 549755813888.0);
  // GQA counts per query head: the same as MHA.
  EXPECT_DOUBLE_EQ(forward_flops(AttentionCell{128, 8192, 2, 16, 16}), forward_flops(c));
  EXPECT_DOUBLE_EQ(tflops(1e12, 1000.0), 1.0);
  EXPECT_DOUBLE_EQ(tflops(549755813888.0, 1.0), 549.755813888);
}

TEST(AttentionSweep, Median) {
  EXPECT_DOUBLE_EQ(median({3.0, 1.0, 2.0}), 2.0);
  EXPECT_DOUBLE_EQ(median({4.0, 1.0, 3.0, 2.0}), 2.5);
  EXPECT_DOUBLE_EQ(median({7.0}), 7.0);
}

TEST(AttentionSweep, BadFlagsNameTheFlagAndWhatWasExpected) {
  const std::vector<std::pair<std::vector<const char*>, std::string>> cases = {
      {{"--hs", "96"}, "--hs: got '96', expected 64 or 128"},
      {{"--T", "1000"}, "--T 1000 does not divide --tokens 16384"},
      {{"--T", "512,,1024"}, "--T: got '512,,1024', expected a comma-separated list"},
      {{"--T", "0"}, "positive integers"},
      {{"--group", "3"}, "--group 3 does not divide the 32 query heads of head size 64"},
      {{"--width", "1000"}, "--width 1000 is not a multiple of head size 64"},
      {{"--modes", "mqa"}, "expected a comma-separated list of mha,gqa"},
      {{"--variants", "plain,fast"}, "expected a comma-separated list of plain,rope,bias"},
      {{"--repeats", "0"}, "--repeats: got '0', expected an integer >= 1"},
      {{"--warmup", "-1"}, "--warmup: got '-1', expected an integer >= 0"},
      {{"--tol", "0"}, "--tol: got '0', expected a number > 0"},
      {{"--tol", "abc"}, "--tol: got 'abc'"},
      {{"--speed", "1"}, "unknown flag --speed"},
      {{"--repeats"}, "--repeats needs a value"},
      {{"512"}, "unexpected argument '512'"},
  };
  for (const auto& [args, want] : cases) {
    SweepFlags f;
    const std::string err = parse(args, &f);
    EXPECT_NE(err.find(want), std::string::npos) << "got: " << err << "\nwant: " << want;
  }
  // GQA's divisibility only matters when gqa cells are asked for.
  SweepFlags f;
  EXPECT_EQ(parse({"--group", "3", "--modes", "mha"}, &f), "");
}

TEST(AttentionSweep, UsageNamesEveryFlag) {
  const std::string u = sweep_usage();
  for (const char* flag : {"--hs", "--modes", "--T", "--tokens", "--width", "--group", "--variants",
                           "--warmup", "--repeats", "--rotate", "--tol", "--seed", "--list"}) {
    EXPECT_NE(u.find(flag), std::string::npos) << flag;
  }
}

}  // namespace
}  // namespace gtron::bench

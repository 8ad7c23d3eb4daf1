#include "model/ops/embedding.h"

#include <gtest/gtest.h>

#include "tests/model/gradcheck.h"
#include "tests/model/op_check.h"

namespace gtron {
namespace {

TEST(Embedding, GathersRows) {
  // table rows: 0 -> [0, 1], 1 -> [10, 11], 2 -> [20, 21]; tokens [[2, 0], [2, 1]].
  Var table = Var::constant(Tensor::from_vector({0, 1, 10, 11, 20, 21}, {3, 2}, DType::kF32));
  Tensor tokens = Tensor::from_ints({2, 0, 2, 1}, {2, 2});
  Var y = embedding(tokens, table);
  EXPECT_EQ(y.shape(), (Shape{2, 2, 2}));
  EXPECT_EQ(y.value().to_vector(), (std::vector<double>{20, 21, 0, 1, 20, 21, 10, 11}));
}

TEST(Embedding, RepeatedIdsSumTheirGradients) {
  Var table = Var::leaf(Tensor::zeros({3, 2}, DType::kF64));
  Tensor tokens = Tensor::from_ints({2, 0, 2, 2}, {1, 4});
  Var y = embedding(tokens, table);
  backward_with(y, Tensor::from_vector({1, 2, 3, 4, 5, 6, 7, 8}, {1, 4, 2}, DType::kF64));
  // Row 2 gets dy rows 0, 2 and 3; row 0 gets dy row 1; row 1 nothing.
  EXPECT_EQ(table.grad().to_vector(), (std::vector<double>{3, 4, 0, 0, 1 + 5 + 7, 2 + 6 + 8}));
}

TEST(Embedding, GradCheck) {
  Parameter table("wte", testing::randn_tensor({5, 7}, 1));
  Tensor tokens = Tensor::from_ints({4, 1, 4, 0, 3, 1, 4, 2, 0, 4}, {2, 5});  // ids repeat
  auto res = testing::gradcheck(
      [&](const std::vector<Var>&) { return embedding(tokens, Var::param(table)); }, {}, {&table});
  EXPECT_LT(res.worst_error, 1e-6) << res.worst_name;
}

TEST(AddPositions, KnownValues) {
  // x = [[[1, 2], [3, 4]]], wpe (Tmax = 3) = [[10, 20], [30, 40], [50, 60]]: only rows 0, 1 used.
  Var x = Var::constant(Tensor::from_vector({1, 2, 3, 4}, {1, 2, 2}, DType::kF32));
  Var wpe = Var::constant(Tensor::from_vector({10, 20, 30, 40, 50, 60}, {3, 2}, DType::kF32));
  EXPECT_EQ(add_positions(x, wpe).value().to_vector(), (std::vector<double>{11, 22, 33, 44}));
}

TEST(AddPositions, GradCheckWithTShorterThanTmax) {
  Parameter wpe("wpe", testing::randn_tensor({8, 7}, 2));
  auto res = testing::gradcheck(
      [&](const std::vector<Var>& in) { return add_positions(in[0], Var::param(wpe)); },
      {testing::randn_tensor({3, 5, 7}, 3)}, {&wpe});
  EXPECT_LT(res.worst_error, 1e-6) << res.worst_name;
  // Rows of wpe past T = 5 are never used, so their gradient stays exactly zero.
  std::vector<double> g = wpe.main_grad.to_vector();
  for (size_t i = 5 * 7; i < g.size(); ++i) EXPECT_EQ(g[i], 0.0) << i;
}

TEST(EmbeddingAndPositions, Composed) {
  Parameter wte("wte", testing::randn_tensor({6, 5}, 4));
  Parameter wpe("wpe", testing::randn_tensor({4, 5}, 5));
  Tensor tokens = Tensor::from_ints({1, 1, 5, 0, 2, 1}, {2, 3});
  auto res = testing::gradcheck(
      [&](const std::vector<Var>&) {
        return add_positions(embedding(tokens, Var::param(wte)), Var::param(wpe));
      },
      {}, {&wte, &wpe});
  EXPECT_LT(res.worst_error, 1e-6) << res.worst_name;
}

// Tokens for the larger runs: a fixed pseudo-random sequence with many repeats.
Tensor make_tokens(int64_t B, int64_t T, int32_t V) {
  std::vector<int32_t> ids(static_cast<size_t>(B * T));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 7919 + 13) % V);
  return Tensor::from_ints(ids, {B, T});
}

Var embed_then_position(const Tensor& tokens, const std::vector<Var>& in) {
  return add_positions(embedding(tokens, in[0]), in[1]);
}

TEST(EmbeddingAndPositions, F32MatchesF64) {
  Tensor tokens = make_tokens(4, 48, 37);
  auto f = [&](const std::vector<Var>& in) { return embed_then_position(tokens, in); };
  std::vector<Tensor> inputs = {testing::randn_tensor({37, 96}, 6),
                                testing::randn_tensor({64, 96}, 7)};
  auto r32 = testing::run_op(f, inputs, DType::kF32);
  auto r64 = testing::run_op(f, inputs, DType::kF64);
  for (size_t k = 0; k < r64.size(); ++k) EXPECT_LT(testing::rel_diff(r32[k], r64[k]), 1e-5) << k;
}

TEST(EmbeddingAndPositions, DeterministicAcrossRunsAndThreadCounts) {
  Tensor tokens = make_tokens(4, 64, 37);
  auto f = [&](const std::vector<Var>& in) { return embed_then_position(tokens, in); };
  std::vector<Tensor> inputs = {testing::randn_tensor({37, 128}, 8),
                                testing::randn_tensor({64, 128}, 9)};
  auto first = testing::run_op(f, inputs, DType::kF32);
  EXPECT_EQ(first, testing::run_op(f, inputs, DType::kF32));
  testing::with_threads(1, [&] { EXPECT_EQ(first, testing::run_op(f, inputs, DType::kF32)); });
}

TEST(EmbeddingDeathTest, TokenOutOfRangeAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Var table = Var::constant(Tensor::zeros({3, 2}, DType::kF32));
  EXPECT_DEATH(embedding(Tensor::from_ints({0, 3}, {1, 2}), table), "token 3 at row 1");
}

}  // namespace
}  // namespace gtron

// Document masking on the CPU (Note [document masking] in model/ops/segments.h): the segment ids
// of packed rows, the attention kernels that keep to them (forward, backward, gradient checks, the
// packed rows against each document alone) and GPT-2's restarted positions.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "model/ops/attention.h"
#include "model/ops/embedding.h"
#include "model/ops/rope.h"
#include "model/ops/segments.h"
#include "tests/model/gradcheck.h"
#include "tests/model/op_check.h"

namespace gtron {
namespace {

int64_t width(int NH, int NKV, int HS) { return (NH + 2 * int64_t{NKV}) * HS; }

// Segment ids [B, T] from each row's document lengths (they sum to T).
Tensor segments_of(const std::vector<std::vector<int>>& lengths) {
  std::vector<int32_t> ids;
  for (const std::vector<int>& row : lengths) {
    for (size_t d = 0; d < row.size(); ++d) ids.insert(ids.end(), row[d], static_cast<int32_t>(d));
  }
  const int64_t B = static_cast<int64_t>(lengths.size());
  return Tensor::from_ints(ids, {B, static_cast<int64_t>(ids.size()) / B});
}

// Rows [t0, t0 + len) of sequence b of x [B, T, W], as a [1, len, W] tensor.
Tensor rows_of(const Tensor& x, int64_t b, int64_t t0, int64_t len) {
  const int64_t T = x.dim(1), W = x.dim(2);
  std::vector<double> all = x.to_vector();
  std::vector<double> part(all.begin() + (b * T + t0) * W, all.begin() + (b * T + t0 + len) * W);
  return Tensor::from_vector(part, {1, len, W}, x.dtype());
}

TEST(DocumentSegments, CountsStartsAfterPositionZeroAndRestartsPositions) {
  // start id 9: position 0 opens segment 0 whatever it holds; a 9 there opens nothing more.
  Tensor tokens = Tensor::from_ints({9, 1, 2, 9, 3, 9, 9, 4,  //
                                     5, 6, 7, 8, 9, 1, 2, 3},
                                    {2, 8});
  Tensor seg = Tensor::empty({2, 8}, DType::kI32), pos = Tensor::empty({2, 8}, DType::kI32);
  document_segments(tokens, 9, seg, &pos);
  const std::vector<int32_t> want_seg = {0, 0, 0, 1, 1, 2, 3, 3, 0, 0, 0, 0, 1, 1, 1, 1};
  const std::vector<int32_t> want_pos = {0, 1, 2, 0, 1, 0, 0, 1, 0, 1, 2, 3, 0, 1, 2, 3};
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(seg.data<int32_t>()[i], want_seg[static_cast<size_t>(i)]) << i;
    EXPECT_EQ(pos.data<int32_t>()[i], want_pos[static_cast<size_t>(i)]) << i;
  }
}

// causal_attention_gqa over packed rows against each document alone, values and gradients.
void expect_packed_is_documents_alone(int NH, int NKV, int HS, bool roped) {
  const std::vector<std::vector<int>> docs = {{3, 1, 5, 4}, {13}, {1, 12}};
  const int64_t B = 3, T = 13, W = width(NH, NKV, HS), C = int64_t{NH} * HS;
  const Tensor seg = segments_of(docs);
  const Tensor inv_freq = rope_table(rope_inv_freq(HS, 10000.0), Device::cpu(), DType::kF64);
  auto attend = [&](const Var& qkv, const Tensor& s) {
    return roped ? causal_attention_gqa_rope(qkv, inv_freq, NH, NKV, HS, 0, false, s)
                 : causal_attention_gqa(qkv, NH, NKV, HS, s);
  };
  Tensor x = testing::randn_tensor({B, T, W}, 21);
  Tensor dy = testing::randn_tensor({B, T, C}, 22);
  Var packed = Var::leaf(x);
  Var y = attend(packed, seg);
  backward_with(y, dy);
  const std::vector<double> got_y = y.value().to_vector(), got_g = packed.grad().to_vector();
  double worst_y = 0, worst_g = 0;
  for (int64_t b = 0; b < B; ++b) {
    int64_t t0 = 0;
    for (int len : docs[static_cast<size_t>(b)]) {
      Var alone = Var::leaf(rows_of(x, b, t0, len));
      Var ya = attend(alone, Tensor());
      backward_with(ya, rows_of(dy, b, t0, len));
      const std::vector<double> want_y = ya.value().to_vector(), want_g = alone.grad().to_vector();
      for (int64_t t = 0; t < len; ++t) {
        for (int64_t c = 0; c < C; ++c) {
          const double d = got_y[static_cast<size_t>((b * T + t0 + t) * C + c)] -
                           want_y[static_cast<size_t>(t * C + c)];
          worst_y = std::max(worst_y, std::abs(d));
        }
        for (int64_t c = 0; c < W; ++c) {
          const double d = got_g[static_cast<size_t>((b * T + t0 + t) * W + c)] -
                           want_g[static_cast<size_t>(t * W + c)];
          worst_g = std::max(worst_g, std::abs(d));
        }
      }
      t0 += len;
    }
  }
  std::printf("NH %d NKV %d rope %d: max |y - alone| %.3g, max |dqkv - alone| %.3g\n", NH, NKV,
              static_cast<int>(roped), worst_y, worst_g);
  EXPECT_LT(worst_y, 1e-13) << "NKV=" << NKV << " rope=" << roped;
  EXPECT_LT(worst_g, 1e-12) << "NKV=" << NKV << " rope=" << roped;
  // The mask does something: without it the packed rows differ.
  const std::vector<double> open = attend(Var::constant(x), Tensor()).value().to_vector();
  EXPECT_GT(testing::rel_diff(open, got_y), 1e-3);
}

TEST(AttentionSegments, PackedRowsAreEachDocumentAlone) {
  expect_packed_is_documents_alone(4, 4, 6, false);  // GPT-2's layout (NKV = NH)
  expect_packed_is_documents_alone(4, 2, 6, false);
  expect_packed_is_documents_alone(4, 1, 8, false);
}

TEST(AttentionSegments, PackedRowsAreEachDocumentAloneWithRope) {
  // RoPE rotates by absolute positions, yet scores depend only on s − t: a document at offset 5
  // of a packed row attends as it does at offset 0 of its own row.
  expect_packed_is_documents_alone(4, 2, 8, true);
}

TEST(AttentionSegments, OneSegmentIsTheUnmaskedAttentionBitForBit) {
  const int NH = 4, NKV = 2, HS = 6;
  std::vector<Tensor> in = {testing::randn_tensor({2, 70, width(NH, NKV, HS)}, 23)};
  const Tensor zeros = Tensor::from_ints(std::vector<int32_t>(140, 0), {2, 70});
  for (DType dt : {DType::kF64, DType::kF32}) {
    auto masked = testing::run_op(
        [&](const std::vector<Var>& v) { return causal_attention_gqa(v[0], NH, NKV, HS, zeros); },
        in, dt);
    auto open = testing::run_op(
        [&](const std::vector<Var>& v) { return causal_attention_gqa(v[0], NH, NKV, HS); }, in, dt);
    EXPECT_EQ(masked, open) << dtype_name(dt);
  }
}

TEST(AttentionSegments, GradCheck) {
  const Tensor seg = segments_of({{2, 3}, {1, 1, 3}});
  for (int NKV : {1, 2, 4}) {
    const int NH = 4, HS = 6;
    auto res = testing::gradcheck(
        [&](const std::vector<Var>& in) { return causal_attention_gqa(in[0], NH, NKV, HS, seg); },
        {testing::randn_tensor({2, 5, width(NH, NKV, HS)}, 24)}, {});
    EXPECT_LT(res.worst_error, 1e-6) << res.worst_name << " NKV=" << NKV;
  }
  auto res = testing::gradcheck(
      [&](const std::vector<Var>& in) { return causal_attention(in[0], 3, seg); },
      {testing::randn_tensor({2, 5, 27}, 25)}, {});
  EXPECT_LT(res.worst_error, 1e-6) << res.worst_name;
}

TEST(AttentionSegments, GradCheckAcrossGemmPanelsWithRope) {
  // T = 67: the score products split into panels; documents cross the panel boundary.
  const Tensor seg = segments_of({{30, 36, 1}});
  const Tensor inv_freq = rope_table(rope_inv_freq(4, 10000.0), Device::cpu(), DType::kF64);
  auto res = testing::gradcheck(
      [&](const std::vector<Var>& in) {
        return causal_attention_gqa_rope(in[0], inv_freq, 2, 1, 4, 0, false, seg);
      },
      {testing::randn_tensor({1, 67, width(2, 1, 4)}, 26)}, {});
  EXPECT_LT(res.worst_error, 1e-6) << res.worst_name;
}

TEST(AttentionSegments, DeterministicAcrossRunsAndThreadCounts) {
  const Tensor seg = segments_of({{20, 44}, {64}, {1, 1, 62}});
  auto f = [&](const std::vector<Var>& v) { return causal_attention_gqa(v[0], 8, 2, 32, seg); };
  std::vector<Tensor> in = {testing::randn_tensor({3, 64, width(8, 2, 32)}, 27)};
  auto first = testing::run_op(f, in, DType::kF32);
  EXPECT_EQ(first, testing::run_op(f, in, DType::kF32));
  testing::with_threads(1, [&] { EXPECT_EQ(first, testing::run_op(f, in, DType::kF32)); });
}

TEST(AttentionSegments, RejectsDecreasingSegments) {
  Var qkv = Var::constant(testing::randn_tensor({1, 4, width(2, 2, 4)}, 28));
  const Tensor bad = Tensor::from_ints({0, 1, 0, 1}, {1, 4});
  EXPECT_DEATH(causal_attention_gqa(qkv, 2, 2, 4, bad), "decrease at position 2");
  const Tensor wrong_shape = Tensor::from_ints({0, 0, 0}, {1, 3});
  EXPECT_DEATH(causal_attention_gqa(qkv, 2, 2, 4, wrong_shape), "segments");
}

TEST(PositionsAt, AddsTheRowOfEachPositionAndScattersItsGradient) {
  // wpe rows are 10·p + c: y = x + wpe[pos].
  std::vector<double> table;
  for (int p = 0; p < 4; ++p)
    for (int c = 0; c < 2; ++c) table.push_back(10.0 * p + c);
  Var wpe = Var::leaf(Tensor::from_vector(table, {4, 2}, DType::kF64));
  Var x = Var::leaf(Tensor::zeros({1, 3, 2}, DType::kF64));
  const Tensor pos = Tensor::from_ints({0, 1, 0}, {1, 3});
  Var y = add_positions(x, wpe, pos);
  EXPECT_EQ(y.value().to_vector(), (std::vector<double>{0, 1, 10, 11, 0, 1}));
  backward_with(y, Tensor::from_vector({1, 2, 3, 4, 5, 6}, {1, 3, 2}, DType::kF64));
  // Position 0 gets rows 0 and 2, position 1 row 1, positions 2 and 3 nothing.
  EXPECT_EQ(wpe.grad().to_vector(), (std::vector<double>{6, 8, 3, 4, 0, 0, 0, 0}));
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{1, 2, 3, 4, 5, 6}));
}

TEST(PositionsAt, GradCheck) {
  const Tensor pos = Tensor::from_ints({0, 1, 2, 0, 1, 0, 1, 2, 3, 0}, {2, 5});
  Parameter wpe("wpe", testing::randn_tensor({6, 3}, 29));
  auto res = testing::gradcheck(
      [&](const std::vector<Var>& in) { return add_positions(in[0], Var::param(wpe), pos); },
      {testing::randn_tensor({2, 5, 3}, 30)}, {&wpe});
  EXPECT_LT(res.worst_error, 1e-6) << res.worst_name;
}

}  // namespace
}  // namespace gtron

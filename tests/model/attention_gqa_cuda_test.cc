// causal_attention_gqa and causal_attention_gqa_rope on CUDA against the CPU kernels, also with
// document masking (GPU test; skipped without a GPU).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/ops/attention.h"
#include "model/ops/rope.h"
#include "tests/model/cuda_op_check.h"
#include "tests/model/gradcheck.h"
#include "tests/model/op_check.h"

namespace gtron {
namespace {

testing::OpCase gqa_case(int64_t B, int64_t T, int NH, int NKV, int HS) {
  testing::OpCase c;
  c.f = [=](const std::vector<Var>& in, const std::vector<Var>&) {
    return causal_attention_gqa(in[0], NH, NKV, HS);
  };
  c.inputs = {testing::randn_tensor({B, T, (NH + 2 * int64_t{NKV}) * HS}, 1)};
  return c;
}

TEST(AttentionGqaCuda, OddSizesMatchCpu) {
  // T = 7, HS = 6: no dimension is a multiple of a GEMM tile or a 16-byte pack. NKV = 4 is the
  // causal_attention path (plain kernels: HS = 6 has no flash kernel), 2 and 1 the grouped ones.
  GTRON_REQUIRE_GPU();
  for (int NKV : {1, 2, 4}) {
    testing::OpCase c = gqa_case(2, 7, 4, NKV, 6);
    testing::expect_cuda_matches_cpu(c, DType::kF32, testing::kF32Tol);
    testing::expect_cuda_matches_cpu(c, DType::kBF16, testing::kBF16Tol);
  }
}

TEST(AttentionGqaCuda, LlamaLikeSizesMatchCpu) {
  // Llama 3's head size and 4 query heads per k/v head, at an odd length.
  GTRON_REQUIRE_GPU();
  testing::OpCase c = gqa_case(2, 53, 8, 2, 128);
  testing::expect_cuda_matches_cpu(c, DType::kF32, testing::kF32Tol);
  testing::expect_cuda_matches_cpu(c, DType::kBF16, testing::kBF16Tol);
}

// RoPE then grouped-query attention (the llama family's order) as causal_attention_gqa_rope:
// on CUDA in bf16 at HS = 64 and 128 the flash kernels with the rotation of dQ and dK fused into
// their stores (Note [RoPE in the flash backward]); on the CPU the composed ops. Positions from
// pos0 = 5, llama3-rewritten frequencies.
testing::OpCase gqa_rope_case(int64_t B, int64_t T, int NH, int NKV, int HS) {
  RopeLlama3Scaling sc;
  sc.original_max_position_embeddings = 64;  // so the rewrite reaches these short lengths
  const std::vector<double> freqs = rope_inv_freq(HS, 500000.0, &sc);
  testing::OpCase c;
  c.f = [=](const std::vector<Var>& in, const std::vector<Var>&) {
    const Tensor table = rope_table(freqs, in[0].device(), in[0].dtype());
    return causal_attention_gqa_rope(in[0], table, NH, NKV, HS, 5);
  };
  c.inputs = {testing::randn_tensor({B, T, (NH + 2 * int64_t{NKV}) * HS}, 3)};
  return c;
}

TEST(AttentionGqaCuda, FlashWithRopeMatchesCpu) {
  GTRON_REQUIRE_GPU();
  for (int HS : {64, 128}) {
    for (int64_t T : {1, 7, 129, 1000}) {
      SCOPED_TRACE("HS " + std::to_string(HS) + " T " + std::to_string(T));
      testing::expect_cuda_matches_cpu(gqa_rope_case(2, T, 8, 2, HS), DType::kBF16,
                                       testing::kBF16Tol);
      testing::expect_cuda_matches_cpu(gqa_rope_case(1, T, 4, 1, HS), DType::kBF16,
                                       testing::kBF16Tol);
    }
  }
  // fp32 and odd head sizes take the composed ops on CUDA too.
  testing::expect_cuda_matches_cpu(gqa_rope_case(2, 9, 4, 2, 6), DType::kF32, testing::kF32Tol);
}

// The fused op against rope then causal_attention_gqa, both on CUDA in bf16: the same forward
// bits (the same rope kernel feeds the same flash kernel) and gradients that differ only by the
// composed path's extra bf16 rounding of the rotated gradient.
TEST(AttentionGqaCuda, FlashWithRopeMatchesTheComposedOps) {
  GTRON_REQUIRE_GPU();
  const int NH = 8, NKV = 2, HS = 64;
  const int64_t B = 2, T = 300;
  const Device dev = Device::cuda(0);
  const Tensor x =
      testing::randn_tensor({B, T, (NH + 2 * int64_t{NKV}) * HS}, 4).to(DType::kBF16).to(dev);
  const Tensor dy = testing::randn_tensor({B, T, NH * int64_t{HS}}, 5).to(DType::kBF16).to(dev);
  const Tensor table = rope_table(rope_inv_freq(HS, 500000.0), dev, DType::kBF16);
  // One tape at a time: a backward runs (and clears) every node recorded so far. The fused op
  // rotates its input in place, so each side gets its own copy.
  Var a = Var::leaf(x.clone()), b = Var::leaf(x.clone());
  Var ya = causal_attention_gqa_rope(a, table, NH, NKV, HS, 0);
  backward_with(ya, dy);
  Var yb = causal_attention_gqa(rope(b, table, NH, NKV, HS, 0), NH, NKV, HS);
  backward_with(yb, dy);
  EXPECT_EQ(ya.value().to_vector(), yb.value().to_vector());
  EXPECT_LT(testing::rel_diff(a.grad().to_vector(), b.grad().to_vector()), 4e-3);
}

// Document masking (Note [document masking] in model/ops/segments.h) through the ops: RoPE from
// pos0 = 0 and grouped-query attention with segment ids, on CUDA (bf16: the flash kernels with
// the fused rotation; fp32: rope, then the reference kernels) against the CPU.
testing::OpCase gqa_rope_segments_case(int64_t B, int64_t T, int NH, int NKV, int HS) {
  std::vector<int32_t> ids;
  for (int64_t b = 0; b < B; ++b) {
    int32_t id = 0;
    for (int64_t t = 0; t < T; ++t) {
      // Documents of 1, 64, 100 and then 37 tokens, the pattern shifted per sequence.
      const int64_t u = t + 19 * b;
      if (t > 0 && (u == 1 || u == 65 || u == 165 || (u > 165 && (u - 165) % 37 == 0))) ++id;
      ids.push_back(id);
    }
  }
  const std::vector<double> freqs = rope_inv_freq(HS, 500000.0);
  testing::OpCase c;
  c.f = [=](const std::vector<Var>& in, const std::vector<Var>&) {
    const Tensor table = rope_table(freqs, in[0].device(), in[0].dtype());
    const Tensor seg = Tensor::from_ints(ids, {B, T}).to(in[0].device());
    return causal_attention_gqa_rope(in[0], table, NH, NKV, HS, 0, false, seg);
  };
  c.inputs = {testing::randn_tensor({B, T, (NH + 2 * int64_t{NKV}) * HS}, 6)};
  return c;
}

TEST(AttentionGqaCuda, DocumentMaskWithRopeMatchesCpu) {
  GTRON_REQUIRE_GPU();
  for (int HS : {64, 128}) {
    for (int64_t T : {7, 129, 1000}) {
      SCOPED_TRACE("HS " + std::to_string(HS) + " T " + std::to_string(T));
      testing::expect_cuda_matches_cpu(gqa_rope_segments_case(2, T, 8, 2, HS), DType::kBF16,
                                       testing::kBF16Tol);
      testing::expect_cuda_matches_cpu(gqa_rope_segments_case(1, T, 4, 1, HS), DType::kBF16,
                                       testing::kBF16Tol);
    }
  }
  testing::expect_cuda_matches_cpu(gqa_rope_segments_case(2, 129, 4, 2, 64), DType::kF32,
                                   testing::kF32Tol);
  testing::expect_cuda_matches_cpu(gqa_rope_segments_case(2, 9, 4, 2, 6), DType::kF32,
                                   testing::kF32Tol);
}

}  // namespace
}  // namespace gtron

// causal_attention_gqa on CUDA against the CPU kernel (GPU test; skipped without a GPU).
#include <gtest/gtest.h>

#include "model/ops/attention.h"
#include "tests/model/cuda_op_check.h"
#include "tests/model/gradcheck.h"

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

}  // namespace
}  // namespace gtron

// rope on CUDA against the CPU kernel (GPU test; skipped without a GPU).
#include <gtest/gtest.h>

#include "model/ops/rope.h"
#include "tests/model/cuda_op_check.h"
#include "tests/model/gradcheck.h"

namespace gtron {
namespace {

testing::OpCase rope_case(int64_t B, int64_t T, int NH, int NKV, int HS, int64_t pos0, double theta,
                          const RopeLlama3Scaling* llama3 = nullptr) {
  const std::vector<double> freqs = rope_inv_freq(HS, theta, llama3);
  testing::OpCase c;
  c.f = [=](const std::vector<Var>& in, const std::vector<Var>&) {
    return rope(in[0], rope_table(freqs, in[0].device(), in[0].dtype()), NH, NKV, HS, pos0);
  };
  c.inputs = {testing::randn_tensor({B, T, (NH + 2 * NKV) * HS}, 1)};
  return c;
}

TEST(RopeCuda, OddSizesMatchCpu) {
  // T = 7, HS = 6, NH = 4 with GQA, MQA and MHA: no width is a multiple of a pack or a warp.
  GTRON_REQUIRE_GPU();
  for (int NKV : {1, 2, 4}) {
    testing::OpCase c = rope_case(2, 7, 4, NKV, 6, 3, 10000.0);
    testing::expect_cuda_matches_cpu(c, DType::kF32, testing::kF32Tol);
    testing::expect_cuda_matches_cpu(c, DType::kBF16, testing::kBF16Tol);
  }
}

TEST(RopeCuda, Llama3FrequenciesAtLatePositionsMatchCpu) {
  // Llama 3's head size and frequencies at positions 4000..4052: large angles, where sincosf's
  // range reduction has to agree with the CPU's. The angle itself is one fp32 product on both
  // sides, the same bits, so the tolerance stays tight.
  GTRON_REQUIRE_GPU();
  RopeLlama3Scaling sc;
  testing::OpCase c = rope_case(1, 53, 8, 2, 128, 4000, 500000.0, &sc);
  testing::expect_cuda_matches_cpu(c, DType::kF32, testing::kF32Tol);
  testing::expect_cuda_matches_cpu(c, DType::kBF16, testing::kBF16Tol);
}

}  // namespace
}  // namespace gtron

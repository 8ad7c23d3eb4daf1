// swiglu on CUDA against the CPU kernel (GPU test; skipped without a GPU).
#include <gtest/gtest.h>

#include "model/ops/swiglu.h"
#include "tests/model/cuda_op_check.h"
#include "tests/model/gradcheck.h"

namespace gtron {
namespace {

TEST(SwiGluCuda, MatchesCpu) {
  GTRON_REQUIRE_GPU();
  for (int64_t F : {5, 67, 64}) {  // odd, then a partial last pack per row, then whole packs
    testing::OpCase c;
    c.f = [](const std::vector<Var>& in, const std::vector<Var>&) { return swiglu(in[0]); };
    c.inputs = {testing::randn_tensor({3, 37, 2 * F}, 1, 2.0)};
    testing::expect_cuda_matches_cpu(c, DType::kF32, testing::kF32Tol);
    testing::expect_cuda_matches_cpu(c, DType::kBF16, testing::kBF16Tol);
  }
}

}  // namespace
}  // namespace gtron

// concat_features on CUDA against the CPU kernel (GPU test; skipped without a GPU).
#include <gtest/gtest.h>

#include "model/ops/concat.h"
#include "tests/model/cuda_op_check.h"
#include "tests/model/gradcheck.h"

namespace gtron {
namespace {

testing::OpCase concat_case(int64_t Ca, int64_t Cb) {
  testing::OpCase c;
  c.f = [](const std::vector<Var>& in, const std::vector<Var>&) {
    return concat_features(in[0], in[1]);
  };
  c.inputs = {testing::randn_tensor({37, Ca}, 1), testing::randn_tensor({37, Cb}, 2)};
  return c;
}

TEST(ConcatCuda, MatchesCpu) {
  GTRON_REQUIRE_GPU();
  for (auto [Ca, Cb] : {std::pair<int64_t, int64_t>{67, 29}, {64, 32}}) {
    // f32 is copies and adds: bit-identical to the CPU.
    testing::expect_cuda_matches_cpu(concat_case(Ca, Cb), DType::kF32, testing::kF32Tol,
                                     /*exact=*/true);
    testing::expect_cuda_matches_cpu(concat_case(Ca, Cb), DType::kBF16, testing::kBF16Tol);
  }
}

TEST(ConcatCuda, OnlyOneSideWantsAGradient) {
  GTRON_REQUIRE_GPU();
  testing::OpCase c = concat_case(67, 29);
  c.f = [](const std::vector<Var>& in, const std::vector<Var>&) {
    return concat_features(Var::constant(in[0].value()), in[1]);
  };
  testing::expect_cuda_matches_cpu(c, DType::kF32, testing::kF32Tol, /*exact=*/true);
}

}  // namespace
}  // namespace gtron

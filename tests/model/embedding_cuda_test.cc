// embedding and add_positions on CUDA against the CPU kernels (GPU test; skipped without a GPU).
#include <gtest/gtest.h>

#include "model/ops/embedding.h"
#include "tests/model/cuda_op_check.h"
#include "tests/model/gradcheck.h"

namespace gtron {
namespace {

using testing::OpCase;
using testing::ParamDtype;

// [3, 13] tokens over V = 97 with many repeats (ids drawn from 0..19 and a few large ones), so
// the scatter-add sums several rows into one table row.
Tensor repeated_tokens() {
  std::vector<int32_t> ids;
  for (int i = 0; i < 39; ++i) ids.push_back(i % 7 == 0 ? 96 - i : (i * 13) % 20);
  return Tensor::from_ints(ids, {3, 13});
}

// `on_device`: hand the op tokens already on the GPU instead of host tokens.
OpCase embedding_case(int64_t C, bool on_device) {
  const Tensor tokens = repeated_tokens();
  OpCase c;
  c.f = [tokens, on_device](const std::vector<Var>&, const std::vector<Var>& p) {
    const bool gpu = p[0].device().is_cuda() && on_device;
    return embedding(gpu ? tokens.to(p[0].device()) : tokens, p[0]);
  };
  c.params = {testing::randn_tensor({97, C}, 1)};
  return c;
}

TEST(EmbeddingCuda, MatchesCpuBitForBit) {
  // Gather is a copy, and the scatter-add keeps the CPU's row order (a stable sort), so even the
  // fp32 table gradient is bit-identical; with bf16 the dy rows are exact in fp32 as well.
  GTRON_REQUIRE_GPU();
  for (int64_t C : {67, 64}) {
    for (bool on_device : {false, true}) {
      OpCase c = embedding_case(C, on_device);
      testing::expect_cuda_matches_cpu(c, DType::kF32, testing::kF32Tol, /*exact=*/true);
      testing::expect_cuda_matches_cpu(c, DType::kBF16, testing::kBF16Tol, /*exact=*/true);
    }
  }
}

OpCase positions_case(int64_t C, ParamDtype wpe_dtype) {
  OpCase c;
  c.f = [](const std::vector<Var>& in, const std::vector<Var>& p) {
    return add_positions(in[0], p[0]);
  };
  c.inputs = {testing::randn_tensor({3, 13, C}, 2)};
  c.params = {testing::randn_tensor({16, C}, 3)};  // Tmax = 16 > T = 13
  c.param_dtypes = {wpe_dtype};
  return c;
}

TEST(AddPositionsCuda, MatchesCpu) {
  GTRON_REQUIRE_GPU();
  for (int64_t C : {67, 64}) {
    // f32: a plain add, and dwpe sums b = 0..B-1 in the CPU's order: bit-identical.
    testing::expect_cuda_matches_cpu(positions_case(C, ParamDtype::kAct), DType::kF32,
                                     testing::kF32Tol, /*exact=*/true);
    testing::expect_cuda_matches_cpu(positions_case(C, ParamDtype::kAct), DType::kBF16,
                                     testing::kBF16Tol);
    testing::expect_cuda_matches_cpu(positions_case(C, ParamDtype::kF32), DType::kBF16,
                                     testing::kBF16Tol);
  }
}

}  // namespace
}  // namespace gtron

// Tensor fills on CUDA (GPU test; skipped without a GPU): zero_all over more ranges than one
// launch takes, of odd lengths and 4-byte (not 16-byte) aligned starts, leaving the gaps alone.
#include <gtest/gtest.h>

#include <vector>

#include "model/stream.h"
#include "model/tensor.h"
#include "tests/model/cuda_op_check.h"

namespace gtron {
namespace {

TEST(TensorCuda, ZeroAllZeroesEveryRangeAndNothingElse) {
  GTRON_REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  // Ranges i of length 1 + 37·i at odd offsets with a one-element gap after each: 40 ranges, more
  // than one launch's cuda::kZeroRangesPerLaunch.
  constexpr int kRanges = 40;
  std::vector<int64_t> begin, end;
  int64_t n = 3;
  for (int i = 0; i < kRanges; ++i) {
    begin.push_back(n);
    n += 1 + 37 * i;
    end.push_back(n);
    n += 1;
  }
  std::vector<double> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) values[static_cast<size_t>(i)] = 1.0 + static_cast<double>(i);
  Tensor flat = Tensor::from_vector(values, {n}, DType::kF32).to(gpu);
  std::vector<Tensor> ranges;
  for (int i = 0; i < kRanges; ++i) ranges.push_back(flat.rows(begin[i], end[i]));
  zero_all(ranges);
  std::vector<double> want = values;
  for (int i = 0; i < kRanges; ++i) {
    for (int64_t j = begin[i]; j < end[i]; ++j) want[static_cast<size_t>(j)] = 0.0;
  }
  EXPECT_EQ(flat.to_vector(), want);
}

}  // namespace
}  // namespace gtron

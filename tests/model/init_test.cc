// Tests of model/init.h: a parameter's normal values are a function of (seed, name, index) alone,
// so the threaded fill of large tensors writes the same bits as one thread, and a short tensor
// under the same name holds the long one's first values.
#include "model/init.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "tests/model/op_check.h"

namespace gtron {
namespace {

constexpr int64_t kLarge = (int64_t{1} << 20) + 3;  // above the threaded fill's threshold, odd

Tensor filled(DType dtype, int64_t n, int threads, const std::string& name = "blocks.0.w") {
  Tensor t = Tensor::empty({n}, dtype, Device::cpu());
  testing::with_threads(threads, [&] { init_normal(t, 0.02, 1337, name); });
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw(), b.raw(), static_cast<size_t>(a.numel()) * dtype_size(a.dtype())) == 0;
}

TEST(InitTest, ThreadedFillEqualsOneThreadBitForBit) {
  for (DType dtype : {DType::kF32, DType::kF64}) {
    const Tensor one = filled(dtype, kLarge, 1);
    const Tensor three = filled(dtype, kLarge, 3);  // chunks that do not divide the pairs evenly
    EXPECT_TRUE(same_bytes(one, three)) << dtype_name(dtype);
  }
}

TEST(InitTest, ShortTensorHoldsTheLongOnesFirstValues) {
  const Tensor long_t = filled(DType::kF32, kLarge, 4);
  const Tensor short_t = filled(DType::kF32, 1001, 4);  // serial path, odd length
  for (int64_t i = 0; i < short_t.numel(); ++i) {
    ASSERT_EQ(short_t.data<float>()[i], long_t.data<float>()[i]) << "index " << i;
  }
  // Another name is another stream.
  const Tensor other = filled(DType::kF32, 1001, 1, "blocks.1.w");
  EXPECT_NE(other.data<float>()[0], short_t.data<float>()[0]);
}

TEST(InitTest, ThreadedValuesHaveTheRequestedSpread) {
  const Tensor t = filled(DType::kF64, kLarge, 4);
  double sum = 0, sq = 0;
  for (int64_t i = 0; i < t.numel(); ++i) {
    sum += t.data<double>()[i];
    sq += t.data<double>()[i] * t.data<double>()[i];
  }
  const double n = static_cast<double>(t.numel());
  EXPECT_NEAR(sum / n, 0.0, 1e-4);  // 5 standard errors of the mean
  EXPECT_NEAR(std::sqrt(sq / n - (sum / n) * (sum / n)), 0.02, 1e-4);  // 0.5 %
}

}  // namespace
}  // namespace gtron

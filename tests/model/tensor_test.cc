// Tests of model/tensor.h and the host bf16 conversion of model/dtype.h: shapes, views sharing
// storage, clones, dtype conversions, checks on misuse, and storage lifetime in the allocator.
#include "model/tensor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "model/stream.h"

namespace gtron {
namespace {

std::vector<double> iota(int n, double start = 0) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<size_t>(i)] = start + i;
  return v;
}

uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(Shape, RankNumelEqualityAndString) {
  Shape s{2, 3, 4};
  EXPECT_EQ(s.rank(), 3);
  EXPECT_EQ(s.numel(), 24);
  EXPECT_EQ(s[1], 3);
  EXPECT_EQ(s.str(), "[2, 3, 4]");
  EXPECT_EQ(s.vec(), (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(s, Shape(std::vector<int64_t>{2, 3, 4}));
  EXPECT_NE(s, (Shape{2, 12}));
  EXPECT_NE(s, (Shape{2, 3, 5}));
  EXPECT_EQ(Shape().rank(), 0);
  EXPECT_EQ(Shape().numel(), 1);  // a scalar
  EXPECT_EQ(Shape().str(), "[]");
  EXPECT_EQ((Shape{5, 0, 2}).numel(), 0);
}

TEST(ShapeDeathTest, RankAboveFourAndNegativeDimsAreCheckFailures) {
  EXPECT_DEATH(Shape({1, 2, 3, 4, 5}), "rank 5 > 4");
  EXPECT_DEATH(Shape({2, -1}), "negative dimension");
}

TEST(Tensor, EmptyHasShapeDtypeAndSize) {
  Tensor t = Tensor::empty({3, 5}, DType::kBF16);
  EXPECT_TRUE(t.defined());
  EXPECT_EQ(t.shape(), (Shape{3, 5}));
  EXPECT_EQ(t.rank(), 2);
  EXPECT_EQ(t.dim(0), 3);
  EXPECT_EQ(t.dim(-1), 5);
  EXPECT_EQ(t.numel(), 15);
  EXPECT_EQ(t.nbytes(), 30u);
  EXPECT_EQ(t.dtype(), DType::kBF16);
  EXPECT_TRUE(t.device().is_cpu());
  EXPECT_FALSE(Tensor().defined());
}

TEST(Tensor, ZerosAreZeroEvenOverReusedMemory) {
  Tensor dirty = Tensor::from_vector(std::vector<double>(64, 7.0), {64}, DType::kF32);
  dirty = Tensor();  // its block goes back to the cache, still holding sevens
  Tensor z = Tensor::zeros({8, 8}, DType::kF32);
  EXPECT_EQ(z.to_vector(), std::vector<double>(64, 0.0));
}

TEST(Tensor, RowsViewSharesStorageAtTheRightOffset) {
  Tensor base = Tensor::from_vector(iota(12), {4, 3}, DType::kF32);
  Tensor r = base.rows(1, 3);
  EXPECT_EQ(r.shape(), (Shape{2, 3}));
  EXPECT_TRUE(r.shares_storage(base));
  EXPECT_EQ(r.to_vector(), iota(6, 3));
  EXPECT_EQ(r.raw(), static_cast<void*>(base.data<float>() + 3));
  // Write through the view, read through the base.
  r.data<float>()[0] = 100;
  r.data<float>()[5] = 200;
  std::vector<double> want = iota(12);
  want[3] = 100;
  want[8] = 200;
  EXPECT_EQ(base.to_vector(), want);
  // A view of a view adds the offsets.
  Tensor rr = r.rows(1, 2);
  rr.data<float>()[2] = -1;
  EXPECT_EQ(base.data<float>()[8], -1);
  // Empty ranges are valid views.
  EXPECT_EQ(base.rows(4, 4).numel(), 0);
  EXPECT_EQ(base.rows(0, 4).to_vector(), base.to_vector());
}

TEST(Tensor, RowsOfHigherRankStepByWholeSubTensors) {
  Tensor base = Tensor::from_vector(iota(24), {3, 2, 4}, DType::kF64);
  Tensor r = base.rows(2, 3);
  EXPECT_EQ(r.shape(), (Shape{1, 2, 4}));
  EXPECT_EQ(r.to_vector(), iota(8, 16));
  r.data<double>()[7] = 0.5;
  EXPECT_EQ(base.data<double>()[23], 0.5);
}

TEST(TensorDeathTest, RowsOutOfRangeIsACheckFailure) {
  Tensor base = Tensor::zeros({4, 3}, DType::kF32);
  EXPECT_DEATH(base.rows(2, 5), "rows\\(2, 5\\) of \\[4, 3\\]");
  EXPECT_DEATH(base.rows(3, 2), "rows\\(3, 2\\)");
  EXPECT_DEATH(base.rows(-1, 2), "rows\\(-1, 2\\)");
}

TEST(Tensor, ViewReshapesTheSameElements) {
  Tensor base = Tensor::from_vector(iota(12), {4, 3}, DType::kF32);
  Tensor v = base.view({2, 2, 3});
  EXPECT_EQ(v.shape(), (Shape{2, 2, 3}));
  EXPECT_TRUE(v.shares_storage(base));
  EXPECT_EQ(v.to_vector(), iota(12));
  v.data<float>()[11] = 42;
  EXPECT_EQ(base.data<float>()[11], 42);
  // A view of a rows view keeps the view's offset.
  Tensor rv = base.rows(2, 4).view({6});
  EXPECT_EQ(rv.to_vector(), (std::vector<double>{6, 7, 8, 9, 10, 42}));
}

TEST(TensorDeathTest, ViewWithAnotherNumelIsACheckFailure) {
  Tensor base = Tensor::zeros({4, 3}, DType::kF32);
  EXPECT_DEATH(base.view({5, 3}), "view \\[5, 3\\] of \\[4, 3\\]");
}

TEST(Tensor, CloneIsIndependent) {
  Tensor base = Tensor::from_vector(iota(6), {2, 3}, DType::kF32);
  Tensor c = base.clone();
  EXPECT_FALSE(c.shares_storage(base));
  EXPECT_EQ(c.shape(), base.shape());
  EXPECT_EQ(c.to_vector(), base.to_vector());
  c.data<float>()[0] = 9;
  base.data<float>()[1] = -9;
  EXPECT_EQ(base.to_vector(), (std::vector<double>{0, -9, 2, 3, 4, 5}));
  EXPECT_EQ(c.to_vector(), (std::vector<double>{9, 1, 2, 3, 4, 5}));
  // A clone of a view holds only the view's elements, from offset 0 of its own storage.
  Tensor cv = base.rows(1, 2).clone();
  EXPECT_EQ(cv.to_vector(), (std::vector<double>{3, 4, 5}));
  EXPECT_EQ(cv.data<float>()[0], 3);
}

TEST(Tensor, CopyFromAndItem) {
  Tensor dst = Tensor::zeros({2, 2}, DType::kF64);
  Tensor src = Tensor::from_vector({1.5, -2, 3, 4}, {4}, DType::kF64);
  dst.copy_from(src);  // same numel, any shape
  EXPECT_EQ(dst.to_vector(), (std::vector<double>{1.5, -2, 3, 4}));
  EXPECT_EQ(dst.rows(1, 2).view({2}).rows(0, 1).item(), 3);
}

TEST(Tensor, FromVectorToVectorForEachDtype) {
  const std::vector<double> v = {0.1, -2.5, 3.0, 1e-3};
  EXPECT_EQ(Tensor::from_vector(v, {4}, DType::kF64).to_vector(), v);  // exact
  std::vector<double> f32 = Tensor::from_vector(v, {4}, DType::kF32).to_vector();
  for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(f32[i], static_cast<double>(float(v[i])));
  // bf16 keeps 8 significant bits: 0.1 -> 0.10009765625, 1e-3 -> 0.00099945068359375.
  EXPECT_EQ(Tensor::from_vector(v, {2, 2}, DType::kBF16).to_vector(),
            (std::vector<double>{0.10009765625, -2.5, 3.0, 0.00099945068359375}));
  // i32 truncates toward zero like a C++ cast.
  EXPECT_EQ(Tensor::from_vector({7, -3, 2.9, -2.9}, {4}, DType::kI32).to_vector(),
            (std::vector<double>{7, -3, 2, -2}));
  Tensor ids = Tensor::from_ints({5, -1, 2147483647}, {3});
  EXPECT_EQ(ids.dtype(), DType::kI32);
  EXPECT_EQ(ids.data<int32_t>()[2], 2147483647);
  EXPECT_EQ(ids.to_vector(), (std::vector<double>{5, -1, 2147483647}));
}

TEST(Tensor, DtypeConversionRoundTrips) {
  Tensor f = Tensor::from_vector({1, 0.1, -300.75}, {3}, DType::kF32);
  Tensor b = f.to(DType::kBF16);
  EXPECT_EQ(b.dtype(), DType::kBF16);
  // bf16's ulp is 2 in [256, 512): -300.75 rounds to -300.
  EXPECT_EQ(b.to_vector(), (std::vector<double>{1, 0.10009765625, -300}));
  Tensor back = b.to(DType::kF32);
  EXPECT_EQ(back.dtype(), DType::kF32);
  EXPECT_EQ(back.to_vector(), b.to_vector());
  Tensor same = f.to(DType::kF32);  // a copy, not a view
  EXPECT_FALSE(same.shares_storage(f));
  EXPECT_EQ(same.to_vector(), f.to_vector());
}

TEST(BF16, RoundsToNearestEvenOnKnownBitPatterns) {
  struct Case {
    uint32_t f32;
    uint16_t bf16;
  };
  const Case cases[] = {
      {0x3f800000u, 0x3f80},  // 1.0: exact
      {0x3f807fffu, 0x3f80},  // just below half an ulp: down
      {0x3f808000u, 0x3f80},  // exactly half, even (..0) below: stays even
      {0x3f808001u, 0x3f81},  // just above half: up
      {0x3f818000u, 0x3f82},  // exactly half, odd (..1) below: up to even
      {0xbf818000u, 0xbf82},  // the same for a negative value
      {0x3f81ffffu, 0x3f82},  // carry into the next ulp
      {0x3fffffffu, 0x4000},  // carry into the exponent
      {0x00000001u, 0x0000},  // smallest subnormal rounds to +0
      {0x80000000u, 0x8000},  // -0 keeps its sign
      {0x7f800000u, 0x7f80},  // +inf
      {0xff800000u, 0xff80},  // -inf
      {0x7f7fffffu, 0x7f80},  // FLT_MAX rounds to +inf (as IEEE round-to-nearest-even does)
  };
  for (const Case& c : cases) {
    EXPECT_EQ(float_to_bf16(bits_float(c.f32)).bits, c.bf16) << std::hex << c.f32;
  }
  // bf16 -> f32 is exact: the bits move up.
  EXPECT_EQ(float_bits(bf16_to_float(BF16{0x3f82})), 0x3f820000u);
  EXPECT_EQ(bf16_to_float(BF16{0xc040}), -3.0f);
}

TEST(BF16, NanStaysNan) {
  // Payloads only in the low 16 bits would round to inf (or carry into the sign) without the NaN
  // check.
  for (uint32_t bits : {0x7fc00000u, 0x7f800001u, 0x7f80ffffu, 0xff800001u, 0x7fffffffu}) {
    BF16 b = float_to_bf16(bits_float(bits));
    EXPECT_TRUE(std::isnan(bf16_to_float(b))) << std::hex << bits << " -> " << b.bits;
  }
  Tensor t = Tensor::from_vector({std::numeric_limits<double>::quiet_NaN()}, {1}, DType::kBF16);
  EXPECT_TRUE(std::isnan(t.item()));
}

TEST(TensorDeathTest, DataOfTheWrongDtypeIsACheckFailure) {
  Tensor t = Tensor::zeros({2}, DType::kF32);
  EXPECT_DEATH(t.data<double>(), "data<f64>\\(\\) on a f32 tensor");
  EXPECT_DEATH(t.data<BF16>(), "data<bf16>\\(\\) on a f32 tensor");
  Tensor ids = Tensor::from_ints({1}, {1});
  EXPECT_DEATH(ids.data<float>(), "data<f32>\\(\\) on a i32 tensor");
  Tensor undefined;
  EXPECT_DEATH(undefined.data<float>(), "raw\\(\\) of an undefined tensor");
}

TEST(Tensor, StorageGoesBackToTheAllocatorWhenTheLastViewDies) {
  memory::CachingAllocator& alloc = allocator_for(Device::cpu());
  const size_t before = alloc.stats().allocated;
  Tensor t = Tensor::empty({1000}, DType::kF32);  // 4000 bytes, rounded to 4096
  EXPECT_EQ(alloc.stats().allocated, before + 4096);
  Tensor row = t.view({10, 100}).rows(3, 4);
  Tensor copy = t;
  t = Tensor();
  copy = Tensor();
  EXPECT_EQ(alloc.stats().allocated, before + 4096);  // `row` still holds the storage
  row = Tensor();
  EXPECT_EQ(alloc.stats().allocated, before);
}

TEST(Tensor, StorageIsCachedPerStream) {
  memory::CachingAllocator& alloc = allocator_for(Device::cpu());
  Stream s(Device::cpu());
  void* first = Tensor::empty({333}, DType::kF32, Device::cpu(), &s).raw();
  uint64_t misses = alloc.stats().misses;
  // The block freed on `s` comes back for the same request on `s`, without a miss.
  Tensor again = Tensor::empty({333}, DType::kF32, Device::cpu(), &s);
  EXPECT_EQ(again.raw(), first);
  EXPECT_EQ(alloc.stats().misses, misses);
  // Freed on `s`, it is not reused by the default stream.
  again = Tensor();
  Tensor other = Tensor::empty({333}, DType::kF32);
  EXPECT_NE(other.raw(), first);
}

TEST(Tensor, ZeroAllZeroesEveryTensorAndNothingElse) {
  Tensor flat = Tensor::from_vector(iota(10, 1), {10}, DType::kF32);
  // Two views of one buffer with a gap between them, and a tensor of its own.
  Tensor a = flat.rows(0, 3);
  Tensor b = flat.rows(5, 9);
  Tensor c = Tensor::from_vector(iota(4, 1), {2, 2}, DType::kF32);
  Tensor empty = Tensor::empty({0}, DType::kF32, Device::cpu());
  zero_all({a, empty, b, c});
  current_stream(Device::cpu()).synchronize();
  EXPECT_EQ(flat.to_vector(), (std::vector<double>{0, 0, 0, 4, 5, 0, 0, 0, 0, 10}));
  EXPECT_EQ(c.to_vector(), std::vector<double>(4, 0.0));
  zero_all({});  // nothing to do
}

}  // namespace
}  // namespace gtron

// Packed masters (Note [packed masters] in model/mixed_precision.h) on the device: Bf16Weights
// packs a parameter in place at its first use and unpacks it to the same fp32 bits; AdamW's
// packed update (vector and scalar paths) leaves the same master bits as the fp32 update, with
// the shadow model/packed_master.h defines. Training with packed masters: optim_cuda_test. GPU
// test: skipped without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "model/device.h"
#include "model/mixed_precision.h"
#include "model/packed_master.h"
#include "model/stream.h"
#include "parallel/ddp.h"
#include "trainer/optimizer.h"
#include "trainer/optimizer_cuda.h"

namespace gtron {
namespace {

#define REQUIRE_GPU()                                   \
  if (cuda_device_count() == 0) {                       \
    GTEST_SKIP() << "no CUDA device: GPU test skipped"; \
  }

float as_float(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

bool is_nan_word(uint32_t b) { return (b & 0x7F800000u) == 0x7F800000u && (b & 0x7FFFFFu) != 0; }

// n words: random normals, every 7th a tie (lo = 0x8000, both parities), and the special words.
std::vector<uint32_t> words(int64_t n, uint64_t seed) {
  std::vector<uint32_t> w(static_cast<size_t>(n));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < n; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const float x = static_cast<float>(static_cast<double>(s >> 11) / 9007199254740992.0 - 0.5);
    uint32_t b = bits_of(x);
    if (i % 7 == 3) b = (b & 0xFFFF0000u) | 0x8000u;
    w[static_cast<size_t>(i)] = b;
  }
  const uint32_t special[] = {0x7F800000u, 0xFF800000u, 0x7F7FFFFFu, 0xFF7FFFFFu, 0x7FC00000u,
                              0x7FFFFFFFu, 0x00000001u, 0x80008000u, 0x00000000u, 0x80000000u};
  for (size_t k = 0; k < sizeof special / sizeof special[0] && k * 5 < w.size(); ++k) {
    w[k * 5] = special[k];
  }
  return w;
}

Tensor device_words(const std::vector<uint32_t>& w, const Shape& shape, Device dev) {
  std::vector<double> v(w.size());
  for (size_t i = 0; i < w.size(); ++i) v[i] = static_cast<double>(as_float(w[i]));
  return Tensor::from_vector(v, shape, DType::kF32).to(dev);
}

template <typename T>
std::vector<T> host(const void* dev_ptr, int64_t n, Device dev) {
  current_stream(dev).synchronize();
  static_assert(sizeof(T) == 2 || sizeof(T) == 4, "16- or 32-bit words");
  const DType as = sizeof(T) == 2 ? DType::kBF16 : DType::kI32;  // the bits, whatever they mean
  Tensor t = Tensor::from_blob(const_cast<void*>(dev_ptr), {n}, as, dev).to(Device::cpu());
  std::vector<T> out(static_cast<size_t>(n));
  std::memcpy(out.data(), t.raw(), out.size() * sizeof(T));
  return out;
}

void expect_words(const std::vector<uint32_t>& got, const std::vector<uint32_t>& want,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    bad += is_nan_word(want[i]) ? !is_nan_word(got[i]) : got[i] != want[i];
  }
  EXPECT_EQ(bad, 0) << what << ": words that differ";
}

TEST(PackedMastersCuda, PackInPlaceAndUnpackToTheSameBits) {
  REQUIRE_GPU();
  const Device dev = Device::cuda(0);
  NoGradGuard no_grad;
  const int64_t R = 48, K = 40;
  Parameter p("p", device_words(words(R * K, 1), {R, K}, dev));
  // The words as the device holds them (the host's conversions may have changed a NaN's payload).
  const std::vector<uint32_t> w0 = host<uint32_t>(p.data.raw(), R * K, dev);
  Parameter odd("odd", device_words(words(12, 2), {12}, dev));  // 12 % 8 != 0: a plain shadow
  Parameter fp32("fp32", device_words(words(64, 3), {64}, dev));
  Bf16Weights shadows;
  shadows.set_packable([](const Parameter&) { return true; });
  shadows.use_master(fp32);  // read as fp32: never packed
  Var v = shadows.use(p);
  shadows.use(odd);
  shadows.use(fp32);
  EXPECT_TRUE(p.packed_master);
  EXPECT_FALSE(odd.packed_master);
  EXPECT_FALSE(fp32.packed_master);
  EXPECT_EQ(shadows.packed_parameters(), 1);
  EXPECT_EQ(shadows.packed_bytes(), R * K * 2);
  EXPECT_EQ(shadows.shadow_bytes(), (12 + 64) * 2) << "a packed shadow holds no bytes of its own";
  EXPECT_EQ(shadows.casts(), 2) << "odd and fp32 are cast; p is packed";
  EXPECT_EQ(v.value().raw(), p.data.raw()) << "the shadow is p.data's first half";
  EXPECT_EQ(v.value().dtype(), DType::kBF16);

  const std::vector<uint16_t> hi = host<uint16_t>(p.data.raw(), R * K, dev);
  const std::vector<uint16_t> lo = host<uint16_t>(shadows.packed_low(p), R * K, dev);
  int64_t bad = 0;
  for (size_t i = 0; i < w0.size(); ++i) {
    bad += hi[i] != packed::high_of(w0[i]) || lo[i] != packed::low_of(w0[i]);
  }
  EXPECT_EQ(bad, 0) << "halves that differ from model/packed_master.h's";
  EXPECT_EQ(shadows.packed_low(odd), nullptr);

  {
    UnpackedMasters fp32_values(&shadows);
    EXPECT_FALSE(p.packed_master);
    expect_words(host<uint32_t>(p.data.raw(), R * K, dev), w0, "inside UnpackedMasters");
  }
  EXPECT_TRUE(p.packed_master) << "packed again at the scope's end";
  EXPECT_EQ(host<uint16_t>(p.data.raw(), R * K, dev), hi);
  shadows.unpack_masters();
  expect_words(host<uint32_t>(p.data.raw(), R * K, dev), w0, "after unpack_masters");
  shadows.use(p);  // the next use packs again
  EXPECT_TRUE(p.packed_master);
  EXPECT_EQ(host<uint16_t>(p.data.raw(), R * K, dev), hi);
}

parallel::OwnedSegment segment(Parameter& p, int64_t state_offset) {
  parallel::OwnedSegment s;
  s.param = &p;
  s.w = p.data.data<float>();
  s.g = p.main_grad.data<float>();
  s.n = p.data.numel();
  s.state_offset = state_offset;
  return s;
}

std::vector<double> grads(int64_t n, uint64_t seed) {
  std::vector<double> v(static_cast<size_t>(n));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 7;
  for (double& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = 0.2 * (static_cast<double>(s >> 11) / 9007199254740992.0 - 0.5);
  }
  return v;
}

// a: fp32 master with a fused shadow; b: packed, every pointer aligned (vector path); c: packed,
// its moments one float off (scalar path). Three steps with the same gradients.
TEST(PackedMastersCuda, AdamWLeavesTheMasterBitsOfTheFp32Update) {
  REQUIRE_GPU();
  const Device dev = Device::cuda(0);
  NoGradGuard no_grad;
  const int64_t n = 2 * cuda::kOptimChunk + 40;
  std::vector<uint32_t> w0 = words(n, 4);
  for (uint32_t& b : w0) {  // finite starting values: the update of inf or NaN is not the point
    if ((b & 0x7F800000u) == 0x7F800000u) b = 0x3F000000u;
  }
  Parameter a("a", device_words(w0, {n}, dev));
  Parameter b("b", device_words(w0, {n}, dev));
  Parameter c("c", device_words(w0, {n}, dev));
  Bf16Weights shadows;
  shadows.set_packable([](const Parameter& p) { return p.name != "a"; });
  shadows.use(a);
  shadows.use(b);
  shadows.use(c);
  ASSERT_TRUE(b.packed_master && c.packed_master && !a.packed_master);
  const std::vector<parallel::OwnedSegment> segs = {segment(a, 0), segment(b, n),
                                                    segment(c, 2 * n + 1)};
  AdamW opt(3 * n + 1, {&a, &b, &c}, AdamWHyper{}, dev);
  opt.set_bf16_shadows([&](Parameter& p) { return shadows.shadow_for_optimizer(p); },
                       [&](Parameter& p) { return shadows.packed_low(p); });
  for (int step = 0; step < 3; ++step) {
    const Tensor g = Tensor::from_vector(grads(n, static_cast<uint64_t>(step)), {n}, DType::kF32);
    a.main_grad.copy_from(g);
    b.main_grad.copy_from(g);
    c.main_grad.copy_from(g);
    opt.clip_on_device(segs, 0.0, nullptr);
    opt.step_on_device(segs, 1e-2);
    shadows.refresh_after_step();
  }
  const std::vector<uint32_t> wa = host<uint32_t>(a.data.raw(), n, dev);
  const std::vector<uint16_t> sa = host<uint16_t>(shadows.use(a).value().raw(), n, dev);
  EXPECT_EQ(shadows.casts(), 1) << "every shadow written by AdamW";
  for (Parameter* p : {&b, &c}) {
    const std::vector<uint16_t> hi = host<uint16_t>(p->data.raw(), n, dev);
    int64_t bad = 0, ties = 0;
    for (int64_t i = 0; i < n; ++i) {
      bad += hi[static_cast<size_t>(i)] != packed::high_of(wa[static_cast<size_t>(i)]);
      ties += hi[static_cast<size_t>(i)] != sa[static_cast<size_t>(i)];
    }
    EXPECT_EQ(bad, 0) << p->name << ": shadow elements that are not high_of(a's master)";
    EXPECT_LT(ties, n / 1000) << p->name << ": shadows differ from the cast at ties only";
  }
  shadows.unpack_masters();
  expect_words(host<uint32_t>(b.data.raw(), n, dev), wa, "b (vector path) against a");
  expect_words(host<uint32_t>(c.data.raw(), n, dev), wa, "c (scalar path) against a");
}

}  // namespace
}  // namespace gtron

// The fast optimizer kernels (Note [fast optimizer kernels] in trainer/optimizer_cuda.cu) against
// the kernels before them, bit for bit: every AdamW variant over three steps (w, m, v and the
// bf16 shadows, including what no chunk covers), and every Σ g² variant's per-chunk partials, on
// chunks of odd sizes, with 16-byte-aligned and unaligned pointers, with and without shadows
// (aligned and not) and weight decay. GPU test: skipped without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "model/cuda/runtime.h"
#include "model/device.h"
#include "model/stream.h"
#include "model/tensor.h"
#include "trainer/optimizer_cuda.h"

namespace gtron {
namespace {

#define REQUIRE_GPU()                                   \
  if (cuda_device_count() == 0) {                       \
    GTEST_SKIP() << "no CUDA device: GPU test skipped"; \
  }

// Sizes around the float4 width, the block width (256 threads) and the chunk size. With the 9
// layouts below, 153 chunks: the variants that take 4 or 8 chunks a block have a short last one.
const int32_t kSizes[] = {1,
                          2,
                          3,
                          4,
                          5,
                          255,
                          256,
                          257,
                          1023,
                          1024,
                          1027,
                          4099,
                          5000,
                          8192,
                          12289,
                          16383,
                          cuda::kOptimChunk};

// Where one chunk's operands start, in elements past a 64-element boundary of its region: 0 keeps
// 16-byte alignment (the float4 path); any other offset of w, g, m or v, or a shadow offset that
// is not a multiple of 4, takes the scalar path. shadow < 0: no shadow.
struct Layout {
  int w, g, m, v, shadow;
  bool decay;
};
const Layout kLayouts[] = {
    {0, 0, 0, 0, 0, true}, {0, 0, 0, 0, -1, false}, {0, 0, 0, 0, 4, false},
    {1, 0, 0, 0, 1, true}, {0, 0, 3, 0, -1, true},  {0, 2, 0, 0, 0, false},
    {0, 0, 0, 0, 2, true}, {0, 0, 0, 1, 0, true},   {0, 0, 0, 0, 8, false},
};

uint64_t next(uint64_t& s) {
  s = s * 6364136223846793005ull + 1442695040888963407ull;
  return s >> 11;
}

// A value in [-scale, scale) with a spread of magnitudes (so a changed summation order shows),
// and every 97th one exactly zero.
float draw(uint64_t& s, float scale) {
  const uint64_t r = next(s);
  if (r % 97 == 0) return 0.f;
  const float unit = static_cast<float>(r % 1000003) / 500001.5f - 1.f;
  return scale * unit * static_cast<float>(1 << (r % 7)) / 64.f;
}

// Device arenas holding every chunk's operands (with gaps), and the chunk table over them.
struct Arena {
  int64_t floats = 0;
  std::vector<float> w, g, m, v;
  std::vector<uint16_t> shadow;  // 0x7fc1 where no update may write
  std::vector<cuda::OptimChunk> chunks;
  Tensor dw, dg, dm, dv, dshadow, table;
};

Arena make_arena() {
  Arena a;
  std::vector<int64_t> at;
  for (size_t l = 0; l < std::size(kLayouts); ++l) {
    for (int32_t n : kSizes) {
      at.push_back(a.floats);
      a.floats += (n + 127) / 64 * 64;  // room for the offsets, then a gap
    }
  }
  const Device dev = Device::cuda(0);
  a.dw = Tensor::zeros({a.floats}, DType::kF32, dev);
  a.dg = Tensor::zeros({a.floats}, DType::kF32, dev);
  a.dm = Tensor::zeros({a.floats}, DType::kF32, dev);
  a.dv = Tensor::zeros({a.floats}, DType::kF32, dev);
  a.dshadow = Tensor::zeros({a.floats}, DType::kBF16, dev);
  size_t k = 0;
  for (const Layout& l : kLayouts) {
    for (int32_t n : kSizes) {
      const int64_t base = at[k++];
      cuda::OptimChunk c;
      c.w = a.dw.data<float>() + base + l.w;
      c.g = a.dg.data<float>() + base + l.g;
      c.m = a.dm.data<float>() + base + l.m;
      c.v = a.dv.data<float>() + base + l.v;
      if (l.shadow >= 0) c.w_bf16 = static_cast<uint16_t*>(a.dshadow.raw()) + base + l.shadow;
      c.n = n;
      c.decay = l.decay ? 1 : 0;
      a.chunks.push_back(c);
    }
  }
  uint64_t s = 2024;
  for (int64_t i = 0; i < a.floats; ++i) {
    a.w.push_back(draw(s, 2.f));
    a.g.push_back(draw(s, 0.5f));
    a.m.push_back(draw(s, 0.01f));
    const float v = draw(s, 1e-3f);
    a.v.push_back(v * v);
  }
  a.shadow.assign(static_cast<size_t>(a.floats), 0x7fc1);
  const size_t bytes = a.chunks.size() * sizeof(cuda::OptimChunk);
  a.table = Tensor::empty({static_cast<int64_t>((bytes + 3) / 4)}, DType::kI32, dev);
  Stream& st = current_stream(dev);
  cuda::memcpy_async(a.table.raw(), a.chunks.data(), bytes, st.native());
  st.synchronize();
  return a;
}

template <typename T>
void upload(Tensor& dst, const std::vector<T>& src) {
  Stream& st = current_stream(dst.device());
  cuda::memcpy_async(dst.raw(), src.data(), src.size() * sizeof(T), st.native());
  st.synchronize();
}

template <typename T>
std::vector<T> download(const Tensor& src) {
  Stream& st = current_stream(src.device());
  std::vector<T> out(static_cast<size_t>(src.numel()));
  st.synchronize();
  cuda::memcpy_async(out.data(), src.raw(), out.size() * sizeof(T), st.native());
  st.synchronize();
  return out;
}

struct State {
  std::vector<float> w, m, v;
  std::vector<uint16_t> shadow;
};

// Three AdamW steps of `variant` from the arena's initial values, with a clip factor below 1.
State run_adamw(Arena& a, int variant) {
  upload(a.dw, a.w);
  upload(a.dg, a.g);
  upload(a.dm, a.m);
  upload(a.dv, a.v);
  upload(a.dshadow, a.shadow);
  const Device dev = Device::cuda(0);
  Tensor scale = Tensor::from_vector({0.37}, {1}, DType::kF32).to(dev);
  for (int t = 1; t <= 3; ++t) {
    cuda::AdamWConstants k;
    k.lr = 3e-3f;
    k.b1 = 0.9f;
    k.b2 = 0.95f;
    k.eps = 1e-8f;
    k.c1 = static_cast<float>(1.0 / (1.0 - std::pow(0.9, t)));
    k.c2 = static_cast<float>(1.0 / (1.0 - std::pow(0.95, t)));
    k.wd = 0.1f;
    cuda::adamw_chunks_variant(variant, static_cast<const cuda::OptimChunk*>(a.table.raw()),
                               static_cast<int64_t>(a.chunks.size()), k, scale.data<float>(),
                               current_stream(dev).native());
  }
  return State{download<float>(a.dw), download<float>(a.dm), download<float>(a.dv),
               download<uint16_t>(a.dshadow)};
}

template <typename T>
int64_t count_differences(const std::vector<T>& x, const std::vector<T>& y) {
  int64_t bad = 0;
  for (size_t i = 0; i < x.size(); ++i) bad += std::memcmp(&x[i], &y[i], sizeof(T)) != 0;
  return bad;
}

TEST(FastOptimizerKernels, EveryAdamWVariantWritesTheLegacyBits) {
  REQUIRE_GPU();
  Arena a = make_arena();
  const State legacy = run_adamw(a, 0);
  // The reference must have done something everywhere a chunk reaches.
  EXPECT_GT(count_differences(legacy.w, a.w), a.floats / 2) << "the legacy update changed no w";
  EXPECT_GT(count_differences(legacy.shadow, a.shadow), 0) << "no shadow was written";
  for (int variant = 1; variant < cuda::kAdamWVariants; ++variant) {
    const std::string what = cuda::adamw_variant_name(variant);
    const State fast = run_adamw(a, variant);
    EXPECT_EQ(count_differences(fast.w, legacy.w), 0) << what << ": w differs";
    EXPECT_EQ(count_differences(fast.m, legacy.m), 0) << what << ": m differs";
    EXPECT_EQ(count_differences(fast.v, legacy.v), 0) << what << ": v differs";
    EXPECT_EQ(count_differences(fast.shadow, legacy.shadow), 0) << what << ": shadows differ";
  }
}

TEST(FastOptimizerKernels, EverySumsqVariantGivesTheLegacyPartials) {
  REQUIRE_GPU();
  Arena a = make_arena();
  upload(a.dg, a.g);
  const Device dev = Device::cuda(0);
  const auto n = static_cast<int64_t>(a.chunks.size());
  Tensor partials = Tensor::zeros({n}, DType::kF64, dev);
  const auto* table = static_cast<const cuda::OptimChunk*>(a.table.raw());
  std::vector<std::vector<double>> got;
  for (int variant = 0; variant < cuda::kSumsqVariants; ++variant) {
    partials.zero_();
    cuda::grad_sumsq_partials_variant(variant, table, n, partials.data<double>(),
                                      current_stream(dev).native());
    got.push_back(download<double>(partials));
  }
  // The partials are the sums of squares (to rounding), and each variant's bits are legacy's.
  for (size_t i = 0; i < a.chunks.size(); ++i) {
    const cuda::OptimChunk& c = a.chunks[i];
    const int64_t off = c.g - a.dg.data<float>();
    double ref = 0;
    for (int32_t j = 0; j < c.n; ++j) ref += static_cast<double>(a.g[off + j]) * a.g[off + j];
    EXPECT_NEAR(got[0][i], ref, 1e-10 * ref) << "chunk " << i;
  }
  for (int variant = 1; variant < cuda::kSumsqVariants; ++variant)
    EXPECT_EQ(count_differences(got[variant], got[0]), 0) << cuda::sumsq_variant_name(variant);
}

}  // namespace
}  // namespace gtron

// The CUDA capture's memset passes (Note [small memsets as kernels] in graphs/cuda_graph.h): small
// memset nodes become kernel nodes that write the same bytes in the same order, large ones stay;
// GEMMs captured with their memsets hoisted give the eager GEMMs' bits. GPU test; skipped without
// a GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "graphs/graph.h"
#include "model/cuda/gemm.h"
#include "model/cuda/runtime.h"
#include "tests/model/cuda_op_check.h"

namespace gtron::graphs {
namespace {

using gtron::cuda::CaptureMemsets;
using gtron::cuda::set_capture_memsets_for_testing;

const char* name(CaptureMemsets mode) {
  switch (mode) {
    case CaptureMemsets::kKeep:
      return "keep";
    case CaptureMemsets::kKernels:
      return "kernels";
    case CaptureMemsets::kHoist:
      return "hoist";
    case CaptureMemsets::kAll:
      return "all";
  }
  return "?";
}

// The bytes a capture of memsets writes, replayed twice over a poisoned buffer, must be the
// bytes the memsets describe, with and without the pass (kHoist, the default, hoists none of
// them: they are in no GEMM's workspace).
void capture_memsets_and_check(CaptureMemsets mode) {
  set_capture_memsets_for_testing(mode);
  const bool fold = mode != CaptureMemsets::kKeep;
  const Device dev = Device::cuda(0);
  Stream& s = current_stream(dev);
  constexpr size_t kBytes = 16384;
  Tensor buf = Tensor::empty({kBytes / 4}, DType::kI32, dev, &s);
  auto* d = static_cast<unsigned char*>(buf.raw());
  std::vector<unsigned char> want(kBytes, 0xEE);
  auto set = [&](size_t at, int value, size_t n) { std::memset(want.data() + at, value, n); };

  Graph::begin_capture(s);
  gtron::cuda::memset_async(d, 0, 4, s.native());  // the cuBLASLt case: one word
  set(0, 0, 4);
  gtron::cuda::memset_async(d + 7, 0xAB, 5, s.native());  // unaligned bytes
  set(7, 0xAB, 5);
  gtron::cuda::memset_2d_async(d + 64, 32, 0x5C, 3, 4, s.native());  // 3 bytes in 4 rows
  for (size_t r = 0; r < 4; ++r) set(64 + 32 * r, 0x5C, 3);
  gtron::cuda::memset_async(d + 256, 0x11, 4096, s.native());  // 4 KiB: the largest folded
  set(256, 0x11, 4096);
  gtron::cuda::memset_async(d + 260, 0x22, 8, s.native());  // over it: the order must hold
  set(260, 0x22, 8);
  gtron::cuda::memset_async(d + 8192, 0x33, 8192, s.native());  // 8 KiB: stays a memset node
  set(8192, 0x33, 8192);
  gtron::cuda::memset_async(d + 8200, 0x44, 2, s.native());  // after the large one
  set(8200, 0x44, 2);
  Graph g = Graph::end_capture(s);
  set_capture_memsets_for_testing(CaptureMemsets::kHoist);  // the default
  // kAll folds the 8 KiB memset too (the large fill kernel, in 16-byte words).
  EXPECT_EQ(g.memsets_folded(), mode == CaptureMemsets::kAll ? 7u : fold ? 6u : 0u);
  EXPECT_EQ(g.memsets_hoisted(), 0u);
  EXPECT_EQ(g.nodes(), 7u);

  for (int replay = 0; replay < 2; ++replay) {
    gtron::cuda::memset_async(d, 0xEE, kBytes, s.native());
    g.replay(s);
    Tensor host = buf.to(Device::cpu(), &s);
    s.synchronize();
    const auto* got = static_cast<const unsigned char*>(host.raw());
    size_t wrong = 0;
    for (size_t i = 0; i < kBytes; ++i) wrong += got[i] != want[i];
    EXPECT_EQ(wrong, 0u) << "replay " << replay << ", mode " << name(mode);
  }
}

TEST(CudaGraph, SmallMemsetsBecomeKernelsWithTheSameBytes) {
  GTRON_REQUIRE_GPU();
  capture_memsets_and_check(CaptureMemsets::kKernels);
  capture_memsets_and_check(CaptureMemsets::kHoist);
}

TEST(CudaGraph, UnderAllEveryMemsetBecomesAKernelWithTheSameBytes) {
  GTRON_REQUIRE_GPU();
  capture_memsets_and_check(CaptureMemsets::kAll);
}

TEST(CudaGraph, WithoutThePassEveryMemsetStays) {
  GTRON_REQUIRE_GPU();
  capture_memsets_and_check(CaptureMemsets::kKeep);
}

// Three bf16 GEMMs of the step's shapes (one with bias and residual), eagerly and as one graph
// captured under each mode, replayed twice: the outputs must be the eager ones, bit for bit, and
// the graph may hoist at most one memset per GEMM.
TEST(CudaGraph, CapturedGemmsGiveTheEagerBitsUnderEveryMode) {
  GTRON_REQUIRE_GPU();
  const Device dev = Device::cuda(0);
  Stream& s = current_stream(dev);
  struct Shape {
    int64_t m, n, k;
    bool trans_b, bias, residual;
  };
  const std::vector<Shape> shapes = {{4096, 2304, 768, true, true, false},
                                     {4096, 768, 3072, true, true, true},
                                     {768, 3072, 4096, false, false, false}};
  std::vector<Tensor> a, b, bias, c, want;
  uint64_t seed = 7;
  auto random = [&](int64_t n, double scale) {
    std::vector<double> v(n);
    for (double& x : v) {
      seed = seed * 6364136223846793005ull + 1442695040888963407ull;
      x = scale * (static_cast<double>(seed >> 11) / 9007199254740992.0 - 0.5);
    }
    return v;
  };
  for (const Shape& sh : shapes) {
    a.push_back(Tensor::from_vector(random(sh.m * sh.k, 2.0), {sh.m, sh.k}, DType::kF32)
                    .to(DType::kBF16)
                    .to(dev, &s));
    b.push_back(Tensor::from_vector(random(sh.k * sh.n, 0.1), {sh.k, sh.n}, DType::kF32)
                    .to(DType::kBF16)
                    .to(dev, &s));
    bias.push_back(
        Tensor::from_vector(random(sh.n, 1.0), {sh.n}, DType::kF32).to(DType::kBF16).to(dev, &s));
    c.push_back(Tensor::from_vector(random(sh.m * sh.n, 1.0), {sh.m, sh.n}, DType::kF32)
                    .to(DType::kBF16)
                    .to(dev, &s));
  }
  auto run = [&](std::vector<Tensor>& outs) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      const Shape& sh = shapes[i];
      gtron::cuda::GemmArgs g;
      g.a = a[i].raw();
      g.b = b[i].raw();
      g.trans_b = sh.trans_b;  // b's bytes read as [N, K]: the shape only matters for the bits
      g.m = sh.m;
      g.n = sh.n;
      g.k = sh.k;
      g.ab = DType::kBF16;
      g.c_type = DType::kBF16;
      g.c = sh.residual ? c[i].raw() : outs[i].raw();
      g.d = outs[i].raw();
      g.beta = sh.residual ? 1.0f : 0.0f;
      g.bias = sh.bias ? bias[i].raw() : nullptr;
      g.bias_type = DType::kBF16;
      gtron::cuda::gemm(g, s.native());
    }
  };
  for (const Shape& sh : shapes) want.push_back(Tensor::empty({sh.m, sh.n}, DType::kBF16, dev, &s));
  run(want);
  std::vector<std::vector<double>> expect;
  for (const Tensor& t : want) expect.push_back(t.to(Device::cpu(), &s).to_vector());
  for (CaptureMemsets mode : {CaptureMemsets::kKeep, CaptureMemsets::kKernels,
                              CaptureMemsets::kHoist, CaptureMemsets::kAll}) {
    set_capture_memsets_for_testing(mode);
    std::vector<Tensor> outs;
    for (const Shape& sh : shapes)
      outs.push_back(Tensor::empty({sh.m, sh.n}, DType::kBF16, dev, &s));
    Graph::begin_capture(s);
    run(outs);
    Graph g = Graph::end_capture(s);
    set_capture_memsets_for_testing(CaptureMemsets::kHoist);  // the default
    EXPECT_LE(g.memsets_hoisted(), shapes.size()) << name(mode);
    std::printf("mode %s: %zu nodes, %zu memsets as kernels, %zu hoisted\n", name(mode), g.nodes(),
                g.memsets_folded(), g.memsets_hoisted());
    for (int replay = 0; replay < 2; ++replay) {
      for (Tensor& t : outs) gtron::cuda::memset_async(t.raw(), 0x7F, t.nbytes(), s.native());
      g.replay(s);
      for (size_t i = 0; i < outs.size(); ++i) {
        EXPECT_EQ(outs[i].to(Device::cpu(), &s).to_vector(), expect[i])
            << "GEMM " << i << ", mode " << name(mode) << ", replay " << replay;
      }
    }
  }
}

}  // namespace
}  // namespace gtron::graphs

// The CUDA capture's memset pass (Note [small memsets as kernels] in graphs/cuda_graph.h): small
// memset nodes become kernel nodes that write the same bytes in the same order; large ones stay.
// GPU test; skipped without a GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "graphs/graph.h"
#include "model/cuda/runtime.h"
#include "tests/model/cuda_op_check.h"

namespace gtron::graphs {
namespace {

// The bytes a capture of memsets writes, replayed twice over a poisoned buffer, must be the
// bytes the memsets describe, with and without the pass.
void capture_memsets_and_check(bool fold) {
  ASSERT_EQ(setenv("GTRON_GRAPH_MEMSET_KERNELS", fold ? "1" : "0", 1), 0);
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
  unsetenv("GTRON_GRAPH_MEMSET_KERNELS");
  EXPECT_EQ(g.memsets_folded(), fold ? 6u : 0u);
  EXPECT_EQ(g.nodes(), 7u);

  for (int replay = 0; replay < 2; ++replay) {
    gtron::cuda::memset_async(d, 0xEE, kBytes, s.native());
    g.replay(s);
    Tensor host = buf.to(Device::cpu(), &s);
    s.synchronize();
    const auto* got = static_cast<const unsigned char*>(host.raw());
    size_t wrong = 0;
    for (size_t i = 0; i < kBytes; ++i) wrong += got[i] != want[i];
    EXPECT_EQ(wrong, 0u) << "replay " << replay << (fold ? ", folded" : ", as memsets");
  }
}

TEST(CudaGraph, SmallMemsetsBecomeKernelsWithTheSameBytes) {
  GTRON_REQUIRE_GPU();
  capture_memsets_and_check(true);
}

TEST(CudaGraph, WithoutThePassEveryMemsetStays) {
  GTRON_REQUIRE_GPU();
  capture_memsets_and_check(false);
}

}  // namespace
}  // namespace gtron::graphs

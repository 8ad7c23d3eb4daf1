// wgmma helpers (model/cuda/wgmma.cuh) on two 64×64 bf16 tiles against a double-precision
// product on the host: scores-style A·Bᵀ from shared memory, and A·B with A from registers and
// B read MN-major, as the flash kernels use them (GPU test; skipped without a compute-capability
// 9.0 GPU).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "model/dtype.h"
#include "tests/model/wgmma_probe.h"

namespace gtron {
namespace {

bool have_sm90() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) return false;
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
  return major == 9 && minor == 0;
}

double max_err(const std::vector<float>& got, const std::vector<double>& want) {
  double e = 0;
  for (size_t i = 0; i < got.size(); ++i) e = std::max(e, std::abs(got[i] - want[i]));
  return e;
}

TEST(Wgmma, ProductsMatchHost) {
  if (!have_sm90()) GTEST_SKIP() << "needs a compute-capability 9.0 GPU";
  constexpr int n = 64;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<BF16> a(n * n), b(n * n);
  std::vector<double> av(n * n), bv(n * n);
  for (int i = 0; i < n * n; ++i) {
    a[i] = float_to_bf16(nd(rng));
    b[i] = float_to_bf16(nd(rng));
    av[i] = bf16_to_float(a[i]);
    bv[i] = bf16_to_float(b[i]);
  }
  std::vector<double> abt(n * n, 0.0), ab(n * n, 0.0);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      for (int k = 0; k < n; ++k) {
        abt[i * n + j] += av[i * n + k] * bv[j * n + k];
        ab[i * n + j] += av[i * n + k] * bv[k * n + j];
      }
    }
  }
  void *da = nullptr, *db = nullptr;
  float* out = nullptr;
  ASSERT_EQ(cudaMalloc(&da, n * n * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&db, n * n * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&out, 3 * n * n * 4), cudaSuccess);
  cudaMemcpy(da, a.data(), n * n * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(db, b.data(), n * n * 2, cudaMemcpyHostToDevice);
  cuda::wgmma_probe(da, db, out, out + n * n, out + 2 * n * n);
  std::vector<float> got(3 * n * n);
  cudaMemcpy(got.data(), out, got.size() * 4, cudaMemcpyDeviceToHost);
  cudaFree(da);
  cudaFree(db);
  cudaFree(out);
  const std::vector<float> g_abt(got.begin(), got.begin() + n * n);
  const std::vector<float> g_ab(got.begin() + n * n, got.begin() + 2 * n * n);
  const std::vector<float> g_alt(got.begin() + 2 * n * n, got.end());
  // fp32 accumulation of 64 exact bf16 products: errors of a few ulps of values ~8.
  EXPECT_LT(max_err(g_abt, abt), 1e-3);
  EXPECT_LT(max_err(g_ab, ab), 1e-3) << "with the byte offsets swapped: " << max_err(g_alt, ab);
}

}  // namespace
}  // namespace gtron

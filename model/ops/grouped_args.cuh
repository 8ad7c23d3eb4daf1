// The operands of one grouped-GEMM launch and the tile scheduling every grouped kernel shares
// (Note [grouped GEMM on CUDA] in grouped_linear_cuda.cu): GroupedArgs travels by value, and a
// CTA's resolve() names its group, its tile origin and the product's View. Included by
// grouped_linear_cuda.cu (mma.sync and fp32 kernels) and grouped_wgmma_cuda.cu (sm_90a wgmma).
#pragma once

#include <cstdint>

#include "model/cuda/kernel_util.cuh"
#include "model/ops/grouped_limits.h"

namespace gtron::cuda::grouped {

enum class Product { kForward, kData, kWeight };

// Everything a launch needs, by value (about 4.2 KiB).
struct GroupedArgs {
  const void* x = nullptr;           // [M, Cin]
  const void* dy = nullptr;          // [M, Cout]
  void* out = nullptr;               // y [M, Cout] (forward) or dx [M, Cin] (data)
  const int32_t* offsets = nullptr;  // [G + 1]
  int64_t Cin = 0, Cout = 0;
  int G = 0;
  bool overwrite = false;  // data: dx written, not accumulated
  bool w_f32 = false;      // forward, data: fp32 weights, rounded to bf16 as loaded (wgmma only)
  const void* group[kGroupsPerLaunch] = {};  // weights (forward, data) or f32 dW (weight)
  uint32_t overwrite_mask[kGroupsPerLaunch / 32] = {};  // weight: dW_g written
};
static_assert(sizeof(GroupedArgs) <= 4096, "within the classic 4 KiB of kernel arguments");

// One group's product C[M, N] (+)= A[M, K]·B[K, N] in element strides: A(m, k) is a[m·lda + k]
// when K-major, a[k·lda + m] when MN-major; B(k, n) is b[n·ldb + k] or b[k·ldb + n]; C(m, n) is
// c[m·ldc + n].
template <typename T>
struct View {
  const T* a;
  int64_t lda;
  const T* b;
  int64_t ldb;
  void* c;
  int64_t ldc;
  int M, N, K;
};

template <Product P>
constexpr bool kAKMajor = P != Product::kWeight;
template <Product P>
constexpr bool kBKMajor = P == Product::kForward;

// Tile slot t's group g and row tile within it (Note [grouped GEMM on CUDA]); false past the last
// tile. Called by every thread of the block (it has barriers).
template <int BM>
__device__ bool find_row_tile(const int32_t* off, int G, int t, int& g, int& tile) {
  __shared__ int warp_total[32];
  __shared__ int found_g, found_tile;
  const int per = (G + static_cast<int>(blockDim.x) - 1) / static_cast<int>(blockDim.x);
  const int e0 = min(G, static_cast<int>(threadIdx.x) * per), e1 = min(G, e0 + per);
  int mine = 0;
  for (int e = e0; e < e1; ++e) mine += (off[e + 1] - off[e] + BM - 1) / BM;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int incl = mine;
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const int y = __shfl_up_sync(0xffffffffu, incl, d);
    if (lane >= d) incl += y;
  }
  if (lane == 31) warp_total[warp] = incl;
  if (threadIdx.x == 0) found_g = -1;
  __syncthreads();
  int start = incl - mine;
  for (int w = 0; w < warp; ++w) start += warp_total[w];
  for (int e = e0; e < e1; ++e) {
    const int tiles = (off[e + 1] - off[e] + BM - 1) / BM;
    if (t >= start && t < start + tiles) {
      found_g = e;
      found_tile = t - start;
    }
    start += tiles;
  }
  __syncthreads();
  g = found_g;
  tile = found_tile;
  return g >= 0;
}

// This CTA's product and tile origin (m0, n0); false when it has nothing to do (uniform over the
// block). Every thread calls it.
template <Product P, typename T, int BM, int BN>
__device__ bool resolve(const GroupedArgs& a, View<T>& v, int& m0, int& n0, bool& overwrite) {
  const int32_t* off = a.offsets;
  const auto* x = static_cast<const T*>(a.x);
  const auto* dy = static_cast<const T*>(a.dy);
  const int Cin = static_cast<int>(a.Cin), Cout = static_cast<int>(a.Cout);
  if constexpr (P == Product::kWeight) {
    const int g = blockIdx.y;
    const int tiles_n = (Cin + BN - 1) / BN;
    m0 = (blockIdx.x / tiles_n) * BM;
    n0 = (blockIdx.x % tiles_n) * BN;
    const int r0 = off[g], rows = off[g + 1] - off[g];
    overwrite = (a.overwrite_mask[g / 32] >> (g % 32)) & 1u;
    if (a.group[g] == nullptr || (rows == 0 && !overwrite)) return false;
    v = View<T>{dy + static_cast<int64_t>(r0) * Cout,
                Cout,
                x + static_cast<int64_t>(r0) * Cin,
                Cin,
                const_cast<void*>(a.group[g]),
                Cin,
                Cout,
                Cin,
                rows};
    return true;
  } else {
    int g = 0, tile = 0;
    if (!find_row_tile<BM>(off, a.G, blockIdx.x, g, tile)) return false;
    const int r0 = off[g], rows = off[g + 1] - off[g];
    m0 = tile * BM;
    n0 = blockIdx.y * BN;
    overwrite = P == Product::kForward || a.overwrite;
    const auto* w = static_cast<const T*>(a.group[g]);
    if constexpr (P == Product::kForward) {
      v = View<T>{x + static_cast<int64_t>(r0) * Cin,
                  Cin,
                  w,
                  Cin,
                  static_cast<T*>(a.out) + static_cast<int64_t>(r0) * Cout,
                  Cout,
                  rows,
                  Cout,
                  Cin};
    } else {
      v = View<T>{dy + static_cast<int64_t>(r0) * Cout,
                  Cout,
                  w,
                  Cin,
                  static_cast<T*>(a.out) + static_cast<int64_t>(r0) * Cin,
                  Cin,
                  rows,
                  Cin,
                  Cout};
    }
    return true;
  }
}

}  // namespace gtron::cuda::grouped

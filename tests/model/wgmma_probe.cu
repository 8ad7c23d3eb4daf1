// Device side of wgmma_cuda_test: one warpgroup multiplies two 64×64 bf16 tiles through the
// helpers of model/cuda/wgmma.cuh (built for sm_90a).
#include <cuda_bf16.h>

#include "model/cuda/check.h"
#include "model/cuda/mma_tile.cuh"
#include "model/cuda/wgmma.cuh"
#include "tests/model/wgmma_probe.h"

namespace gtron::cuda {
namespace {

// Row-major [64, 64] global tile -> swizzled shared tile (plain stores, then the proxy fence).
__device__ void stage(bf16* tile, const bf16* g) {
  for (int i = threadIdx.x; i < 64 * 8; i += 128) {
    const int r = i / 8, c = i % 8;
    *reinterpret_cast<uint4*>(tile + swz<64>(r, c)) =
        *reinterpret_cast<const uint4*>(g + r * 64 + c * 8);
  }
  async_proxy_fence();
}

// out[64×64] row-major from the accumulator layout of Note [wgmma operands].
__device__ void unstage(const float (&d)[8][4], float* out) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int j = 0; j < 8; ++j) {
    for (int e = 0; e < 4; ++e) {
      const int row = warp * 16 + (lane >> 2) + (e >> 1) * 8;
      const int col = j * 8 + (lane & 3) * 2 + (e & 1);
      out[row * 64 + col] = d[j][e];
    }
  }
}

__global__ void __launch_bounds__(128)
    probe_kernel(const bf16* a, const bf16* b, float* abt, float* ab, float* ab_alt) {
  __shared__ __align__(1024) bf16 sa[64 * 64];
  __shared__ __align__(1024) bf16 sb[64 * 64];
  stage(sa, a);
  stage(sb, b);
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

  float d[8][4];
  wg::fence();
  wg::abt_ss(d, sa, sb, false);
  wg::commit();
  wg::wait<0>();
  wg::hold(d);
  unstage(d, abt);

  // A · B with A's fragments from registers and B read MN-major.
  uint32_t af[4][4];
  load_a<64>(af, sa, warp * 16, lane);
  float e[8][4] = {};
  wg::fence();
  wg::pv_rs(e, af, sb);
  wg::commit();
  wg::wait<0>();
  wg::hold(e);
  unstage(e, ab);

  // The same with the two byte offsets of the descriptor swapped (diagnostics only).
  float f[8][4] = {};
  uint64_t alt = (smem_u32(sb) & 0x3FFFFu) >> 4;
  alt |= static_cast<uint64_t>(1024 >> 4) << 16;
  alt |= static_cast<uint64_t>(1) << 32;
  alt |= static_cast<uint64_t>(1) << 62;
  wg::fence();
#pragma unroll
  for (int k = 0; k < 4; ++k) wg::mma_rs<1>(f, af[k], wg::advance(alt, 2048 * k), true);
  wg::commit();
  wg::wait<0>();
  wg::hold(f);
  unstage(f, ab_alt);
}

}  // namespace

void wgmma_probe(const void* a, const void* b, float* abt, float* ab, float* ab_alt) {
  probe_kernel<<<1, 128>>>(static_cast<const bf16*>(a), static_cast<const bf16*>(b), abt, ab,
                           ab_alt);
  CUDA_CHECK_LAUNCH();
  CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace gtron::cuda

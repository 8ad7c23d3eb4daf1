// Device pieces shared by the flash-attention kernels (model/ops/flash_attention_cuda.cu, mma.sync
// for sm_80+, and model/ops/flash_wgmma_cuda.cu, wgmma for sm_90a): tile constants, the key/value
// double buffer, the online-softmax update and the row stores. See Note [flash attention tiling].
#pragma once

#include <cuda_bf16.h>

#include <cmath>

#include "model/cuda/kernel_util.cuh"
#include "model/cuda/mma_tile.cuh"
#include "model/ops/attention.h"

namespace gtron::cuda {
namespace {

constexpr int kThreadsFa = 128;  // 4 warps
constexpr int kRows = 64;        // rows of a CTA's own tile (16 per warp)
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// The key/value double buffer of a CTA walking key tiles 0 .. n_tiles − 1: issues tile j + 1's
// loads into the other buffer (when there is one), then waits until tile j's have landed and
// every thread sees them (with kAsync, wgmma's async proxy too). Tile j sits in buffer j % 2.
// Called by all threads.
template <int HS, int kN, bool kAsync = false>
__device__ __forceinline__ void next_kv_tile(bf16* sK, bf16* sV, const bf16* gk, const bf16* gv,
                                             int64_t ld, int j, int n_tiles, int len) {
  if (j + 1 < n_tiles) {
    const int nb = (j + 1) & 1;
    load_tile<HS, kN, kThreadsFa>(sK + nb * kN * HS, gk, ld, (j + 1) * kN, len);
    load_tile<HS, kN, kThreadsFa>(sV + nb * kN * HS, gv, ld, (j + 1) * kN, len);
    cp_async_commit();
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
  if (kAsync) async_proxy_fence();
  __syncthreads();
}

// acc rows r0 + lane/4 (+8) go to dst rows (row stride ld) below `len`: stored, or with `add`
// added to what is there (bf16 read-modify-write, one owner per element), after scaling by `mul`.
template <int HS>
__device__ __forceinline__ void store_rows(const float (&acc)[HS / 8][4], bf16* dst, int64_t ld,
                                           int r0, int len, int lane, const float (&mul)[2],
                                           bool add) {
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int row = r0 + (lane >> 2) + rr * 8;
    if (row >= len) continue;
    bf16* out = dst + static_cast<int64_t>(row) * ld + (lane & 3) * 2;
#pragma unroll
    for (int dt = 0; dt < HS / 8; ++dt) {
      float x = acc[dt][2 * rr] * mul[rr], y = acc[dt][2 * rr + 1] * mul[rr];
      __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(out + dt * 8);
      if (add) {
        const float2 cur = __bfloat1622float2(*o);
        x += cur.x;
        y += cur.y;
      }
      *o = __floats2bfloat162_rn(x, y);
    }
  }
}


// The causal mask and the online-softmax update of one 16-row accumulator tile (rows row_base
// and row_base + 8 of this lane), turning s into P in place and rescaling o.
template <int HS, int NT>
__device__ __forceinline__ void online_softmax(float (&s)[NT][4], float (&o)[HS / 8][4],
                                               float (&m)[2], float (&l)[2], int row_base, int k0,
                                               bool masked, const FlashForwardArgs& a, int lane,
                                               float sl2) {
  const int off = a.Tk - a.Tq;
  if (masked) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = k0 + nt * 8 + (lane & 3) * 2 + (e & 1);
        const int row = row_base + (e >> 1) * 8;
        if (key > row + off || key >= a.Tk) s[nt][e] = -INFINITY;
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    float mx = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * rr], s[nt][2 * rr + 1]));
    const float m_new = fmaxf(m[rr], quad_max(mx) * sl2);
    const float m_use = m_new == -INFINITY ? 0.0f : m_new;
    const float corr = fast_exp2(m[rr] - m_use);
    m[rr] = m_new;
    float sum = 0.0f;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int e = 2 * rr; e < 2 * rr + 2; ++e) {
        s[nt][e] = fast_exp2(s[nt][e] * sl2 - m_use);
        sum += s[nt][e];
      }
    }
    l[rr] = l[rr] * corr + sum;
#pragma unroll
    for (int dt = 0; dt < HS / 8; ++dt) {
      o[dt][2 * rr] *= corr;
      o[dt][2 * rr + 1] *= corr;
    }
  }
}

}  // namespace
}  // namespace gtron::cuda

// The ordered-dQ pieces of the FA3 key kernel (kDq; Note [ordered dQ in the FA3 backward] in
// flash_fa3_dq_cuda.cu). Included by flash_fa3_bwd_cuda.cu only (sm_90a), after
// flash_common.cuh, tma.cuh and wgmma.cuh.
#pragma once

#include <cstdint>

namespace gtron::cuda::fa3dq {

constexpr int kKeysCta = 128;  // keys of a key CTA (flash_fa3_bwd_cuda.cu checks these)
constexpr int kKeysWg = 64;    // keys of a consumer warpgroup
constexpr int kPanel = 64;     // bf16 columns of a 128-byte swizzled panel

// The key kernel's dQ outputs (Note [ordered dQ in the FA3 backward]): the fp32 dQ sums [B, NH, T,
// HS] and the turn counters [B, NH, ceil(T / kQ), 2] (zero at launch).
struct DqSums {
  float* acc = nullptr;
  int* turn = nullptr;
};

// kDq: consumer w's 64 rows of the dSᵀ tile [kKeysCta keys, kQ queries] (panels of [kKeysCta, 64],
// swizzled as wgmma reads them) from its fp32 dSᵀ, rounded to bf16 as to_a rounds it, or zeros.
template <int kQ, bool kZero>
__device__ __forceinline__ void put_ds(bf16* tile, const float (&ds)[kQ / 8][4], int w, int warp,
                                       int lane) {
#pragma unroll
  for (int nt = 0; nt < kQ / 8; ++nt) {
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int r = w * kKeysWg + warp * 16 + (lane >> 2) + rr * 8;
      const uint32_t v = kZero ? 0u : pack_bf16(ds[nt][2 * rr], ds[nt][2 * rr + 1]);
      bf16* panel = tile + (nt / 8) * kKeysCta * kPanel;
      *reinterpret_cast<uint32_t*>(panel + swz<kPanel>(r, nt % 8) + 2 * (lane & 3)) = v;
    }
  }
}

// kDq: consumer w's part of dQ = dS·K for the step's kQ queries over the CTA's 128 keys, both
// operands MN-major in shared memory (the reduced index, keys, along their rows): at HS 128 all
// 64 queries by head columns 64w ..; at HS 64 queries 64w .. by the 64 columns. m64n64, 8 slices
// of 16 keys. The caller fences and commits.
template <int HS, int kQ>
__device__ __forceinline__ void dq_products(float (&dq)[8][4], const bf16* ds_tile, const bf16* k,
                                            int w) {
  const uint64_t da = wg::desc(kQ == 64 ? ds_tile : ds_tile + w * kKeysCta * kPanel);
  const uint64_t db = wg::desc(HS == 128 ? k + w * kKeysCta * kPanel : k);
#pragma unroll
  for (int kk = 0; kk < kKeysCta / 16; ++kk) {
    wg::mma_ss<1, 1>(dq, wg::advance(da, 2048 * kk), wg::advance(db, 2048 * kk), kk > 0);
  }
}

__device__ __forceinline__ int load_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void store_release(int* p, int v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

// kDq: consumer w adds its dQ part of step i (key block j) into the fp32 sums in its turn
// (Note [ordered dQ in the FA3 backward]): key blocks qt·kQ/kKeysCta down to 0, the first one
// storing. Rows past T are left alone.
template <int HS, int kQ>
__device__ __forceinline__ void add_dq(const float (&dq)[8][4], const DqSums& d,
                                       const FlashBackwardArgs& a, const KeyWalk& walk, int i,
                                       int j, int w, int warp, int lane) {
  const int h = walk.head(i), qt = walk.tile(i);
  const int64_t bh = static_cast<int64_t>(walk.b) * a.NH + h;
  int* turn = d.turn + (bh * ((a.T + kQ - 1) / kQ) + qt) * 2 + w;
  const int mine = qt * kQ / kKeysCta - j;
  if (threadIdx.x % 128 == 0) {
    // (No trap on a turn that never comes: one here cost the consumers ~900 bytes of spills.
    // The device commands run every test and sweep under `timeout`.)
    while (load_acquire(turn) != mine) __nanosleep(32);
    __threadfence();
  }
  tma::bar_sync<128>(1 + w);
  const int m0 = qt * kQ + (kQ == 128 ? kKeysWg * w : 0) + warp * 16 + (lane >> 2);
  const int n0 = (HS == 128 ? kPanel * w : 0) + 2 * (lane & 3);
  float* rows = d.acc + bh * a.T * HS;
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int q = m0 + rr * 8;
    if (q >= a.T) continue;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      float2* p = reinterpret_cast<float2*>(rows + static_cast<int64_t>(q) * HS + n0 + nt * 8);
      float2 v = make_float2(dq[nt][2 * rr], dq[nt][2 * rr + 1]);
      if (mine > 0) {
        const float2 o = __ldcg(p);
        v.x = o.x + v.x;
        v.y = o.y + v.y;
      }
      __stcg(p, v);
    }
  }
  __threadfence();
  tma::bar_sync<128>(1 + w);
  if (threadIdx.x % 128 == 0) store_release(turn, mine + 1);
}

}  // namespace gtron::cuda::fa3dq

// The FlashAttention-3-structured forward's per-tile device pieces (sm_90a only; included by
// model/ops/flash_fa3_cuda.cu): the CTA's shape, its shared memory and mbarriers, one key tile's
// products and online softmax, and the store of a finished query tile. The roles, the walk over
// work tiles and the launcher are in flash_fa3_cuda.cu (Notes [FlashAttention-3 forward] and
// [persistent FA3 forward]); whatever the schedule, a query tile's result comes from these
// functions in one fixed order, which is what keeps the schedules bit-identical.
#pragma once

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "model/cuda/kernel_util.cuh"
#include "model/cuda/mma_tile.cuh"
#include "model/cuda/tma.cuh"
#include "model/cuda/wgmma.cuh"
#include "model/cuda/wgmma_wide.cuh"
#include "model/ops/attention.h"
#include "model/ops/flash_common.cuh"

namespace gtron::cuda {
namespace {

constexpr int kConsumers = 2;                     // consumer warpgroups
constexpr int kRowsWg = 64;                       // query rows of a consumer warpgroup
constexpr int kRowsCta = kConsumers * kRowsWg;    // query rows of a work tile
constexpr int kKeys = 128;                        // keys of a tile (N of S = Q·Kᵀ)
constexpr int kThreads = 128 * (1 + kConsumers);  // producer warpgroup + consumers
constexpr int kProducerRegs = 24;
constexpr int kConsumerRegs = 240;
constexpr int kBarFirst = 1;  // named barrier of consumer w: kBarFirst + w (0 is __syncthreads')
constexpr int kPanel = 64;    // bf16 columns of a 128-byte swizzled panel

// Where everything sits in the (1024-byte aligned) dynamic shared memory: Q, the K and V rings of
// kStages slots, the mbarriers, and one word the producer hands the consumers with each Q (the
// number of key tiles walked, under document masking). A [rows, HS] tile is HS/64 panels of
// [rows, 64], panel p at element p·rows·64: the layout TMA writes with the 128-byte swizzle and
// wg::desc describes (Note [wgmma operands]).
template <int HS, int kStages_>
struct Fa3Smem {
  static constexpr int kStages = kStages_;
  static constexpr int kQBytes = kRowsCta * HS * 2;
  static constexpr int kTileBytes = kKeys * HS * 2;  // one K or V tile
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + kQBytes;
  static constexpr int kV = kK + kStages * kTileBytes;
  static constexpr int kBars = kV + kStages * kTileBytes;
  // Q full, Q empty; K full, V full, K empty, V empty per slot.
  static constexpr int kNumBars = 2 + 4 * kStages;
  static constexpr int kVisit = kBars + kNumBars * 8;
  static constexpr int kBytes = kVisit + 8 + 1024;  // + the alignment pad
};

// The CTA's barriers: full ones get the producer's expect_tx and the bytes; empty ones one arrival
// per consumer warp that read the buffer.
struct Fa3Bars {
  uint64_t *q_full, *q_empty;
  uint64_t *k_full, *v_full, *k_empty, *v_empty;  // [kStages] each
  template <int kStages>
  __device__ __forceinline__ static Fa3Bars at(uint64_t* base) {
    return {base,
            base + 1,
            base + 2,
            base + 2 + kStages,
            base + 2 + 2 * kStages,
            base + 2 + 3 * kStages};
  }
};

// s[64 × 128] = Q_w · K_tileᵀ over HS columns: m64n128k16 products, A this warpgroup's 64 rows of
// the CTA's Q tile, B the 128 keys, both K-major. The caller fences and commits.
template <int HS>
__device__ __forceinline__ void scores(float (&s)[kKeys / 8][4], const bf16* q_w, const bf16* k) {
#pragma unroll
  for (int p = 0; p < HS / kPanel; ++p) {
    const uint64_t dq = wg::desc(q_w + p * kRowsCta * kPanel);
    const uint64_t dk = wg::desc(k + p * kKeys * kPanel);
#pragma unroll
    for (int kk = 0; kk < kPanel / 16; ++kk) {
      wg::mma_ss_n128<0>(s, wg::advance(dq, 32 * kk), wg::advance(dk, 32 * kk), p > 0 || kk > 0);
    }
  }
}

// o[64 × HS] += P · V_tile, P as the A operands of 128 keys, V [128 keys, HS] MN-major: per
// 64-column panel, the 8 k-slices of m64n64k16 into that panel's half of o. The caller fences and
// commits.
template <int HS>
__device__ __forceinline__ void pv(float (&o)[HS / 8][4], const uint32_t (&pa)[kKeys / 16][4],
                                   const bf16* v) {
#pragma unroll
  for (int p = 0; p < HS / kPanel; ++p) {
    wg::pv_rs(*reinterpret_cast<float(*)[8][4]>(&o[p * 8]), pa, v + p * kKeys * kPanel);
  }
}

// The online softmax of one key tile for this lane's rows row0 and row0 + 8: masks keys above the
// diagonal or past T when `masked`, turns s into P = 2^(s·sl2 − m) in place, updates the running
// max m (log2 units, scale folded in) and the lane's partial row sums l, and leaves in corr the
// factor by which O must be rescaled before P joins it (O is in flight meanwhile).
// kSeg: `masked` also masks keys of another segment than the row's (sr.own).
template <int NT, bool kSeg>
__device__ __forceinline__ void softmax_tile(float (&s)[NT][4], float (&m)[2], float (&l)[2],
                                             float (&corr)[2], float sl2, bool masked, int key0,
                                             int row0, int T, int lane, const SegRows& sr) {
  if (masked) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = key0 + nt * 8 + (lane & 3) * 2 + (e & 1);
        const int row = row0 + (e >> 1) * 8;
        if (key > row || key >= T) s[nt][e] = -INFINITY;
        if constexpr (kSeg) {
          if (key < T && sr.row[key] != sr.own[e >> 1]) s[nt][e] = -INFINITY;
        }
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    float mx = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * rr], s[nt][2 * rr + 1]));
    const float m_new = fmaxf(m[rr], quad_max(mx) * sl2);
    const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // a row with no key yet
    corr[rr] = fast_exp2(m[rr] - m_use);
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
    l[rr] = l[rr] * corr[rr] + sum;
  }
}

template <int HS>
__device__ __forceinline__ void rescale(float (&o)[HS / 8][4], const float (&corr)[2]) {
#pragma unroll
  for (int dt = 0; dt < HS / 8; ++dt) {
    o[dt][0] *= corr[0];
    o[dt][1] *= corr[0];
    o[dt][2] *= corr[1];
    o[dt][3] *= corr[1];
  }
}

// One arrival per warp on an empty barrier, after the warp's wait_group retired the products that
// read the buffer.
__device__ __forceinline__ void release(uint64_t* bar, int lane) {
  if (lane == 0) tma::mbar_arrive(bar);
}

// o / l and lse of this lane's rows row0 and row0 + 8 of head (b, h), those below T; straight
// from the registers (no shared memory: the next tile's loads may already be landing).
template <int HS>
__device__ __forceinline__ void store_rows(const FlashForwardArgs& a, const float (&o)[HS / 8][4],
                                           const float (&m)[2], const float (&l)[2], int b, int h,
                                           int row0, int lane) {
  const int T = a.Tq;
  const int64_t bh = static_cast<int64_t>(b) * a.NH + h;
  bf16* go = static_cast<bf16*>(a.o) + b * a.o_batch + h * HS;
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int row = row0 + rr * 8;
    const float lt = quad_sum(l[rr]);
    const float inv = 1.0f / lt;
    if (row >= T) continue;
    if ((lane & 3) == 0) a.lse[bh * T + row] = (m[rr] + log2f(lt)) * kLn2;
    bf16* out = go + static_cast<int64_t>(row) * a.o_ld + (lane & 3) * 2;
#pragma unroll
    for (int dt = 0; dt < HS / 8; ++dt) {
      *reinterpret_cast<__nv_bfloat162*>(out + dt * 8) =
          __floats2bfloat162_rn(o[dt][2 * rr] * inv, o[dt][2 * rr + 1] * inv);
    }
  }
}

// The number of i in [0, n) for which pred(i) holds, counted by the calling warp (all 32 lanes,
// converged; one ballot per 32 candidates): first_key_tile's count without a CTA barrier, for a
// role that runs apart from the others.
template <typename Pred>
__device__ __forceinline__ int warp_count(int n, Pred pred) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  int total = 0;
  for (int base = 0; base < n; base += 32) {
    const int i = base + lane;
    total += __popc(__ballot_sync(0xffffffffu, i < n && pred(i)));
  }
  return total;
}

}  // namespace
}  // namespace gtron::cuda

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

// Rows [row0, row0 + ROWS) of a head's [len, HS] slice into a shared tile (load_tile's
// contract). kPanels: as HS/64 panels of [ROWS, 64], each 128-byte swizzled, panel p (columns
// 64p ..) at element p·ROWS·64: the operand layout of the wgmma kernels (Note [wgmma operands]
// in model/cuda/wgmma.cuh), which describe a panel, not a wider row. For HS = 64 both layouts
// are the same tile.
template <int HS, int ROWS, bool kPanels>
__device__ __forceinline__ void load_rows(bf16* tile, const bf16* g, int64_t ld, int row0,
                                          int len) {
  if constexpr (kPanels) {
#pragma unroll
    for (int p = 0; p < HS / 64; ++p) {
      load_tile<64, ROWS, kThreadsFa>(tile + p * ROWS * 64, g + p * 64, ld, row0, len);
    }
  } else {
    load_tile<HS, ROWS, kThreadsFa>(tile, g, ld, row0, len);
  }
}

// The key/value double buffer of a CTA walking key tiles first .. n_tiles − 1: issues tile
// j + 1's loads into the other buffer (when there is one), then waits until tile j's have landed
// and every thread sees them (with kAsync, wgmma's async proxy too, and tiles in panels). Tile j
// sits in buffer (j − first) % 2; `first` is 0 but under document masking (Note [document masking
// in the flash kernels]). Called by all threads.
template <int HS, int kN, bool kAsync = false>
__device__ __forceinline__ void next_kv_tile(bf16* sK, bf16* sV, const bf16* gk, const bf16* gv,
                                             int64_t ld, int j, int n_tiles, int len,
                                             int first = 0) {
  if (j + 1 < n_tiles) {
    const int nb = (j + 1 - first) & 1;
    load_rows<HS, kN, kAsync>(sK + nb * kN * HS, gk, ld, (j + 1) * kN, len);
    load_rows<HS, kN, kAsync>(sV + nb * kN * HS, gv, ld, (j + 1) * kN, len);
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
// kSum: cs[dt][j] also gets the lane's two stored values (as rounded) of its column dt·8 +
// (lane & 3)·2 + j (Note [qkv bias partials]).
template <int HS, bool kSum>
__device__ __forceinline__ void store_rows(const float (&acc)[HS / 8][4], bf16* dst, int64_t ld,
                                           int r0, int len, int lane, const float (&mul)[2],
                                           bool add, float (&cs)[HS / 8][2]) {
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
      const __nv_bfloat162 r = __floats2bfloat162_rn(x, y);
      *o = r;
      if constexpr (kSum) {
        const float2 stored = __bfloat1622float2(r);
        cs[dt][0] += stored.x;
        cs[dt][1] += stored.y;
      }
    }
  }
}

template <int HS>
__device__ __forceinline__ void store_rows(const float (&acc)[HS / 8][4], bf16* dst, int64_t ld,
                                           int r0, int len, int lane, const float (&mul)[2],
                                           bool add) {
  float unused[HS / 8][2];
  store_rows<HS, false>(acc, dst, ld, r0, len, lane, mul, add, unused);
}

// Note [qkv bias partials]
// With FlashBackwardArgs::col_partial set, each backward CTA also writes the column sums of the
// 64 rows it stored (dQ, dK or dV of one head, the values as rounded to bf16) into
// col_partial[chunk·3C + column], chunk = b·⌈T/64⌉ + the CTA's row tile: fixed-row-chunk partials
// of Σ_rows dqkv, the bias gradient of the linear that made qkv, which that linear finishes
// instead of reading dqkv once more (Note [gradient column partials] in model/autograd.h). The
// order is fixed: a lane's two rows, a butterfly over the 8 lanes that share a column pair, then
// the 4 warps in order. flash_column_chunks(B, T) chunks of 3C floats.
//
// part[c] = the sum of column c (c < HS) over 4 warps' rows, from every lane's cs
// (store_rows<HS, true>); red: 4·HS floats of shared memory. Every thread of the 4 warps calls it,
// `tid` its index among their 128 threads; sync() is a barrier over them (__syncthreads in the
// 128-thread kernels, a named barrier for a warpgroup of a larger CTA).
template <int HS, typename Sync>
__device__ __forceinline__ void write_column_partials(const float (&cs)[HS / 8][2], int lane,
                                                      int warp, float* red, float* part, int tid,
                                                      Sync sync) {
#pragma unroll
  for (int dt = 0; dt < HS / 8; ++dt) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      float v = cs[dt][j];
      v += __shfl_xor_sync(0xffffffffu, v, 4);
      v += __shfl_xor_sync(0xffffffffu, v, 8);
      v += __shfl_xor_sync(0xffffffffu, v, 16);
      if (lane < 4) red[warp * HS + dt * 8 + lane * 2 + j] = v;
    }
  }
  sync();
  for (int c = tid; c < HS; c += kThreadsFa)
    part[c] = ((red[c] + red[HS + c]) + red[2 * HS + c]) + red[3 * HS + c];
  sync();  // red is reused by the next call
}

// Note [RoPE in the flash backward]
// The llama family rotates q and k (Note [rotate-half RoPE] in model/ops/rope.h) right before the
// attention, whose backward then yields the gradient of the rotated q and k. Composed, a rope
// backward pass reads that gradient back and rotates it by −angle. Here the key and query kernels
// rotate their dK and dQ accumulators before the store instead: in the accumulator layout a
// lane's column c = dt·8 + (lane & 3)·2 + j and its rotation partner c + HS/2 sit in the same
// lane, in acc[dt] and acc[dt + HS/16], rows lane/4 and lane/4 + 8, so the rotation is register
// arithmetic; angle = float(pos0 + row)·inv_freq[c] and fp32 sincosf as the rope kernel computes
// it. One pass over [B·T, (NH + 2·NKV)·HS] gradients less per block, and no rotated-gradient
// buffer.
template <int HS>
__device__ __forceinline__ void unrotate_rows(float (&acc)[HS / 8][4], const float* inv_freq,
                                              int64_t pos0, int r0, int lane) {
#pragma unroll
  for (int dt = 0; dt < HS / 16; ++dt) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const float f = inv_freq[dt * 8 + (lane & 3) * 2 + j];
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        const float pos = static_cast<float>(pos0 + r0 + (lane >> 2) + rr * 8);
        float sn, cs;
        sincosf(pos * f, &sn, &cs);
        const float lo = acc[dt][2 * rr + j], hi = acc[dt + HS / 16][2 * rr + j];
        acc[dt][2 * rr + j] = lo * cs + hi * sn;
        acc[dt + HS / 16][2 * rr + j] = hi * cs - lo * sn;
      }
    }
  }
}

// Stores acc like store_rows and, when a.col_partial is set, writes the column partials of the
// stored rows at qkv column `col0` (Note [qkv bias partials]); `tile`: the 64-row tile that the 4
// calling warps store. `rotated`: acc is dQ or dK, rotated back first in kernels built with kRope
// (those launched when a.rope_inv_freq is set; the others carry no rotation code and its
// registers). `tid` and `sync` as write_column_partials takes them.
template <int HS, bool kRope, typename Sync>
__device__ __forceinline__ void store_grad_rows(const float (&acc_in)[HS / 8][4], bf16* dst,
                                                const FlashBackwardArgs& a, int b, int tile,
                                                int64_t col0, int r0, int lane, int warp,
                                                const float (&mul)[2], float* red, bool rotated,
                                                int tid, Sync sync) {
  float acc[HS / 8][4];
#pragma unroll
  for (int dt = 0; dt < HS / 8; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[dt][e] = acc_in[dt][e];
  if constexpr (kRope) {
    if (rotated) unrotate_rows<HS>(acc, a.rope_inv_freq, a.rope_pos0, r0, lane);
  }
  if (a.col_partial == nullptr) {
    store_rows<HS>(acc, dst, a.qkv_ld, r0, a.T, lane, mul, a.accumulate);
    return;
  }
  float cs[HS / 8][2] = {};
  store_rows<HS, true>(acc, dst, a.qkv_ld, r0, a.T, lane, mul, a.accumulate, cs);
  const int64_t chunk = static_cast<int64_t>(b) * ((a.T + kRows - 1) / kRows) + tile;
  const int64_t width = static_cast<int64_t>(a.NH + 2 * a.NKV) * HS;
  write_column_partials<HS>(cs, lane, warp, red, a.col_partial + chunk * width + col0, tid, sync);
}

// store_grad_rows for a CTA of 4 warps (every thread calls it).
template <int HS, bool kRope>
__device__ __forceinline__ void store_grad_rows(const float (&acc_in)[HS / 8][4], bf16* dst,
                                                const FlashBackwardArgs& a, int b, int tile,
                                                int64_t col0, int r0, int lane, int warp,
                                                const float (&mul)[2], float* red, bool rotated) {
  store_grad_rows<HS, kRope>(acc_in, dst, a, b, tile, col0, r0, lane, warp, mul, red, rotated,
                             static_cast<int>(threadIdx.x), [] { __syncthreads(); });
}

// Note [document masking in the flash kernels]
// With FlashForwardArgs::seg / FlashBackwardArgs::seg set (Note [document masking] in
// model/ops/segments.h; Tq = Tk = T), query i sees key j <= i only when seg[j] == seg[i]. The
// segments of a row never decrease, which keeps the mask cheap; the kernels built with kSeg carry
// it, the others are the unmasked kernels unchanged (their walks start at the constant 0):
// - Tile skipping. The forward and the query kernel start their walk at key tile j0, the first
//   whose last key is in the segment of the CTA's first query or later: every key of an earlier
//   tile lies in an earlier segment than every query of the CTA. The key kernel stops each query
//   head's walk after the last query tile whose first query is in the segment of the CTA's last
//   key or earlier: every query of a later tile lies in a later segment than every key of the CTA.
//   Both counts come from one __syncthreads_count per 128 tiles (cta_count: each thread tests one
//   tile), not from a chain of dependent loads. The causal skip stays as it is. The walk from j0
//   keeps tile j in buffer (j − j0) % 2 (next_kv_tile's `first`).
// - Element masks. A tile that the causal test leaves whole is masked by segment only when its
//   keys and the warp's queries are not all in one segment, and since segments never decrease
//   one comparison tells: seg[first key of the tile] != seg[last query of the warp] (forward,
//   query kernel), seg[first key of the warp] != seg[last query of the tile] (key kernel).
//   Masked entries get score −∞ (forward) or probability 0 (backward), as the causal mask's do.
//   A row always sees itself, so no row's softmax sum is empty; a row whose first visited tile
//   is all masked for it keeps m = −∞ through the update, as a causal row past the diagonal does.
// - Cost in registers (ptxas, sm_90a, 2026-12): the kSeg wgmma kernels take 2 to 6 more than
//   their unmasked twins (forward 110 / 154 at head size 64 / 128, query kernel 132 / 164, key
//   kernel 172 / 241), no spills; at head size 64 the query kernel then fits three CTAs an SM
//   instead of four. The mma.sync key kernel at head size 128 (the pre-Hopper fallback) spills
//   180 bytes against 40. The PTX of the unmasked kernels is the same as before the mask existed.

// The segment ids of one batch row (kSeg kernels): `row` (seg + b·seg_batch) and, for each of a
// lane's two accumulator rows, the segment of its query (forward, query kernel) or key (key
// kernel); indices past T read the last position's.
struct SegRows {
  const int32_t* row = nullptr;
  int32_t own[2] = {0, 0};
  __device__ __forceinline__ int32_t at(int i, int T) const { return row[min(i, T - 1)]; }
};

// The number of i in [0, n) for which pred(i) holds. Every thread of the CTA (kCtaThreads of
// them) calls it (one barrier per kCtaThreads candidates).
template <int kCtaThreads = kThreadsFa, typename Pred>
__device__ __forceinline__ int cta_count(int n, Pred pred) {
  int total = 0;
  for (int base = 0; base < n; base += kCtaThreads) {
    const int i = base + static_cast<int>(threadIdx.x);
    total += __syncthreads_count(i < n && pred(i));
  }
  return total;
}

// The forward's and query kernel's first key tile (of kN keys) not wholly before the segment of
// query q0, among n_tiles (Note [document masking in the flash kernels]). Every thread of the CTA
// (kCtaThreads of them) calls it.
template <int kN, int kCtaThreads = kThreadsFa>
__device__ __forceinline__ int first_key_tile(const SegRows& sr, int q0, int n_tiles, int T) {
  const int32_t first = sr.at(q0, T);
  return cta_count<kCtaThreads>(n_tiles, [&](int j) { return sr.at(j * kN + kN - 1, T) < first; });
}

// The causal mask and the online-softmax update of one 16-row accumulator tile (rows row_base
// and row_base + 8 of this lane), turning s into P in place and rescaling o.
// kSeg: also the document mask, `sr` holding the rows' segments (Note [document masking in the
// flash kernels]).
template <int HS, int NT, bool kSeg = false>
__device__ __forceinline__ void online_softmax(float (&s)[NT][4], float (&o)[HS / 8][4],
                                               float (&m)[2], float (&l)[2], int row_base, int k0,
                                               bool masked, const FlashForwardArgs& a, int lane,
                                               float sl2, const SegRows& sr = SegRows()) {
  const int off = a.Tk - a.Tq;
  if (masked) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = k0 + nt * 8 + (lane & 3) * 2 + (e & 1);
        const int row = row_base + (e >> 1) * 8;
        if (key > row + off || key >= a.Tk) s[nt][e] = -INFINITY;
        if constexpr (kSeg) {
          if (key < a.Tk && sr.row[key] != sr.own[e >> 1]) s[nt][e] = -INFINITY;
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

// Note [grouped-query flash attention]
// With NKV < NH k/v heads (GQA; NKV = 1 is multi-query attention), query head h reads k/v head
// hk = h / G, G = NH / NKV, in place: the forward and the query kernel just point their K and V
// tiles at head hk. The key kernel owns the gradient of one k/v head: a CTA takes 64 keys of
// (b, hk) and walks, one after the other, the query tiles of each of the G query heads that read
// it (heads hk·G .. hk·G + G − 1, in that order, each from its diagonal tile on), accumulating
// dK and dV of all G in the same registers. So a shared head's gradient is summed in a fixed
// order without atomics or a separate reduction (deterministic), and K and V are loaded once for
// the G heads. The grid has B·NKV·⌈T/64⌉ key CTAs, each G times the work of a GPT-2 one.

// Column offsets of the parts of the packed rows [q (NH heads) | k (NKV) | v (NKV)].
__device__ __forceinline__ int64_t k_column(const FlashBackwardArgs& a, int hk) {
  return static_cast<int64_t>(a.NH + hk) * a.HS;
}
__device__ __forceinline__ int64_t v_column(const FlashBackwardArgs& a, int hk) {
  return static_cast<int64_t>(a.NH + a.NKV + hk) * a.HS;
}

// The slices that a backward CTA reads for batch b and query head h: the q columns of head h and
// the k, v columns of its k/v head hk of the packed qkv rows, head h's dO columns, and its lse and
// Δ rows (Note [grouped-query flash attention]).
template <int HS>
struct BackwardHead {
  int b, h, hk;
  const bf16 *q, *k, *v, *dout;
  const float *lse, *delta;
  __device__ __forceinline__ BackwardHead(const FlashBackwardArgs& a, const float* d, int b_,
                                          int h_)
      : b(b_), h(h_), hk(h_ / (a.NH / a.NKV)) {
    const bf16* row = static_cast<const bf16*>(a.qkv) + b * a.qkv_batch;
    q = row + h * HS;
    k = row + k_column(a, hk);
    v = row + v_column(a, hk);
    dout = static_cast<const bf16*>(a.dout) + b * a.o_batch + h * HS;
    const int64_t bh = static_cast<int64_t>(b) * a.NH + h;
    lse = a.lse + bh * a.T;
    delta = d + bh * a.T;
  }
};

// The query kernel's (b, h) = blockIdx.y.
template <int HS>
__device__ __forceinline__ BackwardHead<HS> query_cta_head(const FlashBackwardArgs& a,
                                                           const float* d) {
  return BackwardHead<HS>(a, d, blockIdx.y / a.NH, blockIdx.y % a.NH);
}

// The key kernel's walk (Note [grouped-query flash attention]): step i of n = G·per takes query
// tile qt0 + i % per of the group's query head i / per, per = n_qt − qt0 tiles each. blockIdx.y
// is (b, hk).
struct KeyWalk {
  int b, hk, group, qt0, per, n;
  __device__ __forceinline__ KeyWalk(const FlashBackwardArgs& a, int k0, int kq) {
    b = blockIdx.y / a.NKV;
    hk = blockIdx.y % a.NKV;
    group = a.NH / a.NKV;
    qt0 = k0 / kq;
    per = (a.T + kq - 1) / kq - qt0;
    n = group * per;
  }
  __device__ __forceinline__ int head(int i) const { return hk * group + i / per; }
  __device__ __forceinline__ int tile(int i) const { return qt0 + i % per; }
  // Document masking: each head's walk ends after the query tiles of the segment of the CTA's
  // last key, whose segment is `last` (Note [document masking in the flash kernels]). Every
  // thread of the CTA (kCtaThreads) calls it. The diagonal tile always stays (its first query
  // precedes the keys).
  template <int kQ, int kCtaThreads = kThreadsFa>
  __device__ __forceinline__ void keep_segment(const SegRows& sr, int32_t last, int T) {
    per = cta_count<kCtaThreads>(per, [&](int i) { return sr.at((qt0 + i) * kQ, T) <= last; });
    n = group * per;
  }
};

// The key kernel's query tile qt into buffer `buf`: Q and dO rows by cp.async (the caller commits;
// kPanels as load_rows) and the tile's log2-unit log-sum-exps and Δ by plain stores (0 past T).
template <int HS, int kQ, bool kPanels = false>
__device__ __forceinline__ void load_query_tile(bf16* sQ, bf16* sO, float* sL, float* sD,
                                                const bf16* gq, const bf16* gdo, int64_t ld,
                                                int64_t o_ld, const float* lse, const float* dl,
                                                int qt, int buf, int T) {
  load_rows<HS, kQ, kPanels>(sQ + buf * kQ * HS, gq, ld, qt * kQ, T);
  load_rows<HS, kQ, kPanels>(sO + buf * kQ * HS, gdo, o_ld, qt * kQ, T);
  for (int i = threadIdx.x; i < kQ; i += kThreadsFa) {
    const int q = qt * kQ + i;
    sL[buf * kQ + i] = q < T ? lse[q] * kLog2e : 0.0f;
    sD[buf * kQ + i] = q < T ? dl[q] : 0.0f;
  }
}

// The key kernel's elementwise step on one tile: p (Sᵀ: this lane's keys key_base, key_base + 8
// by the tile's queries from qs0) becomes Pᵀ and ds (dPᵀ) becomes dSᵀ = Pᵀ ⊙ (dPᵀ − Δ). L and D
// are the tile's log-sum-exps (log2 units) and Δ. Only the diagonal and tail tiles are masked.
// kSeg: also the document mask, `sr` holding the keys' segments.
template <int NT, bool kSeg = false>
__device__ __forceinline__ void key_tile_grads(float (&p)[NT][4], float (&ds)[NT][4],
                                               const float* L, const float* D, float sl2, int qs0,
                                               int key_base, bool masked, int T, int lane,
                                               const SegRows& sr = SegRows()) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int qi = nt * 8 + (lane & 3) * 2;
    const float2 lq = *reinterpret_cast<const float2*>(L + qi);
    const float2 dq = *reinterpret_cast<const float2*>(D + qi);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float pe = fast_exp2(p[nt][e] * sl2 - ((e & 1) ? lq.y : lq.x));
      if (masked) {
        const int q = qs0 + qi + (e & 1);
        const int key = key_base + (e >> 1) * 8;
        if (q < key || q >= T || key >= T || (kSeg && sr.row[q] != sr.own[e >> 1])) pe = 0.0f;
      }
      p[nt][e] = pe;
      ds[nt][e] = pe * (ds[nt][e] - ((e & 1) ? dq.y : dq.x));
    }
  }
}

// The query kernel's elementwise step on one tile: with p = S (this lane's rows row_base,
// row_base + 8 by the keys from k0), ds (dP) becomes dS = P ⊙ (dP − Δ). L and D are the rows'
// log-sum-exps (log2 units) and Δ.
// kSeg: also the document mask, `sr` holding the rows' segments.
template <int NT, bool kSeg = false>
__device__ __forceinline__ void query_tile_grads(const float (&p)[NT][4], float (&ds)[NT][4],
                                                 const float (&L)[2], const float (&D)[2],
                                                 float sl2, int k0, int row_base, bool masked,
                                                 int T, int lane, const SegRows& sr = SegRows()) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float pe = fast_exp2(p[nt][e] * sl2 - L[e >> 1]);
      if (masked) {
        const int key = k0 + nt * 8 + (lane & 3) * 2 + (e & 1);
        const int row = row_base + (e >> 1) * 8;
        if (key > row || key >= T || (kSeg && sr.row[key] != sr.own[e >> 1])) pe = 0.0f;
      }
      ds[nt][e] = pe * (ds[nt][e] - D[e >> 1]);
    }
  }
}

}  // namespace
}  // namespace gtron::cuda

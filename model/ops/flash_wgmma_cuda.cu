// Flash attention for head sizes 64 and 128 with warpgroup MMA (wgmma), built for sm_90a only: the
// kernels of flash_attention_cuda.cu (Note [flash attention tiling]) with every tile product
// issued by the CTA's one warpgroup instead of per warp. Contract in model/ops/flash_wgmma.h.
//
// Note [flash attention on wgmma]
// The CTA shape is unchanged: 4 warps, 64 own rows, 16 per warp, so a row's softmax statistics
// stay within a quad and the masks, the online softmax and the stores are the shared code of
// flash_common.cuh (Note [wgmma operands]: the accumulators have the mma.sync layout).
// What changes is where the operands come from:
// - mma.sync makes every warp read the whole B tile from shared memory through ldmatrix, so a
//   CTA reads each K, V, Q or dO tile four times per product; the backward's key kernel read
//   128 KB of shared memory per 64×64 step for 1 MFLOP, more time than its tensor-core work.
//   A wgmma reads B once for the warpgroup, straight from the swizzled tile.
// - The operands that stay (Q in the forward and the query kernel, K and V in the key kernel)
//   are read from shared memory by descriptor too, which frees the registers their fragments
//   held.
// - P and dS go from accumulators to the A operand in registers, as before.
// Waits, measured on the H200 (GPT-2 124M, 12 layers, ms per step):
// - Forward: tile j's P·V stays in flight while tile j + 1's scores are issued (the wait for the
//   scores retires it), P's operands held in registers until then: 1.39 against 1.44 with a
//   wait after each batch.
// - Backward: the same overlap of the dV, dK (or dQ) products with the next tile held 32 (16)
//   more registers and cost a CTA per SM: key kernel 2.50 against 2.22, query kernel 1.61
//   against 1.53. So there each batch is waited for before its results are used, and the other
//   CTAs on the SM fill the wait.
// - A loop that may run zero times lets a path reach the final wait with the accumulators set by
//   ordinary instructions, and ptxas then serializes every wgmma of the kernel: the loops are
//   do-whiles over counts that are at least 1.
//
// Note [Δ in the query kernel]
// Δ = rowsum(dO ⊙ O) is not a pre-pass here: the query kernel, which holds its 64 rows of dO
// anyway, loads their O too (into the second value buffer, before tile 1 needs it), forms Δ,
// uses it and stores it; the key kernel runs after it and reads Δ of every query tile. That drops
// a launch and a read of dO. Its fp32 sum runs in another order than flash_delta_kernel's.
//
// Results equal the mma.sync kernels' within fp32 summation order (the tensor cores add the
// k-slices in their own order), and two runs are bit-identical.
#include <cuda_bf16.h>

#include <algorithm>
#include <array>
#include <atomic>

#include "model/cuda/kernel_util.cuh"
#include "model/cuda/mma_tile.cuh"
#include "model/cuda/wgmma.cuh"
#include "model/ops/flash_common.cuh"
#include "model/ops/flash_wgmma.h"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "flash_wgmma_cuda.cu is built for sm_90a only (bazel/cuda.bzl SM90A)"
#endif

namespace gtron::cuda {

namespace {

constexpr int kTile = 64;        // keys (forward, query kernel) or queries (key kernel) per step
constexpr int kAlignPad = 1024;  // wgmma's 128-byte swizzle wants 1024-byte aligned tiles

// Elements of a [64, HS] tile (HS/64 panels of [64, 64]: load_rows<HS, 64, true>).
template <int HS>
__host__ __device__ constexpr int tile_elems() {
  return kTile * HS;
}

// Note [wgmma at head size 128]
// A wgmma operand in shared memory is a 128-byte swizzled tile of 64 bf16 columns, so a
// [64, 128] tile is held as two [64, 64] panels (load_rows). S = Q·Kᵀ reduces over both panels
// (8 products instead of 4) into one accumulator; a product with a [64, 128] B (P·V, Pᵀ·dO,
// dSᵀ·Q, dS·K) is two m64n64 products, one per panel, into the two 64-column halves of the
// [64, 128] accumulator, whose registers are laid out as two 64-column accumulators side by side
// (acc[dt], dt < 8: columns 8dt.., then dt >= 8: 64 + ..). Everything downstream (softmax, masks,
// stores) is the head-size-generic code of flash_common.cuh. The key kernel then holds dK and dV
// of 64 keys × 128 columns in registers, 128 fp32 a thread.

// d (+)= A·Bᵀ over HS columns of two [64, HS] panel tiles (scores). The caller fences, commits
// and waits.
template <int HS>
__device__ __forceinline__ void abt_hs(float (&d)[8][4], const bf16* a, const bf16* b,
                                       bool accumulate) {
#pragma unroll
  for (int p = 0; p < HS / 64; ++p) {
    wg::abt_ss(d, a + p * kTile * 64, b + p * kTile * 64, accumulate || p > 0);
  }
}

// d[64, HS] += A·B, A as to_a's operands over a reduced length of 64 and B a [64 (k), HS (n)]
// panel tile (MN-major): one 64-column product per panel.
template <int HS, int KT>
__device__ __forceinline__ void pv_hs(float (&d)[HS / 8][4], const uint32_t (&a)[KT][4],
                                      const bf16* b) {
#pragma unroll
  for (int p = 0; p < HS / 64; ++p) {
    wg::pv_rs(*reinterpret_cast<float(*)[8][4]>(&d[p * 8]), a, b + p * kTile * 64);
  }
}

// The first 1024-byte aligned address (in the shared window) of the dynamic shared memory.
__device__ __forceinline__ bf16* aligned_tiles(unsigned char* raw) {
  const uint32_t pad = (kAlignPad - (smem_u32(raw) & (kAlignPad - 1))) & (kAlignPad - 1);
  return reinterpret_cast<bf16*>(raw + pad);
}

// Waits for this thread's cp.async groups but `pending`, makes the tiles visible to wgmma, and
// synchronizes the CTA.
template <int kPending>
__device__ __forceinline__ void tiles_landed() {
  cp_async_wait<kPending>();
  async_proxy_fence();
  __syncthreads();
}

// Key tile j (rows j·64 ..) into the forward's one key buffer and value tile j into value buffer
// (j − first) % 2, as one cp.async group (Note [one key buffer in the forward]; `first`: the
// walk's first tile, Note [document masking in the flash kernels]).
template <int HS>
__device__ __forceinline__ void load_kv(bf16* sK, bf16* sV, const bf16* gk, const bf16* gv,
                                        int64_t ld, int j, int len, int first = 0) {
  load_rows<HS, kTile, true>(sK, gk, ld, j * kTile, len);
  load_rows<HS, kTile, true>(sV + ((j - first) & 1) * tile_elems<HS>(), gv, ld, j * kTile, len);
  cp_async_commit();
}

// One warpgroup and 64 queries per CTA, keys in tiles of 64. Measured on the H200 (GPT-2 124M):
// two warpgroups sharing the key/value tiles (128 queries, 127 registers, 2 CTAs per SM) 1.45 ms
// per step against 1.39 for one (117 registers, 4 CTAs per SM); key tiles of 128 (m64n128 score
// products, 184 registers, 2 CTAs per SM) 1.59 against 1.40 for 64.
//
// Note [one key buffer in the forward]
// Tile j's keys are read by one product, S = Q·Kᵀ, whose wait comes first in iteration j; the
// barrier after it is where tile j + 1's loads are issued anyway. So the keys need no second
// buffer: tile j + 1's go where tile j's were, while its values take the other value buffer (P·V
// of tile j still reads this one). Four tiles of shared memory instead of five: at head size 128
// 65 KB a CTA, three CTAs an SM (146 registers allow three) instead of two. Measured on an H100
// (2026-12-06, Qwen3-0.6B shape): the forward 105.4 µs a call against 114.0 (ncu), the step
// 65.17 / 65.17 ms against 65.38 / 65.61 alternating, the same loss bits. At head size 64
// registers keep four CTAs an SM either way (five would need 102: ptxas then spills and
// serializes the wgmmas).
template <int HS>
constexpr int fwd_smem() {  // Q, K, V[2]
  return 4 * tile_elems<HS>() * 2 + kAlignPad;
}

// kSeg: with document masking (Note [document masking in the flash kernels]).
template <int HS, bool kSeg>
__global__ void __launch_bounds__(kThreadsFa) wg_forward_kernel(FlashForwardArgs a) {
  constexpr int NT = kTile / 8;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* sQ = aligned_tiles(smem_raw);
  bf16* sK = sQ + tile_elems<HS>();
  bf16* sV = sK + tile_elems<HS>();

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int qb = gridDim.x - 1 - blockIdx.x;  // the longest rows first
  const int b = blockIdx.y / a.NH, h = blockIdx.y % a.NH;
  const int hk = h / (a.NH / a.NKV);  // Note [grouped-query flash attention]
  const int q0 = qb * kRows;
  const int off = a.Tk - a.Tq;
  const bf16* gq = static_cast<const bf16*>(a.q) + b * a.q_batch + h * HS;
  const bf16* gk = static_cast<const bf16*>(a.k) + b * a.kv_batch + hk * HS;
  const bf16* gv = static_cast<const bf16*>(a.v) + b * a.kv_batch + hk * HS;

  load_rows<HS, kRows, true>(sQ, gq, a.q_ld, q0, a.Tq);
  const int kv_end = min(a.Tk, q0 + kRows + off);
  const int n_tiles = (kv_end + kTile - 1) / kTile;
  int j0 = 0;  // the first key tile (Note [document masking in the flash kernels])
  SegRows sr;
  if constexpr (kSeg) {
    sr.row = a.seg + b * a.seg_batch;
    j0 = first_key_tile<kTile>(sr, q0, n_tiles, a.Tq);
  }
  load_rows<HS, kTile, true>(sK, gk, a.kv_ld, j0 * kTile, a.Tk);
  load_rows<HS, kTile, true>(sV, gv, a.kv_ld, j0 * kTile, a.Tk);
  cp_async_commit();

  float o[HS / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const float sl2 = a.scale * kLog2e;
  const int warp_row0 = q0 + warp * 16;
  int32_t last_seg = 0;  // of the warp's last query
  if constexpr (kSeg) {
    sr.own[0] = sr.at(warp_row0 + (lane >> 2), a.Tq);
    sr.own[1] = sr.at(warp_row0 + (lane >> 2) + 8, a.Tq);
    last_seg = sr.at(warp_row0 + 15, a.Tq);
  }
  uint32_t pa[kTile / 16][4] = {};  // P's operands: the last P·V reads them until the next wait

  // n_tiles − j0 >= 1 (Tk >= Tq >= 1; j0 is at most the tile of query q0): a do-while, so no path
  // reaches the final wait without a product in flight (ptxas serializes every wgmma when one
  // does; see Note [flash attention on wgmma]).
  int j = j0;
  do {
    tiles_landed<0>();
    const bf16* vt = sV + ((j - j0) & 1) * tile_elems<HS>();
    float s[NT][4];
    wg::fence();
    abt_hs<HS>(s, sQ, sK, false);
    wg::commit();
    wg::wait<0>();  // also retires the previous tile's P·V
    wg::hold(s);
    wg::hold(o);
    wg::hold(pa);
    __syncthreads();  // no product reads K (tile j's scores are in) or tile j − 1's values
    if (j + 1 < n_tiles) load_kv<HS>(sK, sV, gk, gv, a.kv_ld, j + 1, a.Tk, j0);
    const int k0 = j * kTile;
    bool masked = k0 + kTile - 1 > warp_row0 + off || k0 + kTile > a.Tk;
    if constexpr (kSeg) masked = masked || sr.row[k0] != last_seg;
    online_softmax<HS, NT, kSeg>(s, o, m, l, warp_row0 + (lane >> 2), k0, masked, a, lane, sl2, sr);
    wg::to_a(s, pa);
    wg::fence();
    pv_hs<HS>(o, pa, vt);
    wg::commit();  // runs while the next tile's scores are issued
  } while (++j < n_tiles);
  wg::wait<0>();
  wg::hold(o);
  wg::hold(pa);

  float inv[2];
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const float lt = quad_sum(l[rr]);
    inv[rr] = 1.0f / lt;
    const int row = warp_row0 + (lane >> 2) + rr * 8;
    if ((lane & 3) == 0 && row < a.Tq) {
      a.lse[static_cast<int64_t>(blockIdx.y) * a.Tq + row] = (m[rr] + log2f(lt)) * kLn2;
    }
  }
  bf16* go = static_cast<bf16*>(a.o) + b * a.o_batch + h * HS;
  store_rows<HS>(o, go, a.o_ld, warp_row0, a.Tq, lane, inv, false);
}

template <int HS>
constexpr int bwd_kv_smem() {  // K, V, Q[2], dO[2], lse[2], Δ[2]
  return 6 * tile_elems<HS>() * 2 + 4 * kTile * 4 + kAlignPad;
}

// dK and dV of 64 keys of one (b, k/v head), over the query tiles from the diagonal on of each
// query head that reads it (Note [grouped-query flash attention]).
template <int HS, bool kRope, bool kSeg>
__global__ void __launch_bounds__(kThreadsFa)
    wg_backward_kv_kernel(FlashBackwardArgs a, const float* __restrict__ delta) {
  constexpr int NT = kTile / 8;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* sK = aligned_tiles(smem_raw);
  bf16* sV = sK + tile_elems<HS>();
  bf16* sQ = sV + tile_elems<HS>();
  bf16* sO = sQ + 2 * tile_elems<HS>();  // dO tiles
  float* sL = reinterpret_cast<float*>(sO + 2 * tile_elems<HS>());
  float* sD = sL + 2 * kTile;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int k0 = blockIdx.x * kRows;  // key tile 0 sees every query: the longest first
  KeyWalk walk(a, k0, kTile);
  const int b = walk.b, hk = walk.hk;
  const int64_t ld = a.qkv_ld;
  const bf16* row = static_cast<const bf16*>(a.qkv) + b * a.qkv_batch;

  auto load_q_tile = [&](int i, int buf) {
    const BackwardHead<HS> head(a, delta, b, walk.head(i));
    load_query_tile<HS, kTile, true>(sQ, sO, sL, sD, head.q, head.dout, ld, a.o_ld, head.lse,
                                     head.delta, walk.tile(i), buf, a.T);
  };

  load_rows<HS, kRows, true>(sK, row + k_column(a, hk), ld, k0, a.T);
  load_rows<HS, kRows, true>(sV, row + v_column(a, hk), ld, k0, a.T);
  load_q_tile(0, 0);
  cp_async_commit();

  float dk[HS / 8][4] = {}, dv[HS / 8][4] = {};
  const float sl2 = a.scale * kLog2e;
  const int key_base = k0 + warp * 16 + (lane >> 2);
  // The first query tile loads the same whatever the walk's length: it is cut here.
  SegRows sr;             // the keys' segments (Note [document masking in the flash kernels])
  int32_t first_seg = 0;  // of the warp's first key
  if constexpr (kSeg) {
    sr.row = a.seg + b * a.seg_batch;
    walk.keep_segment<kTile>(sr, sr.at(k0 + kRows - 1, a.T), a.T);
    sr.own[0] = sr.at(key_base, a.T);
    sr.own[1] = sr.at(key_base + 8, a.T);
    first_seg = sr.at(k0 + warp * 16, a.T);
  }

  for (int it = 0; it < walk.n; ++it) {
    const int buf = it & 1;
    if (it + 1 < walk.n) {
      load_q_tile(it + 1, buf ^ 1);
      cp_async_commit();
      tiles_landed<1>();
    } else {
      tiles_landed<0>();
    }
    const bf16* qtile = sQ + buf * tile_elems<HS>();
    const bf16* otile = sO + buf * tile_elems<HS>();
    const float* L = sL + buf * kTile;
    const float* D = sD + buf * kTile;

    float p[NT][4];   // Sᵀ, then Pᵀ: [64 keys, 64 queries]
    float ds[NT][4];  // dPᵀ, then dSᵀ
    wg::fence();
    abt_hs<HS>(p, sK, qtile, false);
    abt_hs<HS>(ds, sV, otile, false);
    wg::commit();
    wg::wait<0>();
    wg::hold(p);
    wg::hold(ds);
    const int qs0 = walk.tile(it) * kTile;
    bool masked = qs0 < k0 + kRows || qs0 + kTile > a.T || k0 + kRows > a.T;
    if constexpr (kSeg) masked = masked || sr.at(qs0 + kTile - 1, a.T) != first_seg;
    key_tile_grads<NT, kSeg>(p, ds, L, D, sl2, qs0, key_base, masked, a.T, lane, sr);
    uint32_t pa[4][4], dsa[4][4];
    wg::to_a(p, pa);
    wg::to_a(ds, dsa);
    wg::fence();
    pv_hs<HS>(dv, pa, otile);
    pv_hs<HS>(dk, dsa, qtile);
    wg::commit();
    wg::wait<0>();
    wg::hold(dv);
    wg::hold(dk);
    __syncthreads();
  }

  const float one[2] = {1.0f, 1.0f}, sc[2] = {a.scale, a.scale};
  bf16* dbase = static_cast<bf16*>(a.dqkv) + b * a.qkv_batch;
  __shared__ float red[4 * HS];  // Note [qkv bias partials]
  const int tile = static_cast<int>(blockIdx.x);
  const int64_t kc = k_column(a, hk), vc = v_column(a, hk);
  store_grad_rows<HS, kRope>(dk, dbase + kc, a, b, tile, kc, k0 + warp * 16, lane, warp, sc, red,
                             true);
  store_grad_rows<HS, kRope>(dv, dbase + vc, a, b, tile, vc, k0 + warp * 16, lane, warp, one, red,
                             false);
}

template <int HS>
constexpr int bwd_q_smem() {  // Q, dO, K[2], V[2]
  return 6 * tile_elems<HS>() * 2 + kAlignPad;
}

// dQ of 64 queries of one (b, h), over the key tiles (of its k/v head) up to the diagonal.
template <int HS, bool kRope, bool kSeg>
__global__ void __launch_bounds__(kThreadsFa)
    wg_backward_q_kernel(FlashBackwardArgs a, float* __restrict__ delta) {
  constexpr int NT = kTile / 8;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* sQ = aligned_tiles(smem_raw);
  bf16* sO = sQ + tile_elems<HS>();
  bf16* sK = sO + tile_elems<HS>();
  bf16* sV = sK + 2 * tile_elems<HS>();

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int qb = gridDim.x - 1 - blockIdx.x;
  const BackwardHead<HS> head = query_cta_head<HS>(a, delta);
  const int b = head.b, h = head.h;
  const int q0 = qb * kRows;
  const int64_t ld = a.qkv_ld;
  const bf16 *gq = head.q, *gk = head.k, *gv = head.v, *gdo = head.dout;

  int j0 = 0;  // the first key tile (Note [document masking in the flash kernels])
  SegRows sr;
  if constexpr (kSeg) {
    sr.row = a.seg + b * a.seg_batch;
    j0 = first_key_tile<kTile>(sr, q0, (min(a.T, q0 + kRows) + kTile - 1) / kTile, a.T);
  }
  // O's rows go to the second value buffer, which tile j0 + 1 overwrites only after Δ is formed.
  const bf16* go = static_cast<const bf16*>(a.o) + b * a.o_batch + h * HS;
  bf16* sOut = sV + tile_elems<HS>();
  load_rows<HS, kRows, true>(sQ, gq, ld, q0, a.T);
  load_rows<HS, kRows, true>(sO, gdo, a.o_ld, q0, a.T);
  load_rows<HS, kRows, true>(sOut, go, a.o_ld, q0, a.T);
  load_rows<HS, kTile, true>(sK, gk, ld, j0 * kTile, a.T);
  load_rows<HS, kTile, true>(sV, gv, ld, j0 * kTile, a.T);
  cp_async_commit();
  const int n_tiles = (min(a.T, q0 + kRows) + kTile - 1) / kTile;

  const int row_base = q0 + warp * 16 + (lane >> 2);
  int32_t last_seg = 0;  // of the warp's last query
  if constexpr (kSeg) {
    sr.own[0] = sr.at(row_base, a.T);
    sr.own[1] = sr.at(row_base + 8, a.T);
    last_seg = sr.at(q0 + warp * 16 + 15, a.T);
  }

  float L[2], D[2];
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int row = row_base + rr * 8;
    const int64_t i = static_cast<int64_t>(blockIdx.y) * a.T + row;
    L[rr] = row < a.T ? a.lse[i] * kLog2e : 0.0f;
  }
  cp_async_wait<0>();
  __syncthreads();
  // Δ = rowsum(dO ⊙ O) of this lane's two rows (Note [Δ in the query kernel]): the quad's lanes
  // take HS/4 columns each (16-byte chunks of the panels), then a quad sum. The key kernel,
  // launched next, reads it.
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int r = warp * 16 + (lane >> 2) + rr * 8;
    float sum = 0.0f;
#pragma unroll
    for (int cc = 0; cc < HS / 32; ++cc) {
      const int chunk = (HS / 32) * (lane & 3) + cc;  // of the row's HS/8 chunks
      const int at = (chunk / 8) * kTile * 64 + swz<64>(r, chunk % 8);
      float x[8], y[8];
      load_floats<8>(sO + at, x);
      load_floats<8>(sOut + at, y);
#pragma unroll
      for (int e = 0; e < 8; ++e) sum += x[e] * y[e];
    }
    sum = quad_sum(sum);
    const int row = q0 + r;
    D[rr] = row < a.T ? sum : 0.0f;
    if ((lane & 3) == 0 && row < a.T) delta[static_cast<int64_t>(blockIdx.y) * a.T + row] = sum;
  }
  __syncthreads();  // tile j0 + 1's loads overwrite O's rows
  float dq[HS / 8][4] = {};
  const float sl2 = a.scale * kLog2e;

  for (int j = j0; j < n_tiles; ++j) {
    next_kv_tile<HS, kTile, true>(sK, sV, gk, gv, ld, j, n_tiles, a.T, j0);
    const bf16* kt = sK + ((j - j0) & 1) * tile_elems<HS>();
    const bf16* vt = sV + ((j - j0) & 1) * tile_elems<HS>();
    float p[NT][4], ds[NT][4];
    wg::fence();
    abt_hs<HS>(p, sQ, kt, false);
    abt_hs<HS>(ds, sO, vt, false);
    wg::commit();
    wg::wait<0>();
    wg::hold(p);
    wg::hold(ds);
    const int k0 = j * kTile;
    bool masked = k0 + kTile > q0 || k0 + kTile > a.T;
    if constexpr (kSeg) masked = masked || sr.row[k0] != last_seg;
    query_tile_grads<NT, kSeg>(p, ds, L, D, sl2, k0, row_base, masked, a.T, lane, sr);
    uint32_t dsa[4][4];
    wg::to_a(ds, dsa);
    wg::fence();
    pv_hs<HS>(dq, dsa, kt);  // dQ += dS · K, K read with keys as the reduced index
    wg::commit();
    wg::wait<0>();
    wg::hold(dq);
    __syncthreads();
  }
  const float sc[2] = {a.scale, a.scale};
  bf16* dq_base = static_cast<bf16*>(a.dqkv) + b * a.qkv_batch + h * HS;
  __shared__ float red[4 * HS];  // Note [qkv bias partials]
  store_grad_rows<HS, kRope>(dq, dq_base, a, b, qb, h * HS, q0 + warp * 16, lane, warp, sc, red,
                             true);
}

template <typename Kernel>
void allow_smem(Kernel k, int bytes) {
  CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

}  // namespace

bool flash_wgmma_usable(int64_t HS) {
  if (HS != 64 && HS != 128) return false;
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  static std::array<std::atomic<int>, 64> verdict{};  // 0 unknown, 1 usable, 2 not
  if (device < 0 || device >= static_cast<int>(verdict.size())) return false;
  int v = verdict[device].load(std::memory_order_relaxed);
  if (v == 0) {
    int major = 0, minor = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    v = major == 9 && minor == 0 ? 1 : 2;
    verdict[device].store(v, std::memory_order_relaxed);
  }
  return v == 1;
}

namespace {

template <int HS, bool kSeg>
void forward_hs(const FlashForwardArgs& a, cudaStream_t st) {
  static const bool once = (allow_smem(wg_forward_kernel<HS, kSeg>, fwd_smem<HS>()), true);
  (void)once;
  const dim3 grid(static_cast<unsigned>(ceil_div<int64_t>(a.Tq, kRows)),
                  static_cast<unsigned>(a.B * a.NH));
  wg_forward_kernel<HS, kSeg><<<grid, kThreadsFa, fwd_smem<HS>(), st>>>(a);
  CUDA_CHECK_LAUNCH();
}

// The query kernel (dQ and Δ), then, with `keys`, the key kernel (dK, dV).
template <int HS, bool kRope, bool kSeg>
void backward_hs(const FlashBackwardArgs& a, float* delta, bool keys, cudaStream_t st) {
  static const bool once =
      (allow_smem(wg_backward_kv_kernel<HS, kRope, kSeg>, bwd_kv_smem<HS>()),
       allow_smem(wg_backward_q_kernel<HS, kRope, kSeg>, bwd_q_smem<HS>()), true);
  (void)once;
  const unsigned row_tiles = static_cast<unsigned>(ceil_div<int64_t>(a.T, kRows));
  const dim3 q_grid(row_tiles, static_cast<unsigned>(a.B * a.NH));
  wg_backward_q_kernel<HS, kRope, kSeg>
      <<<q_grid, kThreadsFa, bwd_q_smem<HS>(), st>>>(a, delta);  // Δ
  CUDA_CHECK_LAUNCH();
  if (!keys) return;
  const dim3 kv_grid(row_tiles, static_cast<unsigned>(a.B * a.NKV));
  wg_backward_kv_kernel<HS, kRope, kSeg><<<kv_grid, kThreadsFa, bwd_kv_smem<HS>(), st>>>(a, delta);
  CUDA_CHECK_LAUNCH();
}

template <int HS, bool kRope>
void backward_seg(const FlashBackwardArgs& a, float* delta, bool keys, cudaStream_t st) {
  if (a.seg != nullptr) {
    backward_hs<HS, kRope, true>(a, delta, keys, st);
  } else {
    backward_hs<HS, kRope, false>(a, delta, keys, st);
  }
}

void backward(const FlashBackwardArgs& a, float* delta, bool keys, cudaStream_t st) {
  const bool rope = a.rope_inv_freq != nullptr;
  if (a.HS == 64) {
    rope ? backward_seg<64, true>(a, delta, keys, st) : backward_seg<64, false>(a, delta, keys, st);
  } else {
    rope ? backward_seg<128, true>(a, delta, keys, st)
         : backward_seg<128, false>(a, delta, keys, st);
  }
}

}  // namespace

void flash_wgmma_forward(const FlashForwardArgs& a, void* stream) {
  const auto st = static_cast<cudaStream_t>(stream);
  const bool seg = a.seg != nullptr;
  if (a.HS == 64) {
    seg ? forward_hs<64, true>(a, st) : forward_hs<64, false>(a, st);
  } else {
    seg ? forward_hs<128, true>(a, st) : forward_hs<128, false>(a, st);
  }
}

void flash_wgmma_backward(const FlashBackwardArgs& a, float* delta, void* stream) {
  backward(a, delta, /*keys=*/true, static_cast<cudaStream_t>(stream));
}

void flash_wgmma_backward_query(const FlashBackwardArgs& a, float* delta, void* stream) {
  backward(a, delta, /*keys=*/false, static_cast<cudaStream_t>(stream));
}

}  // namespace gtron::cuda

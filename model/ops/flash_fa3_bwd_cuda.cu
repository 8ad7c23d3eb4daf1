// The causal flash-attention backward with FlashAttention-3's structure for its key half, bf16,
// head sizes 64 and 128, built for sm_90a only. Contract in model/ops/flash_fa3.h; the numerics
// (fp32 scores, P = 2^(S·scale·log2e − lse·log2e), P and dS rounded to bf16 for their products,
// dK scaled once at the store) are those of flash_wgmma_cuda.cu's key kernel.
//
// Note [FlashAttention-3 backward]
// A CTA of 384 threads owns kKeysCta = 128 keys of one (b, k/v head) and walks the query tiles
// that see them: for each query head of the group in turn (Note [grouped-query flash attention]),
// the tiles from the diagonal to the end, as the wgmma key kernel does (KeyWalk).
// - Warpgroup 0 is the producer: it lowers its registers to kProducerRegs, and its first warp
//   fills the ring. One lane issues the TMA loads: first K and V of the CTA's 128 keys (one
//   barrier, loaded once, resident for the whole walk), then per step i of the walk Q and dO (kQ
//   rows each, 4-d maps as the forward makes them) into slot i % kStages of a ring, one full and
//   one empty mbarrier per slot (Note [mbarrier phases] in model/cuda/tma.cuh). The warp's 32
//   lanes copy the step's lse (times log2 e) and Δ rows into the slot with plain loads and
//   stores, zeros past T, as flash_common.cuh's load_query_tile does for the wgmma key kernel,
//   and then arrive on the slot's full barrier (32 arrivals, lane 0's being the expect_tx; the
//   arrival releases the stores, the consumers' wait acquires them). Rows of T floats start
//   anywhere, so a 1-d TMA box over them would start at unaligned addresses; 2·kQ floats a step
//   are little work for the warp.
// - Warpgroups 1 and 2 are the consumers. Consumer w owns keys 64w .. 64w + 63 of the CTA; both
//   read the same slot, so every streamed byte serves 128 keys. Per step a consumer issues
//   Sᵀ = K_w·Qᵀ and dPᵀ = V_w·dOᵀ (m64 × kQ, both operands in shared memory, K-major), waits,
//   forms Pᵀ and dSᵀ = Pᵀ ⊙ (dPᵀ − Δ) in registers (with the causal mask only on the tiles that
//   cross the diagonal or T), converts them to A operands, issues dV += Pᵀ·dO and dK += dSᵀ·Q
//   (dO and Q MN-major, one m64n64 product per 64-column panel), waits, and releases the slot
//   (one arrival per consumer warp). dK and dV stay in registers until the walk ends. With
//   a.col_partial (GPT-2's qkv bias, Note [qkv bias partials]) each consumer's 64 keys are one
//   64-row chunk of partials, written as the wgmma key kernel writes them (store_grad_rows, the
//   warpgroup's named barrier in place of __syncthreads).
// - Skips: a tile whose every query precedes every key of a consumer (consumer 1's first tile of
//   each head at HS 128, where kQ = 64) and every tile of a consumer whose keys all lie past T
//   are not computed; the consumer still waits for the slot and releases it, since the empty
//   barrier counts both consumers' warps.
// - No ping-pong (the forward's Note [consumer ping-pong]): the backward's elementwise work
//   between the two product batches is short (two exponentials' worth of arithmetic per score,
//   no row reductions), and the two consumers, not in step, already fill each other's gaps.
// - Scheduling: grid (key blocks, B·NKV); key block 0 sees every query, so the longest CTAs start
//   first; consecutive CTAs are key blocks of one (b, hk), which stream the same Q and dO tiles
//   and so hit L2.
// dK and dV of a shared k/v head are summed over its query heads in head order inside one CTA:
// two runs are bit-identical (no atomics).
//
// Note [FlashAttention-3 backward tiles]
// Why 128 keys as two consumers of 64, not each consumer its own key block: a Q/dO tile in shared
// memory then feeds both warpgroups, which halves the ring's bytes, TMA traffic and L2 reads per
// FLOP; consumers on separate key blocks would walk different numbers of tiles under the causal
// mask and need a ring each (twice the shared memory, so fewer stages). The cost is consumer 1
// idling on its first tile of each head at HS 128, one step in T/64 per head.
// kQ (queries a step) keeps a Q or dO tile at 16 KB: kQ = 128 at HS 64 (m64n128 score products),
// 64 at HS 128. Registers of a consumer thread (accumulator elements / 128 threads):
//   HS 64, kQ 128:  dK 32 + dV 32 + Sᵀ 64 + dPᵀ 64 = 192 fp32 while the scores are live; then
//                   Pᵀ and dSᵀ as bf16 pairs, 32 + 32, replace Sᵀ and dPᵀ.
//   HS 128, kQ 64:  dK 64 + dV 64 + Sᵀ 32 + dPᵀ 32 = 192; operands 16 + 16.
// Both peak at 192 values plus addresses and loop state, under the kConsumerRegs = 240 that
// setmaxnreg gives (384 threads at one CTA an SM start at 168: 128·24 + 256·240 = 64512 of the
// 65536). Overlapping the next step's scores with this step's dK/dV products (the forward's
// intra-warpgroup overlap) would keep Pᵀ and dSᵀ live as well: 192 + 64 = 256 values at HS 64,
// 192 + 32 = 224 at HS 128 before any address, past the budget.
// ptxas (CUDA 13.0, 2026-12) fits every unmasked instantiation at 240 and at 224 with no spill,
// spills 380 to 640 bytes at 216 and then serializes the wgmmas: the consumers need between 217
// and 224 registers, so 240 leaves a margin of about two accumulator rows, not of a further
// tile (the kSeg ones need up to 240: Note [document masking in the FA3 backward]). The producer
// fits its 24 (no spill reported).
// Shared memory (kStages = 3 slots of Q 16 KB + dO 16 KB + lse and Δ, 2·kQ·4 bytes):
//   HS 64:  K 16 KB + V 16 KB + 3 × 33 KB          = 131 KB (+ barriers, column partials'
//   HS 128: K 32 KB + V 32 KB + 3 × 32.5 KB         = 161.5 KB  2 × 4·HS floats, 1 KB alignment)
// so one CTA an SM, which the 384 threads at 168 registers demand anyway.
//
// Note [dQ in the FlashAttention-3 backward]
// FlashAttention-3 accumulates dQ from the key CTAs with fp32 atomic adds into a [B, NH, T, HS]
// buffer and converts it in a last kernel: the order of the adds then varies from run to run, and
// gtron's backward must be bit-identical. Here dQ (and Δ, which the key kernel reads) comes from
// the wgmma query kernel (flash_wgmma_backward_query, Note [Δ in the query kernel]), launched
// first. What it costs against the atomic scheme, per visible (query, key) pair at head size HS:
// - FLOPs: the query kernel recomputes S = Q·Kᵀ and dP = dO·Vᵀ before its dQ = dS·K, so the
//   backward issues 7 products of 2·HS FLOPs instead of 5 (S, dP, dV, dK, dQ): 1.4× the tensor
//   work; with the forward, 9 instead of 7 products a step (1.29×).
// - Bytes: the query kernel reads K and V of every key tile before its diagonal, for each
//   64-query tile: Σ over tiles of (keys seen)·HS·2·2 bytes ≈ T²·HS/32 bytes per head, mostly
//   from L2 (the same head's CTAs run together), and Q, dO, O once. The atomic scheme instead
//   adds dQ partials of (key blocks seen) × 64 rows × HS fp32 per query tile: ≈ T²·HS/64 bytes
//   per head of read-modify-write traffic at L2, plus the fp32 dQ buffer (B·NH·T·HS·4 bytes,
//   which gtron's scratch contract does not provide) and its conversion pass.
// A semaphore that orders the adds by key block (FlashAttention-3's deterministic mode) would
// keep the 5 products, at the price of CTAs waiting on each other in the causal triangle.
// flash_fa3_backward_dq does that (Note [ordered dQ in the FA3 backward] in flash_fa3_dq_cuda.cu).
//
// Note [document masking in the FA3 backward]
// With a.seg set (Note [document masking in the flash kernels] in flash_common.cuh) the key
// kernel is built with kSeg, and the query kernel that runs first (dQ, Δ) is the wgmma one, which
// honours a.seg already; kSeg = false compiles to the PTX the key kernel had before the mask.
// - The walk of each query head ends early. Before the roles split, the 384 threads count the
//   query tiles from the diagonal whose first query is in the segment of the CTA's last key or an
//   earlier one (KeyWalk::keep_segment, one __syncthreads_count per 384 tiles); every query of a
//   later tile lies in a later segment than every key of the CTA. Producer and consumers walk
//   the shortened walk, so the ring's phases still match.
// - A consumer skips (waits for and releases, as for the causal skip) a tile whose first query
//   lies past the segment of its own last key: consumer 0's keys can end a segment before
//   consumer 1's do.
// - Element masks, per warp: a tile is masked when the causal test says so or when its last
//   query and the warp's first key are in different segments; key_tile_grads<kSeg> then zeroes
//   Pᵀ where a query's segment is not its key's. The consumers read the segment ids they compare
//   from global memory (L1) where they use them, not holding them across the walk.
// - Registers. The producer fitted its 24 with nothing to spare: KeyWalk::per and n were
//   arithmetic on the arguments, which ptxas redoes instead of keeping, while the count is a
//   barrier's result that would take a register for the whole walk and spill. So thread 0 stores
//   per in shared memory (BwdSmem::kPer) before the CTA-wide barrier, and the kSeg producer reads
//   it at each use (producer_walk). ptxas (CUDA 13.0, sm_90a): no spill for any instantiation at
//   kConsumerRegs = 240; the kSeg consumers need more than the unmasked ones, which fit at 224:
//   both head sizes spill 4 bytes at 232 (HS 64 fits at 232 without the column partials' code).
#include <cuda.h>
#include <cuda_bf16.h>

#include <cmath>

#include "model/cuda/kernel_util.cuh"
#include "model/cuda/mma_tile.cuh"
#include "model/cuda/tma.cuh"
#include "model/cuda/tma_map.h"
#include "model/cuda/wgmma.cuh"
#include "model/cuda/wgmma_wide.cuh"
#include "model/ops/flash_common.cuh"
#include "model/ops/flash_fa3.h"
#include "model/ops/flash_fa3_dq.cuh"
#include "model/ops/flash_wgmma.h"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "flash_fa3_bwd_cuda.cu is built for sm_90a only (bazel/cuda.bzl SM90A)"
#endif

namespace gtron::cuda {

namespace {

constexpr int kConsumers = 2;                     // consumer warpgroups
constexpr int kKeysWg = 64;                       // keys of a consumer (M of its products)
constexpr int kKeysCta = kConsumers * kKeysWg;    // keys of a CTA
constexpr int kThreads = 128 * (1 + kConsumers);  // producer warpgroup + consumers
constexpr int kProducerRegs = 24;
constexpr int kConsumerRegs = 240;
constexpr int kPanel = 64;        // bf16 columns of a 128-byte swizzled panel
constexpr int kTileElems = 8192;  // a Q or dO tile: kQ·HS elements, 16 KB
constexpr int kStagesBwd = 3;
static_assert(kKeysCta == fa3dq::kKeysCta && kKeysWg == fa3dq::kKeysWg && kPanel == fa3dq::kPanel,
              "flash_fa3_dq.cuh's tile constants");
using fa3dq::add_dq;
using fa3dq::dq_products;
using fa3dq::DqSums;
using fa3dq::put_ds;

// Where everything sits in the (1024-byte aligned) dynamic shared memory. A [rows, HS] tile is
// HS/64 panels of [rows, 64], panel p at element p·rows·64 (Note [wgmma operands]).
template <int HS>
struct BwdSmem {
  static constexpr int kQ = kTileElems / HS;  // queries a step
  static constexpr int kStages = kStagesBwd;
  static constexpr int kKvBytes = kKeysCta * HS * 2;  // K or V
  static constexpr int kTileBytes = kQ * HS * 2;      // Q or dO of one slot
  static constexpr int kRowBytes = kQ * 4;            // lse or Δ of one slot
  static constexpr int kK = 0;
  static constexpr int kV = kK + kKvBytes;
  static constexpr int kQt = kV + kKvBytes;
  static constexpr int kDo = kQt + kStages * kTileBytes;
  static constexpr int kL = kDo + kStages * kTileBytes;
  static constexpr int kD = kL + kStages * kRowBytes;
  static constexpr int kBars = kD + kStages * kRowBytes;
  static constexpr int kNumBars = 1 + 2 * kStages;   // K/V full; full and empty per slot
  static constexpr int kPer = kBars + kNumBars * 8;  // the walk's tiles a head (kSeg)
  static constexpr int kRed = kPer + 16;             // 4·HS floats a consumer (col_partial)
  static constexpr int kBytes = kRed + kConsumers * 4 * HS * 4 + 1024;  // + the alignment pad
  // kDq (Note [ordered dQ in the FA3 backward]): two dSᵀ tiles [kKeysCta, kQ] (panels of 64).
  static constexpr int kDsBytes = kKeysCta * kQ * 2;
  static constexpr int kDs = (kRed + kConsumers * 4 * HS * 4 + 1023) / 1024 * 1024;
  static constexpr int kBytesDq = kDs + 2 * kDsBytes + 1024;
};

// The CTA's tiles and barriers, from the aligned base.
template <int HS>
struct BwdTiles {
  using S = BwdSmem<HS>;
  bf16 *k, *v, *q, *dout;  // q, dout: slot s at s·kQ·HS
  float *lse, *delta;      // slot s at s·kQ (lse in log2 units)
  uint64_t* kv_full;
  uint64_t *full, *empty;  // [kStages] each
  int* per;                // KeyWalk::per under document masking
  float* red;              // consumer w's at w·4·HS (Note [qkv bias partials])
  bf16* ds;                // kDq: dSᵀ tile b at b·kKeysCta·kQ (allocated only then)
  __device__ __forceinline__ explicit BwdTiles(unsigned char* base)
      : k(reinterpret_cast<bf16*>(base + S::kK)),
        v(reinterpret_cast<bf16*>(base + S::kV)),
        q(reinterpret_cast<bf16*>(base + S::kQt)),
        dout(reinterpret_cast<bf16*>(base + S::kDo)),
        lse(reinterpret_cast<float*>(base + S::kL)),
        delta(reinterpret_cast<float*>(base + S::kD)),
        kv_full(reinterpret_cast<uint64_t*>(base + S::kBars)),
        full(kv_full + 1),
        empty(kv_full + 1 + S::kStages),
        per(reinterpret_cast<int*>(base + S::kPer)),
        red(reinterpret_cast<float*>(base + S::kRed)),
        ds(reinterpret_cast<bf16*>(base + S::kDs)) {}
};

// The kernel's tensor maps (__grid_constant__ parameters, so their addresses are the maps').
struct BwdMaps {
  CUtensorMap k, v, q, dout;
};

// The walk as the producer reads it at each use: kSeg takes per from shared memory (Note
// [document masking in the FA3 backward]).
template <int HS, bool kSeg>
__device__ __forceinline__ KeyWalk producer_walk(const KeyWalk& walk, const BwdTiles<HS>& t) {
  KeyWalk w = walk;
  if constexpr (kSeg) {
    w.per = *t.per;
    w.n = w.group * w.per;
  }
  return w;
}

// The producer warp: K and V of the CTA's keys once, then Q, dO (lane 0, by TMA), lse and Δ (all
// lanes) of step i of the walk into slot i % kStages (Note [FlashAttention-3 backward]).
template <int HS, bool kSeg>
__device__ __forceinline__ void produce(const BwdMaps& m, const BwdTiles<HS>& t,
                                        const KeyWalk& walk, const FlashBackwardArgs& a,
                                        const float* delta, int k0, int lane) {
  using S = BwdSmem<HS>;
  if (lane == 0) {
    tma::prefetch_map(&m.k);
    tma::prefetch_map(&m.v);
    tma::prefetch_map(&m.q);
    tma::prefetch_map(&m.dout);
    tma::mbar_expect_tx(t.kv_full, 2 * S::kKvBytes);
#pragma unroll
    for (int p = 0; p < HS / kPanel; ++p) {
      tma::load_4d(t.k + p * kKeysCta * kPanel, &m.k, t.kv_full, p * kPanel, walk.hk, k0, walk.b);
      tma::load_4d(t.v + p * kKeysCta * kPanel, &m.v, t.kv_full, p * kPanel, walk.hk, k0, walk.b);
    }
  }
  for (int i = 0; i < producer_walk<HS, kSeg>(walk, t).n; ++i) {
    const int slot = i % S::kStages, use = i / S::kStages;
    tma::mbar_wait(t.empty + slot, (use & 1) ^ 1);
    const KeyWalk w = producer_walk<HS, kSeg>(walk, t);
    const int h = w.head(i), q0 = w.tile(i) * S::kQ;
    const int64_t row = (static_cast<int64_t>(walk.b) * a.NH + h) * a.T;
#pragma unroll
    for (int j = lane; j < S::kQ; j += 32) {
      const bool valid = q0 + j < a.T;
      t.lse[slot * S::kQ + j] = valid ? a.lse[row + q0 + j] * kLog2e : 0.0f;
      t.delta[slot * S::kQ + j] = valid ? delta[row + q0 + j] : 0.0f;
    }
    uint64_t* full = t.full + slot;
    if (lane != 0) {
      tma::mbar_arrive(full);
      continue;
    }
    tma::mbar_expect_tx(full, 2 * S::kTileBytes);
    bf16* q = t.q + slot * S::kQ * HS;
    bf16* dout = t.dout + slot * S::kQ * HS;
#pragma unroll
    for (int p = 0; p < HS / kPanel; ++p) {
      tma::load_4d(q + p * S::kQ * kPanel, &m.q, full, p * kPanel, h, q0, walk.b);
      tma::load_4d(dout + p * S::kQ * kPanel, &m.dout, full, p * kPanel, h, q0, walk.b);
    }
  }
}

// d[64 keys × NQ queries] = A·Bᵀ over HS columns: A a consumer's 64 rows of the CTA's K or V
// (panels of kKeysCta rows), B a slot's Q or dO tile (panels of NQ rows), both K-major; m64n128
// products for NQ = 128, m64n64 for 64. The caller fences and commits.
template <int HS, int NQ>
__device__ __forceinline__ void scores_t(float (&d)[NQ / 8][4], const bf16* a, const bf16* b) {
#pragma unroll
  for (int p = 0; p < HS / kPanel; ++p) {
    const uint64_t da = wg::desc(a + p * kKeysCta * kPanel);
    const uint64_t db = wg::desc(b + p * NQ * kPanel);
#pragma unroll
    for (int kk = 0; kk < kPanel / 16; ++kk) {
      if constexpr (NQ == 128) {
        wg::mma_ss_n128<0>(d, wg::advance(da, 32 * kk), wg::advance(db, 32 * kk), p > 0 || kk > 0);
      } else {
        wg::mma_ss<0>(d, wg::advance(da, 32 * kk), wg::advance(db, 32 * kk), p > 0 || kk > 0);
      }
    }
  }
}

// d[64 keys × HS] += A·B, A as to_a's operands over the NQ queries and B a slot's [NQ, HS] tile
// read MN-major: one m64n64 product per 64-column panel. The caller fences and commits.
template <int HS, int NQ>
__device__ __forceinline__ void grad_products(float (&d)[HS / 8][4],
                                              const uint32_t (&a)[NQ / 16][4], const bf16* b) {
#pragma unroll
  for (int p = 0; p < HS / kPanel; ++p) {
    wg::pv_rs(*reinterpret_cast<float(*)[8][4]>(&d[p * 8]), a, b + p * NQ * kPanel);
  }
}

// One arrival per warp on an empty barrier, after the warp's products on the slot retired.
__device__ __forceinline__ void release(uint64_t* bar, int lane) {
  if (lane == 0) tma::mbar_arrive(bar);
}

// Consumer w: dK and dV of keys kw0 .. kw0 + 63 over the walk, then the stores. kSeg: with the
// document mask (Note [document masking in the FA3 backward]).
template <int HS, bool kRope, bool kSeg, bool kDq>
__device__ __forceinline__ void consume(const FlashBackwardArgs& a, const BwdTiles<HS>& t,
                                        const KeyWalk& walk, int w, int k0, const DqSums& dqs) {
  using S = BwdSmem<HS>;
  constexpr int kQ = S::kQ, NT = kQ / 8;
  const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
  const int kw0 = k0 + w * kKeysWg;                    // this warpgroup's first key
  const int key_base = kw0 + warp * 16 + (lane >> 2);  // this lane's keys: key_base, + 8
  const bf16* k_w = t.k + w * kKeysWg * kPanel;        // its rows of K's panel 0
  const bf16* v_w = t.v + w * kKeysWg * kPanel;
  const float sl2 = a.scale * kLog2e;
  const bool live = kw0 < a.T;  // some key of this warpgroup exists
  SegRows sr;                   // the keys' segments, read where used (registers)
  if constexpr (kSeg) sr.row = a.seg + walk.b * a.seg_batch;

  float dk[HS / 8][4] = {}, dv[HS / 8][4] = {};
  tma::mbar_wait(t.kv_full, 0);
  for (int i = 0; i < walk.n; ++i) {
    const int slot = i % S::kStages;
    tma::mbar_wait(t.full + slot, (i / S::kStages) & 1);
    const int qs0 = walk.tile(i) * kQ;
    bool run = live && qs0 + kQ > kw0;  // some query of the tile sees some key (causal skip)
    if constexpr (kSeg) run = run && sr.at(qs0, a.T) <= sr.at(kw0 + kKeysWg - 1, a.T);
    const bf16* q = t.q + slot * kQ * HS;
    const bf16* dout = t.dout + slot * kQ * HS;
    uint32_t pa[NT / 2][4], dsa[NT / 2][4];          // Pᵀ and dSᵀ as A operands
    bf16* ds_tile = t.ds + (i & 1) * kKeysCta * kQ;  // kDq: this step's dSᵀ tile
    if (run) {
      float p[NT][4];   // Sᵀ, then Pᵀ: [64 keys, kQ queries]
      float ds[NT][4];  // dPᵀ, then dSᵀ
      wg::fence();
      scores_t<HS, kQ>(p, k_w, q);
      scores_t<HS, kQ>(ds, v_w, dout);
      wg::commit();
      wg::wait<0>();
      wg::hold(p);
      wg::hold(ds);
      bool masked = qs0 < kw0 + kKeysWg || qs0 + kQ > a.T || kw0 + kKeysWg > a.T;
      if constexpr (kSeg) {  // the tile's last query against the warp's first key
        masked = masked || sr.at(qs0 + kQ - 1, a.T) != sr.at(kw0 + warp * 16, a.T);
        sr.own[0] = sr.at(key_base, a.T);
        sr.own[1] = sr.at(key_base + 8, a.T);
      }
      key_tile_grads<NT, kSeg>(p, ds, t.lse + slot * kQ, t.delta + slot * kQ, sl2, qs0, key_base,
                               masked, a.T, lane, sr);
      wg::to_a(p, pa);
      wg::to_a(ds, dsa);
      if constexpr (kDq) put_ds<kQ, false>(ds_tile, ds, w, warp, lane);
    } else if constexpr (kDq) {  // zero operands: the batch below stays the same for both
      float none[NT][4];
      put_ds<kQ, true>(ds_tile, none, w, warp, lane);
#pragma unroll
      for (int k = 0; k < NT / 2; ++k) {
#pragma unroll
        for (int e = 0; e < 4; ++e) pa[k][e] = dsa[k][e] = 0u;
      }
    }
    if constexpr (kDq) {
      // Both consumers' halves of dSᵀ in place (named barrier 3: the 256 consumer threads); the
      // other tile was last read at step i − 1, which both have retired by now.
      async_proxy_fence();
      tma::bar_sync<kConsumers * 128>(3);
    }
    float dq[8][4];    // kDq: this consumer's part of the step's dQ
    if (run || kDq) {  // kDq: one batch whatever `run` says (a branch inside serializes it)
      wg::fence();
      grad_products<HS, kQ>(dv, pa, dout);
      grad_products<HS, kQ>(dk, dsa, q);
      if constexpr (kDq) dq_products<HS, kQ>(dq, ds_tile, t.k, w);
      wg::commit();
      wg::wait<0>();
      wg::hold(dv);
      wg::hold(dk);
      wg::hold(pa);
      wg::hold(dsa);
      if constexpr (kDq) wg::hold(dq);
    }
    release(t.empty + slot, lane);
    if constexpr (kDq) add_dq<HS, kQ>(dq, dqs, a, walk, i, k0 / kKeysCta, w, warp, lane);
  }

  // dK (scaled) and dV of rows below T, stored or added as a.accumulate says, dK rotated back
  // under kRope (Note [RoPE in the flash backward]); with a.col_partial, each consumer writes the
  // column partials of its 64 rows, tile kw0 / 64, as a wgmma key CTA of those keys would (Note
  // [qkv bias partials]), synchronizing its warpgroup on named barrier 1 + w.
  if (!live) return;  // no rows, and no chunk of partials (tile kw0 / 64 is past T's)
  bf16* dbase = static_cast<bf16*>(a.dqkv) + walk.b * a.qkv_batch;
  const int64_t kc = k_column(a, walk.hk), vc = v_column(a, walk.hk);
  const int r0 = kw0 + warp * 16, tile = kw0 / kRows, tid = threadIdx.x % 128;
  const float sc[2] = {a.scale, a.scale}, one[2] = {1.0f, 1.0f};
  float* red = t.red + w * 4 * HS;
  const auto sync = [w] { tma::bar_sync<128>(1 + w); };
  store_grad_rows<HS, kRope>(dk, dbase + kc, a, walk.b, tile, kc, r0, lane, warp, sc, red, true,
                             tid, sync);
  store_grad_rows<HS, kRope>(dv, dbase + vc, a, walk.b, tile, vc, r0, lane, warp, one, red, false,
                             tid, sync);
}

template <int HS, bool kRope, bool kSeg, bool kDq>
__global__ void __launch_bounds__(kThreads, 1)
    fa3_backward_kv_kernel(const __grid_constant__ BwdMaps maps, FlashBackwardArgs a,
                           const float* __restrict__ delta, DqSums dqs) {
  static_assert(!(kSeg && kDq), "the ordered dQ needs every key block to visit its tiles");
  using S = BwdSmem<HS>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t pad = (1024 - (smem_u32(smem_raw) & 1023)) & 1023;
  const BwdTiles<HS> t(smem_raw + pad);
  // Key block 0 sees every query: the longest first. Under kDq the highest first, so that a CTA
  // waits only for earlier ones (Note [ordered dQ in the FA3 backward]).
  const int kb = kDq ? static_cast<int>(gridDim.x - 1 - blockIdx.x) : static_cast<int>(blockIdx.x);
  const int k0 = kb * kKeysCta;
  KeyWalk walk(a, k0, S::kQ);
  if constexpr (kSeg) {  // every thread, before the roles split
    SegRows sr;
    sr.row = a.seg + walk.b * a.seg_batch;
    walk.keep_segment<S::kQ, kThreads>(sr, sr.at(k0 + kKeysCta - 1, a.T), a.T);
    if (threadIdx.x == 0) *t.per = walk.per;  // for the producer, after the barrier below
  }

  if (threadIdx.x == 0) {
    tma::mbar_init(t.kv_full, 1);
    for (int s = 0; s < S::kStages; ++s) {
      tma::mbar_init(t.full + s, 32);  // the producer warp's lanes
      tma::mbar_init(t.empty + s, kConsumers * 4);
    }
    tma::mbar_init_fence();
  }
  __syncthreads();  // the last CTA-wide barrier: from here the roles run apart

  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    tma::setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x < 32) produce<HS, kSeg>(maps, t, walk, a, delta, k0, threadIdx.x);
    return;
  }
  tma::setmaxnreg_inc<kConsumerRegs>();
  consume<HS, kRope, kSeg, kDq>(a, t, walk, wg - 1, k0, dqs);
}

template <int HS, bool kRope, bool kSeg, bool kDq = false>
void backward_keys(const FlashBackwardArgs& a, const float* delta, cudaStream_t st,
                   const DqSums& dqs = DqSums()) {
  using S = BwdSmem<HS>;
  constexpr int kSmem = kDq ? S::kBytesDq : S::kBytes;
  static const bool once = [] {
    CUDA_CHECK(cudaFuncSetAttribute(fa3_backward_kv_kernel<HS, kRope, kSeg, kDq>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    return true;
  }();
  (void)once;
  const char* qkv = static_cast<const char*>(a.qkv);
  BwdMaps m;
  m.k = tma::head_map(qkv + static_cast<int64_t>(a.NH) * HS * 2, HS, a.NKV, a.T, a.B, a.qkv_ld,
                      a.qkv_batch, kKeysCta);
  m.v = tma::head_map(qkv + static_cast<int64_t>(a.NH + a.NKV) * HS * 2, HS, a.NKV, a.T, a.B,
                      a.qkv_ld, a.qkv_batch, kKeysCta);
  m.q = tma::head_map(qkv, HS, a.NH, a.T, a.B, a.qkv_ld, a.qkv_batch, S::kQ);
  m.dout = tma::head_map(a.dout, HS, a.NH, a.T, a.B, a.o_ld, a.o_batch, S::kQ);
  const dim3 grid(static_cast<unsigned>(ceil_div<int64_t>(a.T, kKeysCta)),
                  static_cast<unsigned>(a.B * a.NKV));
  fa3_backward_kv_kernel<HS, kRope, kSeg, kDq><<<grid, kThreads, kSmem, st>>>(m, a, delta, dqs);
  CUDA_CHECK_LAUNCH();
}

template <bool kSeg>
void backward_rope(const FlashBackwardArgs& a, const float* delta, bool rope, cudaStream_t st) {
  if (a.HS == 64) {
    rope ? backward_keys<64, true, kSeg>(a, delta, st)
         : backward_keys<64, false, kSeg>(a, delta, st);
  } else {
    rope ? backward_keys<128, true, kSeg>(a, delta, st)
         : backward_keys<128, false, kSeg>(a, delta, st);
  }
}

}  // namespace

void fa3_backward_keys_ordered_dq(const FlashBackwardArgs& a, const float* delta, float* dq_sums,
                                  int* turns, void* stream) {
  const auto st = static_cast<cudaStream_t>(stream);
  DqSums d;
  d.acc = dq_sums;
  d.turn = turns;
  const bool rope = a.rope_inv_freq != nullptr;
  if (a.HS == 64) {
    rope ? backward_keys<64, true, false, true>(a, delta, st, d)
         : backward_keys<64, false, false, true>(a, delta, st, d);
  } else {
    rope ? backward_keys<128, true, false, true>(a, delta, st, d)
         : backward_keys<128, false, false, true>(a, delta, st, d);
  }
}

FlashBackwardArgs fa3_backward_checked(const FlashBackwardArgs& args, const float* delta) {
  FlashBackwardArgs a = args;
  if (a.NKV == 0) a.NKV = a.NH;
  GTRON_CHECK(a.HS == 64 || a.HS == 128, "flash_fa3: head size ", a.HS, ", expected 64/128");
  GTRON_CHECK(a.NKV > 0 && a.NH % a.NKV == 0, "flash_fa3: ", a.NKV, " k/v heads do not divide ",
              a.NH, " query heads");
  GTRON_CHECK(a.T >= 0, "flash_fa3: length ", a.T);
  GTRON_CHECK(a.seg == nullptr || a.seg_batch >= a.T, "flash_fa3: segment batch stride ",
              a.seg_batch, " below T = ", a.T);
  GTRON_CHECK(a.qkv_ld % 8 == 0 && a.o_ld % 8 == 0 && a.qkv_batch % 8 == 0 && a.o_batch % 8 == 0,
              "flash_fa3: row and batch strides must be multiples of 8 elements");
  GTRON_CHECK(is_aligned(a.qkv, 16) && is_aligned(a.dqkv, 16) && is_aligned(a.o, 16) &&
                  is_aligned(a.dout, 16),
              "flash_fa3: operands must be 16-byte aligned");
  if (static_cast<int64_t>(a.B) * a.NH * a.T == 0) return a;
  GTRON_CHECK(delta != nullptr, "flash_fa3: backward needs delta (B·NH·T floats)");
  GTRON_CHECK(flash_fa3_usable(a.HS), "flash_fa3: needs a compute-capability 9.0 GPU (sm_90a)");
  return a;
}

void flash_fa3_backward(const FlashBackwardArgs& args, float* delta, void* stream) {
  const FlashBackwardArgs a = fa3_backward_checked(args, delta);
  if (static_cast<int64_t>(a.B) * a.NH * a.T == 0) return;
  flash_wgmma_backward_query(a, delta, stream);  // dQ, and Δ for the key kernel; honours a.seg
  const auto st = static_cast<cudaStream_t>(stream);
  const bool rope = a.rope_inv_freq != nullptr;
  if (a.seg != nullptr) {
    backward_rope<true>(a, delta, rope, st);
  } else {
    backward_rope<false>(a, delta, rope, st);
  }
}

}  // namespace gtron::cuda

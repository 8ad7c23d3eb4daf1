// The causal flash-attention forward with FlashAttention-3's structure (Shah et al., 2024), bf16,
// head sizes 64 and 128, built for sm_90a only. Contract in model/ops/flash_fa3.h; the numerics
// (fp32 scores and softmax, exp2 with the scale folded in, P rounded to bf16 for P·V, lse in
// natural log) are those of flash_wgmma_cuda.cu's forward. The per-tile pieces (shared memory,
// products, softmax, stores) are in flash_fa3_common.cuh.
//
// Note [FlashAttention-3 forward]
// A CTA of 384 threads walks work tiles, each 128 query rows of one (b, h), in the order its
// schedule fixes (Note [persistent FA3 forward]); for each it walks the key tiles of 128 that the
// causal mask leaves, from the diagonal down to tile 0 (so the one masked tile comes first):
// - Warpgroup 0 is the producer. It lowers its registers to kProducerRegs (setmaxnreg) and one of
//   its threads issues every load by TMA (a 4-d tensor map of each of q, k, v: head columns,
//   heads, rows, batches, made on the host by tma::head_map, model/cuda/tma_map.h; rows past T
//   land as zeros): the tile's 128 rows of Q into the one Q buffer, then the K and V tiles into a
//   ring of kStages slots, each slot with a full and an empty mbarrier for K and another pair for
//   V (Note [mbarrier phases] in model/cuda/tma.cuh). K runs a tile ahead of V (K0, K1, V0, K2,
//   V1, ...) because the consumers read tile i's keys with tile i − 1's values.
// - Warpgroups 1 and 2 are the consumers, rows 0..63 and 64..127 of the work tile; each raises
//   its registers to kConsumerRegs. Per key tile i a consumer issues S_i = Q·K_iᵀ (m64n128k16,
//   both operands in shared memory), rescales O by the previous tile's correction, issues
//   O += P_{i−1}·V_{i−1} (P in registers as the A operand, V MN-major, m64n64k16 per 64-column
//   panel), waits for S_i alone (wait_group 1) and releases K_i, runs the online softmax of S_i
//   while P_{i−1}·V_{i−1} is still in flight, then waits for it, releases V_{i−1} and converts
//   S_i to P_i. That is the intra-warpgroup overlap: one tile's softmax under the previous
//   tile's P·V. After the last P·V it stores o and lse from its registers.
// - Ping-pong (Note [consumer ping-pong]): named barriers let the two consumers issue their
//   products in turns, so one warpgroup's softmax runs under the other's products.
// Results: o and lse as the other flash forwards within fp32 summation order (key tiles are
// summed from the diagonal down here); two runs are bit-identical (no atomics; every tile's order
// is fixed), whatever the schedule.
//
// Shared memory (Q, then kStages slots, each a K and a V tile of 128 rows):
//   HS 64:  Q 16 KB + 4 × (16 + 16) KB = 144 KB (+ barriers, 1 KB alignment: 148,632 bytes)
//   HS 128: Q 32 KB + 2 × (32 + 32) KB = 160 KB under kTiles (164,952 bytes); 3 stages, 224 KB
//           (230,520 bytes), in the persistent schedules (Note [persistent FA3 forward]).
// Registers: 384 threads at one CTA an SM give ptxas 168 a thread (65536 / 384, rounded down to
// 8); setmaxnreg then moves them from the producer (kProducerRegs = 24) to the consumers
// (kConsumerRegs = 240): 128·24 + 256·240 = 64512 of 65536. A consumer at HS 128 holds O (64
// fp32), S (64), P (32 bf16 pairs) and the softmax state: ptxas (CUDA 13.0), which allocates the
// code after each setmaxnreg within its budget, fits it at 200 (unmasked: spills at 176; kSeg:
// at 192); HS 64 fits at 168 (kSeg spills at 160). No instantiation spills at 24 / 240. The
// kSeg producer fits its 24 only with the warp reconverged after each tile's loads (__syncwarp;
// without, ptxas spilled 48 to 64 bytes).
//
// Note [document masking in the FA3 forward]
// The kSeg instantiations honour FlashForwardArgs::seg (Note [document masking in the flash
// kernels] in flash_common.cuh): a work tile walks from the diagonal down to j0, the first key
// tile not wholly before the segment of its first query, so n_visit = n_tiles − j0 >= 1 tiles.
// The producer warp counts j0 (warp_count, one ballot per 32 tiles; the count of first_key_tile)
// and hands n_visit to the consumers in shared memory with the tile's Q: written after its wait
// for Q's release, read after the consumers' wait for Q to land (mbarrier arrive releases,
// try_wait acquires), so both sides walk the same tiles. A warp masks a walked tile by segment
// only when the tile's first key and the warp's last row lie in different segments.
//
// Note [persistent FA3 forward]
// The kernel is one loop over its CTA's work tiles (for_each_tile); Fa3Schedule picks the grid
// and the order, as units of one or two tiles, CTA x taking units x, x + G, x + 2G, ... (G =
// gridDim.x, a static stride):
// - kTiles: G = all B·NH·nq tiles, unit u is query tile nq − 1 − u / (B·NH) of head u % (B·NH):
//   every head's longest tiles first, consecutive CTAs the heads of one batch (GQA's shared k/v
//   heads hit L2). The hardware starts the CTAs in that order; each walks one tile.
// - kPersistent: the same units over G = min(#SMs, tiles) CTAs.
// - kPersistentPairs: unit u is the pair of query tiles nq − 1 − p and p (p = u % ⌈nq/2⌉, the
//   middle tile of an odd nq alone) of head u / ⌈nq/2⌉, G = min(#SMs, units). A pair holds nq + 1
//   key tiles, so the stride balances without sorting, and the G units at work at a time span
//   about 2G / nq heads, whose k and v stay in L2 for all their query tiles. Longest-first over
//   all heads reads every head's k and v again in each wave of G tiles: at HS 128, T = 2048,
//   B·NH = 128 (MHA) a wave touches ~134 MB, more than the 50 MB L2, and a call reads ~1.1 GB from
//   HBM against ~0.13 GB for pairs (an LRU model of the walks): about 0.37 ms at 3 TB/s, where the
//   kTiles forward measured 0.42 ms.
// A tile's result does not depend on the schedule or on the CTA (the same functions and key-tile
// order, no atomics), so all three give the same bits. Across a CTA's tiles nothing is reset:
// - Q has a full and an empty mbarrier (8 consumer-warp arrivals). The CTA's j-th tile fills the
//   buffer for the j-th time: consumers wait on q_full with parity j & 1, the producer on q_empty
//   with (j & 1) ^ 1 (Note [mbarrier phases]). A consumer warp releases Q once its last S = Q·Kᵀ
//   of the tile has retired, so the next Q loads under the last softmax, P·V and stores.
// - The K and V rings count loads over the CTA's life: the key tile walked at position i of a
//   work tile is the (it + i)-th load of its ring, it = the walks of the CTA's earlier tiles, in
//   slot (it + i) % kStages with parity ((it + i) / kStages) & 1, on both sides: producer and
//   consumers derive every walk's length alike (Note [document masking in the FA3 forward]).
// - The producer runs ahead: after a tile's last V it waits for Q's release, loads the next Q,
//   then K and V into the slots the finishing tile frees. It only ever waits for the release of
//   a load it issued earlier, which the consumers give without waiting for anything later, so
//   neither side can stall the other into a cycle. It returns after its last load (its last wait
//   was for that slot's previous use), and no barrier is left waited on with no arrival to come;
//   the consumers wait for every load issued, so none is in flight when the CTA exits.
// - Ping-pong turns carry across tiles (Note [consumer ping-pong]): consumer 0's first S of a tile
//   follows consumer 1's last P·V of the previous one, so each consumer's store of O runs under
//   the other's products.
// Three stages at HS 128 in the persistent schedules: one CTA an SM either way (registers), so
// the 64 KB cost nothing; a load issued when its slot frees then has two key tiles' time (~4 µs
// at 550 TFLOP/s) to land instead of one, against HBM latency that grows under load; and when
// Q's release lets the producer on to the next tile (all the tile's K are free by then, its V up
// to the last but two), the next Q goes out at once with that tile's K0, K1, V0 and K2 (V1 as
// soon as the last P·V but one retires), the data of its first three turns, where 2 stages send
// K0 and K1 (V0 just after); that matters where tiles are short (8.5 key tiles on average at
// T = 2048). A second Q buffer (the other way to start the next tile sooner: its Q would load a
// whole tile ahead) does not fit beside them (32 + 32 + 192 KB); it would with 2 stages
// (192 KB). kTiles keeps the 2 stages it was measured with.
#include <cuda.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <climits>

#include "model/cuda/kernel_util.cuh"
#include "model/cuda/tma.cuh"
#include "model/cuda/tma_map.h"
#include "model/cuda/wgmma.cuh"
#include "model/ops/flash_common.cuh"
#include "model/ops/flash_fa3.h"
#include "model/ops/flash_fa3_common.cuh"
#include "model/ops/flash_wgmma.h"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "flash_fa3_cuda.cu is built for sm_90a only (bazel/cuda.bzl SM90A)"
#endif

namespace gtron::cuda {

namespace {

// The work units of Note [persistent FA3 forward]: one query tile each (longest first over all
// heads) or, with `pairs`, query tiles nq − 1 − p and p of one head (heads in order).
struct Fa3Work {
  int nq;     // query tiles of a (b, h)
  int BH;     // B·NH
  int pairs;  // nonzero: kPersistentPairs's units
  __host__ __device__ int units() const { return pairs ? BH * ((nq + 1) / 2) : BH * nq; }
  // Tile k (0 or 1) of unit u as bh = b·NH + h and its query tile qb; false if there is none.
  __device__ __forceinline__ bool tile(int u, int k, int& bh, int& qb) const {
    if (!pairs) {
      bh = u % BH;
      qb = nq - 1 - u / BH;
      return k == 0;
    }
    const int per = (nq + 1) / 2, p = u % per;
    bh = u / per;
    qb = k == 0 ? nq - 1 - p : p;
    return k == 0 || qb != nq - 1 - p;
  }
};

// f(bh, qb, j) for the CTA's work tiles in order, j = 0, 1, ...: units blockIdx.x, blockIdx.x +
// gridDim.x, ... Producer and consumers walk the same sequence.
template <typename F>
__device__ __forceinline__ void for_each_tile(const Fa3Work& work, F&& f) {
  uint32_t j = 0;
  const int units = work.units();
  for (int u = blockIdx.x; u < units; u += gridDim.x) {
#pragma unroll 1
    for (int k = 0; k < 2; ++k) {
      int bh, qb;
      if (!work.tile(u, k, bh, qb)) break;
      f(bh, qb, j++);
    }
  }
}

// n_tiles: the key tiles 0 .. n_tiles − 1 that the causal mask leaves to the work tile at q0.
__device__ __forceinline__ int key_tiles(int q0, int T) {
  return (min(T, q0 + kRowsCta) + kKeys - 1) / kKeys;
}

// The CTA's buffers in shared memory (Fa3Smem's layout).
struct Fa3Ring {
  bf16 *q, *k, *v;
  Fa3Bars bars;
  int* visit;  // n_visit of the tile whose Q is loaded (kSeg)
};

// The producer warp: per work tile, Q once the consumers released the previous one, then K and V
// of walk position i < n_visit (key tile n_tiles − 1 − i) as the (it + i)-th loads of their rings,
// K one tile ahead of V (Notes [FlashAttention-3 forward], [persistent FA3 forward]). Lane 0
// issues everything; under kSeg the whole warp counts the skipped key tiles first.
template <int HS, int kStages, bool kSeg>
__device__ __forceinline__ void produce(const CUtensorMap* mq, const CUtensorMap* mk,
                                        const CUtensorMap* mv, const Fa3Ring& r,
                                        const FlashForwardArgs& a, const Fa3Work& work) {
  using S = Fa3Smem<HS, kStages>;
  const int lane = threadIdx.x % 32;
  if (!kSeg && lane != 0) return;
  if (lane == 0) {
    tma::prefetch_map(mq);
    tma::prefetch_map(mk);
    tma::prefetch_map(mv);
  }
  uint32_t it = 0;  // loads of each ring before the current tile's
  auto fill = [&](const CUtensorMap* map, bf16* ring, uint64_t* full, uint64_t* empty, uint32_t n,
                  int hk, int key0, int b) {
    const uint32_t slot = n % kStages, use = n / kStages;
    tma::mbar_wait(empty + slot, (use & 1) ^ 1);
    tma::mbar_expect_tx(full + slot, S::kTileBytes);
    bf16* tile = ring + slot * kKeys * HS;
#pragma unroll
    for (int p = 0; p < HS / kPanel; ++p) {
      tma::load_4d(tile + p * kKeys * kPanel, map, full + slot, p * kPanel, hk, key0, b);
    }
  };
  for_each_tile(work, [&](int bh, int qb, uint32_t j) {
    const int b = bh / a.NH, h = bh % a.NH, q0 = qb * kRowsCta;
    const int n_tiles = key_tiles(q0, a.Tq);
    int n_visit = n_tiles;
    if constexpr (kSeg) {  // Note [document masking in the FA3 forward]
      SegRows sr;
      sr.row = a.seg + b * a.seg_batch;
      const int32_t first = sr.at(q0, a.Tq);
      n_visit -=
          warp_count(n_tiles, [&](int t) { return sr.at(t * kKeys + kKeys - 1, a.Tq) < first; });
    }
    if (lane == 0) {
      const int hk = h / (a.NH / a.NKV);  // Note [grouped-query flash attention]
      tma::mbar_wait(r.bars.q_empty, (j & 1) ^ 1);
      if constexpr (kSeg) *r.visit = n_visit;
      tma::mbar_expect_tx(r.bars.q_full, S::kQBytes);
#pragma unroll
      for (int p = 0; p < HS / kPanel; ++p) {
        tma::load_4d(r.q + p * kRowsCta * kPanel, mq, r.bars.q_full, p * kPanel, h, q0, b);
      }
      const int top = (n_tiles - 1) * kKeys;  // walk position i reads keys top − i·kKeys ..
      fill(mk, r.k, r.bars.k_full, r.bars.k_empty, it, hk, top, b);
      for (int i = 1; i < n_visit; ++i) {
        fill(mk, r.k, r.bars.k_full, r.bars.k_empty, it + i, hk, top - i * kKeys, b);
        fill(mv, r.v, r.bars.v_full, r.bars.v_empty, it + i - 1, hk, top - (i - 1) * kKeys, b);
      }
      fill(mv, r.v, r.bars.v_full, r.bars.v_empty, it + n_visit - 1, hk,
           top - (n_visit - 1) * kKeys, b);
    }
    it += n_visit;
    if constexpr (kSeg) __syncwarp();  // converged for the next count (ptxas: no spill at 24)
  });
}

// Note [consumer ping-pong]
// Consumer w issues its products between bar_sync(kBarFirst + w) and bar_arrive(kBarFirst + 1 −
// w), both over the 256 consumer threads: a sync completes when the 128 threads of w have synced
// and the 128 of the other consumer have arrived, so the two issue in turns, consumer 0 first
// (consumer 1 arrives once on barrier kBarFirst before its first turn). A work tile takes
// n_visit + 1 turns of each (S of the first key tile; S and P·V of each further one; the last
// P·V), and both walk the same tiles with the same n_visit, so the turns alternate across tiles
// too and no arrival can run a whole turn ahead (each needs the other's in between). Consumer 1
// then has arrived once more than its turns on consumer 0's barrier, so consumer 0 syncs once
// more after its last tile and no barrier is left with arrivals in flight when the CTA exits.

// One work tile (rows q0 .. of head (b, h)) of consumer w, its key tiles the it-th loads of the
// rings onwards, its Q the CTA's j-th. Returns the key tiles walked.
template <int HS, int kStages, bool kSeg>
__device__ __forceinline__ int consume_tile(const FlashForwardArgs& a, const Fa3Ring& r, int w,
                                            int b, int h, int q0, uint32_t it, uint32_t j) {
  constexpr int NT = kKeys / 8;
  const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
  const int warp_row = q0 + w * kRowsWg + warp * 16;  // the warp's first row
  const int row0 = warp_row + (lane >> 2);            // this lane's rows: row0, row0 + 8
  const bf16* q_w = r.q + w * kRowsWg * kPanel;       // this warpgroup's rows of Q's panel 0
  const int mine = kBarFirst + w, other = kBarFirst + 1 - w;
  const float sl2 = a.scale * kLog2e;
  const int T = a.Tq, n_tiles = key_tiles(q0, T);

  float o[HS / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, corr[2] = {1.0f, 1.0f};
  uint32_t pa[kKeys / 16][4];
  float s[NT][4];
  SegRows sr;            // the rows' segments (Note [document masking in the FA3 forward])
  int32_t last_seg = 0;  // of the warp's last row
  if constexpr (kSeg) {
    sr.row = a.seg + b * a.seg_batch;
    sr.own[0] = sr.at(row0, T);
    sr.own[1] = sr.at(row0 + 8, T);
    last_seg = sr.at(warp_row + 15, T);
  }
  auto tile_key0 = [&](int i) { return (n_tiles - 1 - i) * kKeys; };
  auto is_masked = [&](int key0) {
    bool masked = key0 + kKeys - 1 > warp_row || key0 + kKeys > T;
    if constexpr (kSeg) masked = masked || sr.row[key0] != last_seg;
    return masked;
  };
  auto slot = [&](int i) { return static_cast<int>((it + i) % kStages); };
  auto phase = [&](int i) { return ((it + i) / kStages) & 1; };

  tma::mbar_wait(r.bars.q_full, j & 1);
  const int n_visit = kSeg ? *r.visit : n_tiles;  // written before Q's expect_tx

  // Tile 0 (the diagonal): scores alone.
  tma::mbar_wait(r.bars.k_full + slot(0), phase(0));
  tma::bar_sync<2 * 128>(mine);
  wg::fence();
  scores<HS>(s, q_w, r.k + slot(0) * kKeys * HS);
  wg::commit();
  tma::bar_arrive<2 * 128>(other);
  wg::wait<0>();
  wg::hold(s);
  release(r.bars.k_empty + slot(0), lane);
  if (n_visit == 1) release(r.bars.q_empty, lane);  // the tile's last S
  softmax_tile<NT, kSeg>(s, m, l, corr, sl2, is_masked(tile_key0(0)), tile_key0(0), row0, T, lane,
                         sr);
  wg::to_a(s, pa);

  for (int i = 1; i < n_visit; ++i) {
    const int ks = slot(i), vs = slot(i - 1);
    tma::mbar_wait(r.bars.k_full + ks, phase(i));
    tma::bar_sync<2 * 128>(mine);
    wg::fence();
    scores<HS>(s, q_w, r.k + ks * kKeys * HS);
    wg::commit();
    rescale<HS>(o, corr);  // under S_i; O's last product was retired by the previous wait
    tma::mbar_wait(r.bars.v_full + vs, phase(i - 1));
    wg::hold(o);
    wg::hold(pa);
    wg::fence();
    pv<HS>(o, pa, r.v + vs * kKeys * HS);
    wg::commit();
    tma::bar_arrive<2 * 128>(other);
    wg::wait<1>();  // S_i is in; P_{i-1}·V_{i-1} may still run
    wg::hold(s);
    release(r.bars.k_empty + ks, lane);
    if (i == n_visit - 1) release(r.bars.q_empty, lane);  // the tile's last S
    const int key0 = tile_key0(i);
    softmax_tile<NT, kSeg>(s, m, l, corr, sl2, is_masked(key0), key0, row0, T, lane, sr);
    wg::wait<0>();
    wg::hold(o);
    wg::hold(pa);
    release(r.bars.v_empty + vs, lane);
    wg::to_a(s, pa);
  }

  // The last tile's P·V.
  const int vs = slot(n_visit - 1);
  rescale<HS>(o, corr);
  tma::mbar_wait(r.bars.v_full + vs, phase(n_visit - 1));
  tma::bar_sync<2 * 128>(mine);
  wg::hold(o);
  wg::hold(pa);
  wg::fence();
  pv<HS>(o, pa, r.v + vs * kKeys * HS);
  wg::commit();
  tma::bar_arrive<2 * 128>(other);
  wg::wait<0>();
  wg::hold(o);
  wg::hold(pa);
  release(r.bars.v_empty + vs, lane);
  store_rows<HS>(a, o, m, l, b, h, row0, lane);
  return n_visit;
}

// Consumer w's walk over the CTA's work tiles, the ping-pong turns carried across them.
template <int HS, int kStages, bool kSeg>
__device__ __forceinline__ void consume(const FlashForwardArgs& a, const Fa3Ring& r, int w,
                                        const Fa3Work& work) {
  if (w == 1) tma::bar_arrive<2 * 128>(kBarFirst);  // consumer 0 takes the first turn
  uint32_t it = 0;                                  // loads of each ring before the tile's
  for_each_tile(work, [&](int bh, int qb, uint32_t j) {
    it += consume_tile<HS, kStages, kSeg>(a, r, w, bh / a.NH, bh % a.NH, qb * kRowsCta, it, j);
  });
  if (w == 0) tma::bar_sync<2 * 128>(kBarFirst);  // consumer 1's last arrival
}

template <int HS, int kStages, bool kSeg>
__global__ void __launch_bounds__(kThreads, 1)
    fa3_forward_kernel(const __grid_constant__ CUtensorMap map_q,
                       const __grid_constant__ CUtensorMap map_k,
                       const __grid_constant__ CUtensorMap map_v, FlashForwardArgs a,
                       Fa3Work work) {
  using S = Fa3Smem<HS, kStages>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t pad = (1024 - (smem_u32(smem_raw) & 1023)) & 1023;
  unsigned char* base = smem_raw + pad;
  const Fa3Ring r{reinterpret_cast<bf16*>(base + S::kQ), reinterpret_cast<bf16*>(base + S::kK),
                  reinterpret_cast<bf16*>(base + S::kV),
                  Fa3Bars::at<kStages>(reinterpret_cast<uint64_t*>(base + S::kBars)),
                  reinterpret_cast<int*>(base + S::kVisit)};

  if (threadIdx.x == 0) {
    tma::mbar_init(r.bars.q_full, 1);
    tma::mbar_init(r.bars.q_empty, kConsumers * 4);
    for (int s = 0; s < kStages; ++s) {
      tma::mbar_init(r.bars.k_full + s, 1);
      tma::mbar_init(r.bars.v_full + s, 1);
      tma::mbar_init(r.bars.k_empty + s, kConsumers * 4);
      tma::mbar_init(r.bars.v_empty + s, kConsumers * 4);
    }
    tma::mbar_init_fence();
  }
  __syncthreads();  // the last CTA-wide barrier: from here the roles run apart

  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    tma::setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x < 32) produce<HS, kStages, kSeg>(&map_q, &map_k, &map_v, r, a, work);
    return;
  }
  tma::setmaxnreg_inc<kConsumerRegs>();
  consume<HS, kStages, kSeg>(a, r, wg - 1, work);
}

template <int HS, int kStages, bool kSeg>
void launch(const FlashForwardArgs& a, const Fa3Work& work, int ctas, cudaStream_t st) {
  using S = Fa3Smem<HS, kStages>;
  static const bool once = [] {
    CUDA_CHECK(cudaFuncSetAttribute(fa3_forward_kernel<HS, kStages, kSeg>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, S::kBytes));
    return true;
  }();
  (void)once;
  const CUtensorMap mq = tma::head_map(a.q, HS, a.NH, a.Tq, a.B, a.q_ld, a.q_batch, kRowsCta);
  const CUtensorMap mk = tma::head_map(a.k, HS, a.NKV, a.Tk, a.B, a.kv_ld, a.kv_batch, kKeys);
  const CUtensorMap mv = tma::head_map(a.v, HS, a.NKV, a.Tk, a.B, a.kv_ld, a.kv_batch, kKeys);
  fa3_forward_kernel<HS, kStages, kSeg><<<ctas, kThreads, S::kBytes, st>>>(mq, mk, mv, a, work);
  CUDA_CHECK_LAUNCH();
}

// The grid and stages of `schedule` (Note [persistent FA3 forward]).
template <int HS, bool kSeg>
void forward_hs(const FlashForwardArgs& a, Fa3Schedule schedule, int max_ctas, cudaStream_t st) {
  const int64_t nq = ceil_div<int64_t>(a.Tq, kRowsCta);
  GTRON_CHECK(static_cast<int64_t>(a.B) * a.NH * nq <= INT_MAX / 2, "flash_fa3: ", a.B * a.NH,
              " heads of ", nq, " query tiles, expected at most 2^30 tiles (int unit indices)");
  const Fa3Work work{static_cast<int>(nq), a.B * a.NH,
                     schedule == Fa3Schedule::kPersistentPairs ? 1 : 0};
  if (schedule == Fa3Schedule::kTiles) {
    launch<HS, HS == 64 ? 4 : 2, kSeg>(a, work, work.units(), st);
    return;
  }
  int ctas = max_ctas;
  if (ctas == 0) {
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&ctas, cudaDevAttrMultiProcessorCount, dev));
  }
  launch<HS, HS == 64 ? 4 : 3, kSeg>(a, work, std::min(ctas, work.units()), st);
}

}  // namespace

bool flash_fa3_usable(int64_t HS) { return flash_wgmma_usable(HS); }

void flash_fa3_forward(const FlashForwardArgs& args, void* stream, Fa3Schedule schedule,
                       int max_ctas) {
  FlashForwardArgs a = args;
  if (a.NKV == 0) a.NKV = a.NH;
  GTRON_CHECK(a.HS == 64 || a.HS == 128, "flash_fa3: head size ", a.HS, ", expected 64/128");
  GTRON_CHECK(a.NKV > 0 && a.NH % a.NKV == 0, "flash_fa3: ", a.NKV, " k/v heads do not divide ",
              a.NH, " query heads");
  GTRON_CHECK(a.Tq == a.Tk && a.Tq >= 0, "flash_fa3: query length ", a.Tq, " and key length ", a.Tk,
              ", expected equal (self-attention)");
  GTRON_CHECK(a.seg == nullptr || a.seg_batch >= a.Tq, "flash_fa3: segment batch stride ",
              a.seg_batch, " below T = ", a.Tq);
  GTRON_CHECK(a.q_ld % 8 == 0 && a.kv_ld % 8 == 0 && a.o_ld % 8 == 0 && a.q_batch % 8 == 0 &&
                  a.kv_batch % 8 == 0 && a.o_batch % 8 == 0,
              "flash_fa3: row and batch strides must be multiples of 8 elements");
  GTRON_CHECK(
      is_aligned(a.q, 16) && is_aligned(a.k, 16) && is_aligned(a.v, 16) && is_aligned(a.o, 16),
      "flash_fa3: operands must be 16-byte aligned");
  GTRON_CHECK(max_ctas >= 0 && (max_ctas == 0 || schedule != Fa3Schedule::kTiles),
              "flash_fa3: max_ctas ", max_ctas, ", expected >= 0 (0 under kTiles)");
  if (static_cast<int64_t>(a.B) * a.NH * a.Tq == 0) return;
  GTRON_CHECK(flash_fa3_usable(a.HS), "flash_fa3: needs a compute-capability 9.0 GPU (sm_90a)");
  const auto st = static_cast<cudaStream_t>(stream);
  const bool seg = a.seg != nullptr;
  if (a.HS == 64) {
    seg ? forward_hs<64, true>(a, schedule, max_ctas, st)
        : forward_hs<64, false>(a, schedule, max_ctas, st);
  } else {
    seg ? forward_hs<128, true>(a, schedule, max_ctas, st)
        : forward_hs<128, false>(a, schedule, max_ctas, st);
  }
}

}  // namespace gtron::cuda

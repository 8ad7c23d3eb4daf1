// The causal flash-attention forward with FlashAttention-3's structure (Shah et al., 2024), bf16,
// head sizes 64 and 128, built for sm_90a only. Contract in model/ops/flash_fa3.h; the numerics
// (fp32 scores and softmax, exp2 with the scale folded in, P rounded to bf16 for P·V, lse in
// natural log) are those of flash_wgmma_cuda.cu's forward.
//
// Note [FlashAttention-3 forward]
// A CTA of 384 threads owns 128 query rows of one (b, h) and walks the key tiles of 128 that the
// causal mask leaves, from the diagonal down to tile 0 (so the one masked tile comes first):
// - Warpgroup 0 is the producer. It lowers its registers to kProducerRegs (setmaxnreg) and one of
//   its threads issues every load by TMA (a 4-d tensor map of each of q, k, v: head columns,
//   heads, rows, batches, made on the host by tma::head_map, model/cuda/tma_map.h; rows past T
//   land as zeros): Q's 128 rows once, then the K and V tiles into a ring of kStages slots,
//   each slot with a full and an empty mbarrier for K and another pair for V (Note [mbarrier
//   phases] in model/cuda/tma.cuh). K runs a tile ahead of V (K0, K1, V0, K2, V1, ...) because
//   the consumers read tile i's keys with tile i − 1's values.
// - Warpgroups 1 and 2 are the consumers, rows 0..63 and 64..127 of the CTA's tile; each raises
//   its registers to kConsumerRegs. Per key tile i a consumer issues S_i = Q·K_iᵀ (m64n128k16,
//   both operands in shared memory), rescales O by the previous tile's correction, issues
//   O += P_{i−1}·V_{i−1} (P in registers as the A operand, V MN-major, m64n64k16 per 64-column
//   panel), waits for S_i alone (wait_group 1) and releases K_i, runs the online softmax of S_i
//   while P_{i−1}·V_{i−1} is still in flight, then waits for it, releases V_{i−1} and converts
//   S_i to P_i. That is the intra-warpgroup overlap: one tile's softmax under the previous
//   tile's P·V.
// - Ping-pong (Note [consumer ping-pong]): named barriers let the two consumers issue their
//   products in turns, so one warpgroup's softmax runs while the other's products hold the
//   tensor cores.
// - Scheduling: grid (B·NH, query tiles), the query tile taken from the top (qb = last − y), so
//   the CTAs with the most key tiles start first whatever the number of heads; consecutive CTAs
//   are heads of one batch, which share k/v heads under GQA and so hit L2.
// Results: o and lse as the other flash forwards within fp32 summation order (key tiles are
// summed from the diagonal down here); two runs are bit-identical (no atomics; every CTA's order
// is fixed).
//
// Shared memory (kStages slots, each a K and a V tile of 128 rows):
//   HS 64:  Q 16 KB + 4 × (16 + 16) KB = 144 KB (+ barriers, 1 KB alignment)
//   HS 128: Q 32 KB + 2 × (32 + 32) KB = 160 KB (3 stages, 224 KB, would also fit the 227 KB)
// Registers: 384 threads at one CTA an SM give ptxas 168 a thread (65536 / 384, rounded down to
// 8); setmaxnreg then moves them from the producer (kProducerRegs = 24) to the consumers
// (kConsumerRegs = 240): 128·24 + 256·240 = 64512 of 65536. A consumer at HS 128 holds O (64
// fp32), S (64), P (32 bf16 pairs) and the softmax state: ptxas (CUDA 13.0), which allocates the
// code after each setmaxnreg within its budget, spills it at 184 and fits it at 200 (HS 64:
// spills at 152, fits at 168).
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
#include "model/ops/flash_wgmma.h"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "flash_fa3_cuda.cu is built for sm_90a only (bazel/cuda.bzl SM90A)"
#endif

namespace gtron::cuda {

namespace {

constexpr int kConsumers = 2;                     // consumer warpgroups
constexpr int kRowsWg = 64;                       // query rows of a consumer warpgroup
constexpr int kRowsCta = kConsumers * kRowsWg;    // query rows of a CTA
constexpr int kKeys = 128;                        // keys of a tile (N of S = Q·Kᵀ)
constexpr int kThreads = 128 * (1 + kConsumers);  // producer warpgroup + consumers
constexpr int kProducerRegs = 24;
constexpr int kConsumerRegs = 240;
constexpr int kBarFirst = 1;  // named barrier of consumer w: kBarFirst + w (0 is __syncthreads')
constexpr int kPanel = 64;    // bf16 columns of a 128-byte swizzled panel

// Where everything sits in the (1024-byte aligned) dynamic shared memory. A [rows, HS] tile is
// HS/64 panels of [rows, 64], panel p at element p·rows·64: the layout TMA writes with the
// 128-byte swizzle and wg::desc describes (Note [wgmma operands]).
template <int HS>
struct Fa3Smem {
  static constexpr int kStages = HS == 64 ? 4 : 2;
  static constexpr int kQBytes = kRowsCta * HS * 2;
  static constexpr int kTileBytes = kKeys * HS * 2;  // one K or V tile
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + kQBytes;
  static constexpr int kV = kK + kStages * kTileBytes;
  static constexpr int kBars = kV + kStages * kTileBytes;
  // Q full; K full, V full, K empty, V empty per slot.
  static constexpr int kNumBars = 1 + 4 * kStages;
  static constexpr int kBytes = kBars + kNumBars * 8 + 1024;  // + the alignment pad
};

// The CTA's barriers: full ones get the producer's expect_tx and the bytes; empty ones one arrival
// per consumer warp that read the slot.
struct Fa3Bars {
  uint64_t* q_full;
  uint64_t *k_full, *v_full, *k_empty, *v_empty;  // [kStages] each
  template <int kStages>
  __device__ __forceinline__ static Fa3Bars at(uint64_t* base) {
    return {base, base + 1, base + 1 + kStages, base + 1 + 2 * kStages, base + 1 + 3 * kStages};
  }
};

// The producer thread: Q once, then K_i and V_i of tile order i < n_visit (key tile n_tiles −
// 1 − i) into slot i % kStages, K one tile ahead of V (Note [FlashAttention-3 forward]).
template <int HS>
__device__ __forceinline__ void produce(const CUtensorMap* mq, const CUtensorMap* mk,
                                        const CUtensorMap* mv, bf16* sQ, bf16* sK, bf16* sV,
                                        const Fa3Bars& bars, int b, int h, int hk, int q0,
                                        int n_tiles, int n_visit) {
  using S = Fa3Smem<HS>;
  tma::prefetch_map(mq);
  tma::prefetch_map(mk);
  tma::prefetch_map(mv);
  tma::mbar_expect_tx(bars.q_full, S::kQBytes);
#pragma unroll
  for (int p = 0; p < HS / kPanel; ++p) {
    tma::load_4d(sQ + p * kRowsCta * kPanel, mq, bars.q_full, p * kPanel, h, q0, b);
  }
  auto fill = [&](const CUtensorMap* map, bf16* ring, uint64_t* full, uint64_t* empty, int i) {
    const int slot = i % S::kStages, use = i / S::kStages;
    tma::mbar_wait(empty + slot, (use & 1) ^ 1);
    tma::mbar_expect_tx(full + slot, S::kTileBytes);
    bf16* tile = ring + slot * kKeys * HS;
    const int key0 = (n_tiles - 1 - i) * kKeys;
#pragma unroll
    for (int p = 0; p < HS / kPanel; ++p) {
      tma::load_4d(tile + p * kKeys * kPanel, map, full + slot, p * kPanel, hk, key0, b);
    }
  };
  fill(mk, sK, bars.k_full, bars.k_empty, 0);
  for (int i = 1; i < n_visit; ++i) {
    fill(mk, sK, bars.k_full, bars.k_empty, i);
    fill(mv, sV, bars.v_full, bars.v_empty, i - 1);
  }
  fill(mv, sV, bars.v_full, bars.v_empty, n_visit - 1);
}

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
// read the slot.
__device__ __forceinline__ void release(uint64_t* bar, int lane) {
  if (lane == 0) tma::mbar_arrive(bar);
}

// Note [consumer ping-pong]
// Consumer w issues its products between bar_sync(kBarFirst + w) and bar_arrive(kBarFirst + 1 −
// w), both over the 256 consumer threads: a sync completes when the 128 threads of w have synced
// and the 128 of the other consumer have arrived, so the two issue in turns, consumer 0 first
// (consumer 1 arrives once on barrier kBarFirst before its first turn). Each consumer takes
// n_visit + 1 turns (S of the first tile; S and P·V of each further tile; the last P·V). Consumer
// 1 then has arrived n_visit + 2 times on consumer 0's barrier, so consumer 0 syncs once more at
// the end and no barrier is left with arrivals in flight when the CTA exits.
template <int HS, bool kSeg>
__device__ __forceinline__ void consume(const FlashForwardArgs& a, const bf16* sQ, const bf16* sK,
                                        const bf16* sV, const Fa3Bars& bars, int w, int b, int h,
                                        int q0, int n_tiles, int n_visit) {
  using S = Fa3Smem<HS>;
  constexpr int NT = kKeys / 8;
  const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
  const int warp_row = q0 + w * kRowsWg + warp * 16;  // the warp's first row
  const int row0 = warp_row + (lane >> 2);            // this lane's rows: row0, row0 + 8
  const bf16* q_w = sQ + w * kRowsWg * kPanel;        // this warpgroup's rows of Q's panel 0
  const int mine = kBarFirst + w, other = kBarFirst + 1 - w;
  const float sl2 = a.scale * kLog2e;
  const int T = a.Tq;

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

  if (w == 1) tma::bar_arrive<2 * 128>(kBarFirst);  // consumer 0 takes the first turn
  tma::mbar_wait(bars.q_full, 0);

  // Tile 0 (the diagonal): scores alone.
  tma::mbar_wait(bars.k_full, 0);
  tma::bar_sync<2 * 128>(mine);
  wg::fence();
  scores<HS>(s, q_w, sK);
  wg::commit();
  tma::bar_arrive<2 * 128>(other);
  wg::wait<0>();
  wg::hold(s);
  release(bars.k_empty, lane);
  softmax_tile<NT, kSeg>(s, m, l, corr, sl2, is_masked(tile_key0(0)), tile_key0(0), row0, T, lane,
                         sr);
  wg::to_a(s, pa);

  for (int i = 1; i < n_visit; ++i) {
    const int ks = i % S::kStages, vs = (i - 1) % S::kStages;
    tma::mbar_wait(bars.k_full + ks, (i / S::kStages) & 1);
    tma::bar_sync<2 * 128>(mine);
    wg::fence();
    scores<HS>(s, q_w, sK + ks * kKeys * HS);
    wg::commit();
    rescale<HS>(o, corr);  // under S_i; O's last product was retired by the previous wait
    tma::mbar_wait(bars.v_full + vs, ((i - 1) / S::kStages) & 1);
    wg::hold(o);
    wg::hold(pa);
    wg::fence();
    pv<HS>(o, pa, sV + vs * kKeys * HS);
    wg::commit();
    tma::bar_arrive<2 * 128>(other);
    wg::wait<1>();  // S_i is in; P_{i-1}·V_{i-1} may still run
    wg::hold(s);
    release(bars.k_empty + ks, lane);
    const int key0 = tile_key0(i);
    softmax_tile<NT, kSeg>(s, m, l, corr, sl2, is_masked(key0), key0, row0, T, lane, sr);
    wg::wait<0>();
    wg::hold(o);
    wg::hold(pa);
    release(bars.v_empty + vs, lane);
    wg::to_a(s, pa);
  }

  // The last tile's P·V.
  const int vs = (n_visit - 1) % S::kStages;
  rescale<HS>(o, corr);
  tma::mbar_wait(bars.v_full + vs, ((n_visit - 1) / S::kStages) & 1);
  tma::bar_sync<2 * 128>(mine);
  wg::hold(o);
  wg::hold(pa);
  wg::fence();
  pv<HS>(o, pa, sV + vs * kKeys * HS);
  wg::commit();
  tma::bar_arrive<2 * 128>(other);
  wg::wait<0>();
  wg::hold(o);
  wg::hold(pa);
  release(bars.v_empty + vs, lane);
  if (w == 0)
    tma::bar_sync<2 * 128>(mine);  // consumer 1's last arrival (Note [consumer ping-pong])

  // o / l and lse, rows below T.
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

template <int HS, bool kSeg>
__global__ void __launch_bounds__(kThreads, 1)
    fa3_forward_kernel(const __grid_constant__ CUtensorMap map_q,
                       const __grid_constant__ CUtensorMap map_k,
                       const __grid_constant__ CUtensorMap map_v, FlashForwardArgs a) {
  using S = Fa3Smem<HS>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t pad = (1024 - (smem_u32(smem_raw) & 1023)) & 1023;
  unsigned char* base = smem_raw + pad;
  bf16* sQ = reinterpret_cast<bf16*>(base + S::kQ);
  bf16* sK = reinterpret_cast<bf16*>(base + S::kK);
  bf16* sV = reinterpret_cast<bf16*>(base + S::kV);
  const Fa3Bars bars = Fa3Bars::at<S::kStages>(reinterpret_cast<uint64_t*>(base + S::kBars));

  const int b = blockIdx.x / a.NH, h = blockIdx.x % a.NH;
  const int hk = h / (a.NH / a.NKV);                       // Note [grouped-query flash attention]
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kRowsCta;  // the longest rows first
  const int n_tiles = (min(a.Tq, q0 + kRowsCta) + kKeys - 1) / kKeys;
  int j0 = 0;  // the lowest key tile walked (Note [document masking in the FA3 forward])
  if constexpr (kSeg) {
    SegRows sr;
    sr.row = a.seg + b * a.seg_batch;
    j0 = first_key_tile<kKeys, kThreads>(sr, q0, n_tiles, a.Tq);
  }
  const int n_visit = n_tiles - j0;  // >= 1: tile n_tiles − 1 holds query q0's own key

  if (threadIdx.x == 0) {
    tma::mbar_init(bars.q_full, 1);
    for (int s = 0; s < S::kStages; ++s) {
      tma::mbar_init(bars.k_full + s, 1);
      tma::mbar_init(bars.v_full + s, 1);
      tma::mbar_init(bars.k_empty + s, kConsumers * 4);
      tma::mbar_init(bars.v_empty + s, kConsumers * 4);
    }
    tma::mbar_init_fence();
  }
  __syncthreads();  // the last CTA-wide barrier: from here the roles run apart

  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    tma::setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x == 0)
      produce<HS>(&map_q, &map_k, &map_v, sQ, sK, sV, bars, b, h, hk, q0, n_tiles, n_visit);
    return;
  }
  tma::setmaxnreg_inc<kConsumerRegs>();
  consume<HS, kSeg>(a, sQ, sK, sV, bars, wg - 1, b, h, q0, n_tiles, n_visit);
}

template <int HS, bool kSeg>
void forward_hs(const FlashForwardArgs& a, cudaStream_t st) {
  using S = Fa3Smem<HS>;
  static const bool once = [] {
    CUDA_CHECK(cudaFuncSetAttribute(fa3_forward_kernel<HS, kSeg>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, S::kBytes));
    return true;
  }();
  (void)once;
  const CUtensorMap mq = tma::head_map(a.q, HS, a.NH, a.Tq, a.B, a.q_ld, a.q_batch, kRowsCta);
  const CUtensorMap mk = tma::head_map(a.k, HS, a.NKV, a.Tk, a.B, a.kv_ld, a.kv_batch, kKeys);
  const CUtensorMap mv = tma::head_map(a.v, HS, a.NKV, a.Tk, a.B, a.kv_ld, a.kv_batch, kKeys);
  const dim3 grid(static_cast<unsigned>(a.B * a.NH),
                  static_cast<unsigned>(ceil_div<int64_t>(a.Tq, kRowsCta)));
  fa3_forward_kernel<HS, kSeg><<<grid, kThreads, S::kBytes, st>>>(mq, mk, mv, a);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

bool flash_fa3_usable(int64_t HS) { return flash_wgmma_usable(HS); }

void flash_fa3_forward(const FlashForwardArgs& args, void* stream) {
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
  if (static_cast<int64_t>(a.B) * a.NH * a.Tq == 0) return;
  GTRON_CHECK(flash_fa3_usable(a.HS), "flash_fa3: needs a compute-capability 9.0 GPU (sm_90a)");
  const auto st = static_cast<cudaStream_t>(stream);
  const bool seg = a.seg != nullptr;
  if (a.HS == 64) {
    seg ? forward_hs<64, true>(a, st) : forward_hs<64, false>(a, st);
  } else {
    seg ? forward_hs<128, true>(a, st) : forward_hs<128, false>(a, st);
  }
}

}  // namespace gtron::cuda

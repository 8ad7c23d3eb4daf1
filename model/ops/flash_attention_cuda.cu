// Flash attention on CUDA (the FlashAttention-2 algorithm) for causal attention in bf16, head
// sizes 64 and 128: bf16 tensor-core MMA (mma.sync m16n8k16, operands through ldmatrix from
// XOR-swizzled shared memory, tiles brought in by cp.async double buffering), fp32 accumulators
// and softmax statistics, no O(T²) memory. Contract in model/ops/attention.h.
//
// Note [flash attention tiling]
// A CTA is 4 warps; each warp owns 16 rows of the CTA's 64-row tile, so the softmax statistics of
// a row live in the 4 lanes of one quad and never cross warps.
// - Forward: a CTA takes 64 queries of one (b, h) and walks the key tiles 0 .. the diagonal; per
//   tile S = Q·Kᵀ (fp32), online softmax (running max m and sum l per row, exp2 with the scale
//   folded into log2 units), O += P·V with P rounded to bf16. It writes O and lse = m + log l
//   (natural log, the CPU kernel's contract).
// - Backward, two kernels, neither with atomics (determinism): the key kernel takes 64 keys and
//   walks the query tiles from the diagonal to the end, accumulating dV += Pᵀ·dO and
//   dK += dSᵀ·Q in registers; the query kernel takes 64 queries and walks the key tiles up to the
//   diagonal, accumulating dQ += dS·K. Both recompute P = exp(scale·S − lse) tile by tile, with
//   dS = P ⊙ (dP − Δ), Δ = rowsum(dO ⊙ O) from a small pre-pass. The price of no atomics is the
//   recomputation of S and dP in the query kernel (7 tile products instead of 5). Tried on the
//   H200 (GPT-2 124M, 12 layers): dQ folded into the key kernel, each query tile's parts added in
//   key-block order through an fp32 sum in L2 (CTA j waits on an acquire flag set by CTA j − 1):
//   14.6 ms against 5.4 for the two kernels. A hand-off (~2.5 µs of L2 round trips) costs about
//   a tile's compute, and the key blocks with few tiles sit idle while the chain reaches them.
// - Causal mask with a key length Tk ≥ query length Tq: query i sees keys j ≤ i + (Tk − Tq) (the
//   last query sees every key), so decoding against a cache uses the same kernel. Rows past Tq and
//   keys past Tk are zero-filled by cp.async and masked; only tiles that cross the diagonal or the
//   tail pay for the mask.
// - The MMA fragment of a 16×8 fp32 accumulator is, pairwise, the A fragment of a 16×16 bf16
//   operand (rows lane/4 and lane/4 + 8, columns 2·(lane%4) + {0, 1}), so P and dS go from
//   accumulators to the next product without touching shared memory.
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <cmath>

#include "model/cuda/kernel_util.cuh"
#include "model/cuda/mma_tile.cuh"
#include "model/ops/attention.h"
#include "model/ops/flash_common.cuh"
#include "model/ops/flash_fa3.h"
#include "model/ops/flash_wgmma.h"

namespace gtron::cuda {

// ---------------------------------------------------------------------------------------------
// Forward.

namespace {

// Row tiles of 16 per warp in the forward. HS = 64: 2, so a CTA takes 128 queries and each K/V
// fragment read from shared memory feeds two products (half the shared-memory traffic per FLOP);
// HS = 128: 1 (two tiles would spill registers). Measured on the H200 (GPT-2 124M, 12 layers):
// 1.89 ms with one tile, 1.86 ms with two — the forward is not bound by shared-memory reads.
// Also tried: one tile per warp with the next key tile's scores issued before this tile's softmax
// (keys loaded two tiles ahead, one barrier per tile): 1.97 ms against 1.77 for two tiles.
template <int HS>
__host__ __device__ constexpr int fwd_mt() {
  return HS == 64 ? 2 : 1;
}

template <int HS>
constexpr int fwd_smem_bytes() {
  return (kRows * fwd_mt<HS>() + 4 * kRows) * HS * 2;  // Q, K[2], V[2]
}

// kSeg: with document masking (Note [document masking in the flash kernels]).
template <int HS, bool kSeg>
__global__ void __launch_bounds__(kThreadsFa) flash_forward_kernel(FlashForwardArgs a) {
  constexpr int kN = 64;  // keys per tile
  constexpr int NT = kN / 8;
  constexpr int MT = fwd_mt<HS>();
  constexpr int kBM = kRows * MT;  // queries per CTA
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);
  bf16* sK = sQ + kBM * HS;
  bf16* sV = sK + 2 * kN * HS;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int qb = gridDim.x - 1 - blockIdx.x;  // the longest rows first
  const int b = blockIdx.y / a.NH, h = blockIdx.y % a.NH;
  const int hk = h / (a.NH / a.NKV);  // Note [grouped-query flash attention]
  const int q0 = qb * kBM;
  const int off = a.Tk - a.Tq;
  const bf16* gq = static_cast<const bf16*>(a.q) + b * a.q_batch + h * HS;
  const bf16* gk = static_cast<const bf16*>(a.k) + b * a.kv_batch + hk * HS;
  const bf16* gv = static_cast<const bf16*>(a.v) + b * a.kv_batch + hk * HS;

  load_tile<HS, kBM, kThreadsFa>(sQ, gq, a.q_ld, q0, a.Tq);
  const int kv_end = min(a.Tk, q0 + kBM + off);
  const int n_tiles = (kv_end + kN - 1) / kN;
  int j0 = 0;  // the first key tile (Note [document masking in the flash kernels])
  SegRows sr[MT];
  int32_t last_seg = 0;  // of the warp's last query
  if constexpr (kSeg) {
    sr[0].row = a.seg + b * a.seg_batch;
    j0 = first_key_tile<kN>(sr[0], q0, n_tiles, a.Tq);
#pragma unroll
    for (int t = 0; t < MT; ++t) {
      sr[t].row = sr[0].row;
      const int r = q0 + (warp * MT + t) * 16 + (lane >> 2);
      sr[t].own[0] = sr[t].at(r, a.Tq);
      sr[t].own[1] = sr[t].at(r + 8, a.Tq);
    }
    last_seg = sr[0].at(q0 + (warp + 1) * 16 * MT - 1, a.Tq);
  }
  load_tile<HS, kN, kThreadsFa>(sK, gk, a.kv_ld, j0 * kN, a.Tk);
  load_tile<HS, kN, kThreadsFa>(sV, gv, a.kv_ld, j0 * kN, a.Tk);
  cp_async_commit();

  float o[MT][HS / 8][4] = {};
  float m[MT][2], l[MT][2];
#pragma unroll
  for (int t = 0; t < MT; ++t) m[t][0] = m[t][1] = -INFINITY, l[t][0] = l[t][1] = 0.0f;
  uint32_t qf[MT][HS / 16][4];
  const float sl2 = a.scale * kLog2e;
  const int warp_row0 = q0 + warp * 16 * MT;  // this warp's first query

  for (int j = j0; j < n_tiles; ++j) {
    next_kv_tile<HS, kN>(sK, sV, gk, gv, a.kv_ld, j, n_tiles, a.Tk, j0);
    if (j == j0) {
#pragma unroll
      for (int t = 0; t < MT; ++t) load_a<HS>(qf[t], sQ, (warp * MT + t) * 16, lane);
    }
    const bf16* kt = sK + ((j - j0) & 1) * kN * HS;
    const bf16* vt = sV + ((j - j0) & 1) * kN * HS;
    float s[MT][NT][4] = {};
    mma_abt<HS, NT, MT>(s, qf, kt, lane);
    const int k0 = j * kN;
    bool masked = k0 + kN - 1 > warp_row0 + off || k0 + kN > a.Tk;
    if constexpr (kSeg) masked = masked || sr[0].row[k0] != last_seg;
#pragma unroll
    for (int t = 0; t < MT; ++t) {
      online_softmax<HS, NT, kSeg>(s[t], o[t], m[t], l[t], warp_row0 + t * 16 + (lane >> 2), k0,
                                   masked, a, lane, sl2, sr[t]);
    }
    mma_pv<HS, kN / 16, MT>(o, s, vt, lane);
    __syncthreads();  // the next iteration's loads overwrite this tile's buffers
  }

  bf16* go = static_cast<bf16*>(a.o) + b * a.o_batch + h * HS;
#pragma unroll
  for (int t = 0; t < MT; ++t) {
    float inv[2];
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const float lt = quad_sum(l[t][rr]);
      inv[rr] = 1.0f / lt;
      const int row = warp_row0 + t * 16 + (lane >> 2) + rr * 8;
      if ((lane & 3) == 0 && row < a.Tq) {
        a.lse[static_cast<int64_t>(blockIdx.y) * a.Tq + row] = (m[t][rr] + log2f(lt)) * kLn2;
      }
    }
    store_rows<HS>(o[t], go, a.o_ld, warp_row0 + t * 16, a.Tq, lane, inv, false);
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Backward.

namespace {

// Δ[bh, t] = Σ_c dO[b, t, h, c] · O[b, t, h, c] in fp32. HS/8 threads per (b, t, h), 16-byte
// loads, the group's partial sums added by an xor butterfly (fixed order). Rows past the end
// recompute row 0 and store nothing.
template <int HS>
__global__ void flash_delta_kernel(FlashBackwardArgs a, float* __restrict__ delta) {
  constexpr int kGroup = HS / 8;
  const int64_t w = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kGroup;
  const int lane = threadIdx.x % kGroup;
  const int64_t rows = static_cast<int64_t>(a.B) * a.T * a.NH;
  const bool valid = w < rows;  // every lane stays for the shuffles below
  const int64_t r = valid ? w : 0;
  const int h = static_cast<int>(r % a.NH);
  const int64_t bt = r / a.NH;
  const int t = static_cast<int>(bt % a.T);
  const int b = static_cast<int>(bt / a.T);
  const int64_t at = b * a.o_batch + t * a.o_ld + h * HS;
  float x[8], y[8];
  load_floats<8>(static_cast<const bf16*>(a.o) + at + lane * 8, x);
  load_floats<8>(static_cast<const bf16*>(a.dout) + at + lane * 8, y);
  float sum = 0.0f;
#pragma unroll
  for (int k = 0; k < 8; ++k) sum += x[k] * y[k];
#pragma unroll
  for (int o = kGroup / 2; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o, kGroup);
  if (valid && lane == 0) delta[(static_cast<int64_t>(b) * a.NH + h) * a.T + t] = sum;
}

template <int HS, int kQ>
constexpr int bwd_kv_smem_bytes() {
  return (2 * kRows + 4 * kQ) * HS * 2 + 4 * kQ * 4;  // K, V, Q[2], dO[2], lse[2], Δ[2]
}

// dK and dV of 64 keys of one (b, k/v head), over the query tiles from the diagonal on of each
// query head that reads it (Note [grouped-query flash attention]).
template <int HS, int kQ, bool kRope, bool kSeg>
__global__ void __launch_bounds__(kThreadsFa)
    flash_backward_kv_kernel(FlashBackwardArgs a, const float* __restrict__ delta) {
  constexpr int NT = kQ / 8;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* sK = reinterpret_cast<bf16*>(smem_raw);
  bf16* sV = sK + kRows * HS;
  bf16* sQ = sV + kRows * HS;
  bf16* sO = sQ + 2 * kQ * HS;  // dO tiles
  float* sL = reinterpret_cast<float*>(sO + 2 * kQ * HS);
  float* sD = sL + 2 * kQ;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int k0 = blockIdx.x * kRows;  // the longest columns first: key tile 0 sees every query
  KeyWalk walk(a, k0, kQ);
  const int b = walk.b, hk = walk.hk;
  const int64_t ld = a.qkv_ld;
  const bf16* row = static_cast<const bf16*>(a.qkv) + b * a.qkv_batch;

  auto load_q_tile = [&](int i, int buf) {
    const BackwardHead<HS> head(a, delta, b, walk.head(i));
    load_query_tile<HS, kQ>(sQ, sO, sL, sD, head.q, head.dout, ld, a.o_ld, head.lse, head.delta,
                            walk.tile(i), buf, a.T);
  };

  load_tile<HS, kRows, kThreadsFa>(sK, row + k_column(a, hk), ld, k0, a.T);
  load_tile<HS, kRows, kThreadsFa>(sV, row + v_column(a, hk), ld, k0, a.T);
  load_q_tile(0, 0);
  cp_async_commit();

  float dk[HS / 8][4] = {}, dv[HS / 8][4] = {};
  const float sl2 = a.scale * kLog2e;
  const int key_base = k0 + warp * 16 + (lane >> 2);
  uint32_t kf[HS / 16][4], vf[HS / 16][4];
  // The first query tile loads the same whatever the walk's length: it is cut here.
  SegRows sr;             // the keys' segments (Note [document masking in the flash kernels])
  int32_t first_seg = 0;  // of the warp's first key
  if constexpr (kSeg) {
    sr.row = a.seg + b * a.seg_batch;
    walk.keep_segment<kQ>(sr, sr.at(k0 + kRows - 1, a.T), a.T);
    sr.own[0] = sr.at(key_base, a.T);
    sr.own[1] = sr.at(key_base + 8, a.T);
    first_seg = sr.at(k0 + warp * 16, a.T);
  }

  for (int it = 0; it < walk.n; ++it) {
    const int buf = it & 1;
    if (it + 1 < walk.n) {
      load_q_tile(it + 1, buf ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (it == 0) {
      load_a<HS>(kf, sK, warp * 16, lane);
      load_a<HS>(vf, sV, warp * 16, lane);
    }
    const bf16* qtile = sQ + buf * kQ * HS;
    const bf16* otile = sO + buf * kQ * HS;
    const float* L = sL + buf * kQ;
    const float* D = sD + buf * kQ;

    float p[NT][4] = {};  // Sᵀ, then Pᵀ: [16 keys, kQ queries]
    mma_abt<HS, NT>(p, kf, qtile, lane);
    float ds[NT][4] = {};  // dPᵀ, then dSᵀ
    mma_abt<HS, NT>(ds, vf, otile, lane);
    const int qs0 = walk.tile(it) * kQ;
    // Only the tile on the diagonal and the tails see dead (query, key) pairs (and, with kSeg,
    // tiles that cross a document boundary).
    bool masked = qs0 < k0 + kRows || qs0 + kQ > a.T || k0 + kRows > a.T;
    if constexpr (kSeg) masked = masked || sr.at(qs0 + kQ - 1, a.T) != first_seg;
    key_tile_grads<NT, kSeg>(p, ds, L, D, sl2, qs0, key_base, masked, a.T, lane, sr);
    mma_pv<HS, kQ / 16>(dv, p, otile, lane);
    mma_pv<HS, kQ / 16>(dk, ds, qtile, lane);
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

template <int HS, int kN>
constexpr int bwd_q_smem_bytes() {
  return (2 * kRows + 4 * kN) * HS * 2;  // Q, dO, K[2], V[2]
}

// dQ of 64 queries of one (b, h), over the key tiles (of its k/v head) up to the diagonal.
template <int HS, int kN, bool kRope, bool kSeg>
__global__ void __launch_bounds__(kThreadsFa)
    flash_backward_q_kernel(FlashBackwardArgs a, const float* __restrict__ delta) {
  constexpr int NT = kN / 8;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);
  bf16* sO = sQ + kRows * HS;
  bf16* sK = sO + kRows * HS;
  bf16* sV = sK + 2 * kN * HS;

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
    j0 = first_key_tile<kN>(sr, q0, (min(a.T, q0 + kRows) + kN - 1) / kN, a.T);
  }
  load_tile<HS, kRows, kThreadsFa>(sQ, gq, ld, q0, a.T);
  load_tile<HS, kRows, kThreadsFa>(sO, gdo, a.o_ld, q0, a.T);
  load_tile<HS, kN, kThreadsFa>(sK, gk, ld, j0 * kN, a.T);
  load_tile<HS, kN, kThreadsFa>(sV, gv, ld, j0 * kN, a.T);
  cp_async_commit();
  const int n_tiles = (min(a.T, q0 + kRows) + kN - 1) / kN;

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
    D[rr] = row < a.T ? delta[i] : 0.0f;
  }
  float dq[HS / 8][4] = {};
  uint32_t qf[HS / 16][4], of[HS / 16][4];
  const float sl2 = a.scale * kLog2e;

  for (int j = j0; j < n_tiles; ++j) {
    next_kv_tile<HS, kN>(sK, sV, gk, gv, ld, j, n_tiles, a.T, j0);
    if (j == j0) {
      load_a<HS>(qf, sQ, warp * 16, lane);
      load_a<HS>(of, sO, warp * 16, lane);
    }
    const bf16* kt = sK + ((j - j0) & 1) * kN * HS;
    const bf16* vt = sV + ((j - j0) & 1) * kN * HS;
    float p[NT][4] = {};
    mma_abt<HS, NT>(p, qf, kt, lane);
    float ds[NT][4] = {};
    mma_abt<HS, NT>(ds, of, vt, lane);
    const int k0 = j * kN;
    // Only the tile on the diagonal and the key tail see dead (query, key) pairs (and, with
    // kSeg, tiles that cross a document boundary).
    bool masked = k0 + kN > q0 || k0 + kN > a.T;
    if constexpr (kSeg) masked = masked || sr.row[k0] != last_seg;
    query_tile_grads<NT, kSeg>(p, ds, L, D, sl2, k0, row_base, masked, a.T, lane, sr);
    mma_pv<HS, kN / 16>(dq, ds, kt, lane);
    __syncthreads();
  }
  const float sc[2] = {a.scale, a.scale};
  bf16* dq_base = static_cast<bf16*>(a.dqkv) + b * a.qkv_batch + h * HS;
  __shared__ float red[4 * HS];  // Note [qkv bias partials]
  store_grad_rows<HS, kRope>(dq, dq_base, a, b, qb, h * HS, q0 + warp * 16, lane, warp, sc, red,
                             true);
}

template <typename Kernel>
void set_smem(Kernel k, int bytes) {
  CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

template <int HS, bool kSeg>
void forward_hs(const FlashForwardArgs& a, cudaStream_t st) {
  constexpr int smem = fwd_smem_bytes<HS>();
  static const bool once = (set_smem(flash_forward_kernel<HS, kSeg>, smem), true);
  (void)once;
  const dim3 grid(static_cast<unsigned>(ceil_div<int64_t>(a.Tq, kRows * fwd_mt<HS>())),
                  static_cast<unsigned>(a.B * a.NH));
  flash_forward_kernel<HS, kSeg><<<grid, kThreadsFa, smem, st>>>(a);
  CUDA_CHECK_LAUNCH();
}

// Key tile of the query kernel and query tile of the key kernel: 64 for HS = 64, 32 for HS = 128
// (the register budget of four 16×HS fp32 accumulators' worth of state per warp).
template <int HS>
constexpr int bwd_tile() {
  return HS == 64 ? 64 : 32;
}

template <int HS, bool kRope, bool kSeg>
void backward_hs(const FlashBackwardArgs& a, float* delta, cudaStream_t st) {
  constexpr int kT = bwd_tile<HS>();
  constexpr int smem_kv = bwd_kv_smem_bytes<HS, kT>();
  constexpr int smem_q = bwd_q_smem_bytes<HS, kT>();
  static const bool once = (set_smem(flash_backward_kv_kernel<HS, kT, kRope, kSeg>, smem_kv),
                            set_smem(flash_backward_q_kernel<HS, kT, kRope, kSeg>, smem_q), true);
  (void)once;
  if (flash_wgmma_usable(HS)) {
    flash_wgmma_backward(a, delta, st);  // forms Δ itself
    return;
  }
  const int64_t rows = static_cast<int64_t>(a.B) * a.T * a.NH;
  flash_delta_kernel<HS>
      <<<static_cast<unsigned>(ceil_div<int64_t>(rows * (HS / 8), 256)), 256, 0, st>>>(a, delta);
  CUDA_CHECK_LAUNCH();
  const unsigned row_tiles = static_cast<unsigned>(ceil_div<int64_t>(a.T, kRows));
  const dim3 kv_grid(row_tiles, static_cast<unsigned>(a.B * a.NKV));
  flash_backward_kv_kernel<HS, kT, kRope, kSeg><<<kv_grid, kThreadsFa, smem_kv, st>>>(a, delta);
  CUDA_CHECK_LAUNCH();
  const dim3 q_grid(row_tiles, static_cast<unsigned>(a.B * a.NH));
  flash_backward_q_kernel<HS, kT, kRope, kSeg><<<q_grid, kThreadsFa, smem_q, st>>>(a, delta);
  CUDA_CHECK_LAUNCH();
}

// Note [Hopper attention choice]
// Two kernel families serve HS 64/128 on an sm_90 GPU: the one-warpgroup wgmma kernels
// (flash_wgmma_cuda.cu) and the FlashAttention-3-structured ones (flash_fa3*_cuda.cu). Until the
// sweep (tests/model/bench_attention.cc) and the end-to-end step have measured both on a GPU, the
// wgmma kernels stay the default and kFa3 is opt-in; the choice lives here and nowhere else. The
// fa3 kernels take document masking (seg) and the backward's column partials, but not
// generation's Tk > Tq: those forwards keep the wgmma (or mma.sync) kernels whatever the setting.
// kFa3's forward walks Fa3Schedule::kPersistentPairs: of the three schedules (the same bits) it
// was the fastest in every cell of the first sweep on an H100 (causal, 16k tokens: HS 128 T 2048
// 465 TFLOP/s against kTiles' 321 and the wgmma kernel's 423; T 8192 596 / 562 / 481; HS 64 T 2048
// 344 / 287 / 348; T 8192 417 / 401 / 406; docs/measurements.md), and the fa3 backward beat the
// wgmma one in all four (310 / 284, 334 / 304, 277 / 257, 310 / 279).
std::atomic<HopperFlash> g_hopper_flash{HopperFlash::kWgmma};

bool fa3_forward_applies(const FlashForwardArgs& a) {
  return g_hopper_flash.load(std::memory_order_relaxed) == HopperFlash::kFa3 && a.Tq == a.Tk &&
         flash_fa3_usable(a.HS);
}

bool fa3_backward_applies(const FlashBackwardArgs& a) {
  return g_hopper_flash.load(std::memory_order_relaxed) == HopperFlash::kFa3 &&
         flash_fa3_usable(a.HS);
}

}  // namespace

void set_hopper_flash(HopperFlash kind) { g_hopper_flash.store(kind); }

HopperFlash hopper_flash() { return g_hopper_flash.load(); }

bool flash_attention_supported(int64_t HS, DType act) {
  return act == DType::kBF16 && (HS == 64 || HS == 128);
}

void flash_attention_forward(const FlashForwardArgs& args, void* stream) {
  FlashForwardArgs a = args;
  if (a.NKV == 0) a.NKV = a.NH;
  GTRON_CHECK(a.HS == 64 || a.HS == 128, "flash_attention: head size ", a.HS, ", expected 64/128");
  GTRON_CHECK(a.NKV > 0 && a.NH % a.NKV == 0, "flash_attention: ", a.NKV,
              " k/v heads do not divide ", a.NH, " query heads");
  GTRON_CHECK(a.Tk >= a.Tq && a.Tq >= 0, "flash_attention: key length ", a.Tk,
              " below query length ", a.Tq);
  GTRON_CHECK(a.q_ld % 8 == 0 && a.kv_ld % 8 == 0 && a.o_ld % 8 == 0 && a.q_batch % 8 == 0 &&
                  a.kv_batch % 8 == 0 && a.o_batch % 8 == 0,
              "flash_attention: row and batch strides must be multiples of 8 elements");
  GTRON_CHECK(
      is_aligned(a.q, 16) && is_aligned(a.k, 16) && is_aligned(a.v, 16) && is_aligned(a.o, 16),
      "flash_attention: operands must be 16-byte aligned");
  GTRON_CHECK(a.seg == nullptr || (a.Tq == a.Tk && a.seg_batch >= a.Tq),
              "flash_attention: document masking needs Tq = Tk (got ", a.Tq, ", ", a.Tk,
              ") and segment rows of T ids (batch stride ", a.seg_batch, ")");
  if (static_cast<int64_t>(a.B) * a.NH * a.Tq == 0) return;
  const auto st = static_cast<cudaStream_t>(stream);
  const bool seg = a.seg != nullptr;
  if (fa3_forward_applies(a)) {
    flash_fa3_forward(a, st, Fa3Schedule::kPersistentPairs);
  } else if (flash_wgmma_usable(a.HS)) {
    flash_wgmma_forward(a, st);
  } else if (a.HS == 64) {
    seg ? forward_hs<64, true>(a, st) : forward_hs<64, false>(a, st);
  } else {
    seg ? forward_hs<128, true>(a, st) : forward_hs<128, false>(a, st);
  }
}

int64_t flash_attention_backward_scratch_floats(int64_t B, int64_t T, int64_t NH) {
  return B * NH * T;
}

void flash_attention_backward(const FlashBackwardArgs& args, float* scratch, void* stream) {
  FlashBackwardArgs a = args;
  if (a.NKV == 0) a.NKV = a.NH;
  GTRON_CHECK(a.HS == 64 || a.HS == 128, "flash_attention: head size ", a.HS, ", expected 64/128");
  GTRON_CHECK(a.NKV > 0 && a.NH % a.NKV == 0, "flash_attention: ", a.NKV,
              " k/v heads do not divide ", a.NH, " query heads");
  GTRON_CHECK(a.qkv_ld % 8 == 0 && a.o_ld % 8 == 0 && a.qkv_batch % 8 == 0 && a.o_batch % 8 == 0,
              "flash_attention: row and batch strides must be multiples of 8 elements");
  GTRON_CHECK(is_aligned(a.qkv, 16) && is_aligned(a.dqkv, 16) && is_aligned(a.o, 16) &&
                  is_aligned(a.dout, 16),
              "flash_attention: operands must be 16-byte aligned");
  if (static_cast<int64_t>(a.B) * a.NH * a.T == 0) return;
  GTRON_CHECK(scratch != nullptr, "flash_attention: backward needs scratch");
  GTRON_CHECK(a.seg == nullptr || a.seg_batch >= a.T, "flash_attention: segment batch stride ",
              a.seg_batch, " below T = ", a.T);
  const auto st = static_cast<cudaStream_t>(stream);
  if (fa3_backward_applies(a)) {
    flash_fa3_backward(a, scratch, st);  // forms Δ itself
    return;
  }
  const bool rope = a.rope_inv_freq != nullptr, seg = a.seg != nullptr;
  if (a.HS == 64) {
    if (seg) {
      rope ? backward_hs<64, true, true>(a, scratch, st)
           : backward_hs<64, false, true>(a, scratch, st);
    } else {
      rope ? backward_hs<64, true, false>(a, scratch, st)
           : backward_hs<64, false, false>(a, scratch, st);
    }
  } else if (seg) {
    rope ? backward_hs<128, true, true>(a, scratch, st)
         : backward_hs<128, false, true>(a, scratch, st);
  } else {
    rope ? backward_hs<128, true, false>(a, scratch, st)
         : backward_hs<128, false, false>(a, scratch, st);
  }
}

}  // namespace gtron::cuda

// gtron's block-scaled FP8 GEMM for sm_90a (contract in model/ops/fp8_gemm.h): the products of
// Note [fp8 recipe] (model/ops/fp8.h) with FlashAttention-3's kernel structure
// (model/ops/flash_fa3_cuda.cu) and DeepSeek-V3's per-k-block promotion.
//
// Note [fp8 block GEMM]
// A CTA of 384 threads owns one output tile of kBM = 128 rows by BN (128 or 256) columns at a
// time and walks the tiles persistently (one CTA per SM):
// - Warpgroup 0 is the producer: setmaxnreg down to kProducerRegs, one thread issuing, per
//   k-block of 128, the TMA loads of A's [128, 128] and B's [BN, 128] code tiles (2-d maps of the
//   byte matrices, 128-byte swizzle, tma::codes_map) and the bulk copies of their scales (A's 128
//   rows-layout scales, 512 contiguous bytes; B's BN rows-layout scales, or in the blocks layout
//   the 16-byte group of 4 k-blocks' scales holding this one, per 128-column half) into a ring of
//   kStages slots, each with a full mbarrier (the producer's expect_tx of every byte) and an
//   empty one (one arrival per consumer warp; Note [mbarrier phases] in model/cuda/tma.cuh).
// - Warpgroups 1 and 2 consume, rows 0..63 and 64..127 of the tile, setmaxnreg up to
//   kConsumerRegs. Per k-block and per 128-column half of the tile, four m64n128k32 e4m3
//   products (Note [fp8 wgmma operands] in model/cuda/wgmma_wide.cuh) overwrite a 64-register
//   partial, wait_group 0, and the partial joins the fp32 accumulator scaled by sa(row) · sb: one
//   fused multiply-add per element (blocks: sb is one scalar per half; rows: a float2 of column
//   scales per n-tile), all read from the slot into registers. The slot is released (a proxy
//   fence, __syncwarp, then lane 0's arrival) after the last half's promotion: Note [fp8 scale
//   reads]. The two consumers are independent: while one promotes, the other's products hold
//   the tensor cores.
// - The epilogue writes D straight from the accumulator registers: per n-tile a pair of columns
//   per row (bf16x2 or float2), beta·C (C may be D) read whole and folded in first. It touches
//   no shared memory, so the producer is already filling the ring with the next tile's k-blocks.
// - Order: tile t of the walk is in group t / (kGroupM · n_tiles) of kGroupM m-tiles, m-tile
//   fastest within it, so the ~132 tiles in flight share about 16 row panels of A and 132 / 16
//   column panels of B in L2. CTA c takes tiles c, c + grid, ...; producer and consumers walk the
//   same sequence, so their ring positions (slot, parity) agree without a word between them.
// Results: every element sums its k-blocks in order, each block four k = 32 tensor-core steps
// (e8m13 truncation inside, Note [fp8 accumulation on Hopper] in tests/model/fp8_cuda_test.cc)
// promoted once to fp32; no atomics, no split-K, so reruns are bit-identical, and BN = 128 and
// 256 give the same bits (the same m64n128k32 steps over the same 128 columns).
//
// Registers (65536 a SM; 384 threads at one CTA an SM, so ptxas gets 168 a thread from the
// launch bound): setmaxnreg moves them from the producer (kProducerRegs = 40) to the consumers
// (kConsumerRegs = 232): 128·40 + 256·232 = 64,512 = 168·384. A consumer holds the fp32
// accumulator, 64·BN / 128 = BN / 2 registers (64 or 128), the partial (64) and ~20 of addresses,
// counters and scales. ptxas (CUDA 13.0; it allocates the code after each setmaxnreg within that
// budget) reports 168 registers and no spills for all 8 instantiations; lowering kConsumerRegs
// shows their need: BN = 128 fits at 144 in the blocks layout (spills at 136) and 176 in the rows
// layout (its column scales held across the products), BN = 256 at 200 in the blocks layout and
// 208 in the rows layout (8 bytes spilled at 200); the producer fits at 24. BN = 256 as one
// m64n256k32 partial would need 128 + 128 and not fit, so its halves take turns in one partial.
// Shared memory (227 KB a CTA): a slot holds A 16 KB + B BN·128 bytes + 512 + 4·BN bytes of
// scales: BN = 128: 6 slots × 33 KB = 198 KB; BN = 256: 4 slots × 49.5 KB = 198 KB; plus 96 or
// 64 bytes of barriers and 1 KB of alignment pad (203,872 and 203,840 bytes).
// Expected speed (H100 SXM: 1979 dense FP8 TFLOP/s at 1830 MHz, 8192 FLOP a clock an SM):
// - Tensor cores: a k-block of one consumer's half is 2·64·128·128 = 2.1 MFLOP, 256 clocks of
//   the SM; its promotion, 64 FMAs a thread (blocks; 64 FMULs, 64 FMAs and 16 shared loads in the
//   rows layout), ~64-150 issue clocks on the FP32 pipes, runs under the other consumer's
//   products, so the tensor cores can stay busy.
// - L2: a k-block brings (128 + BN)·128 bytes into the SM for 2·128·BN·128 FLOP: 10.7 TB/s of L2
//   reads at BN = 128, 8 TB/s at BN = 256 for 1400 TFLOP/s, about what an H100's L2 delivers;
//   hence BN = 256 where the waves allow (TMA multicast over a cluster of 2 would halve one
//   operand's share; not done here).
// - The epilogue does not overlap the CTA's own products: ~5% at K = 2048, ~1% at 8192. Waves:
//   the launcher picks the BN whose last wave leaves fewer SMs idle (256 unless 128 fills 10%
//   more).
// DeepGEMM's kernel of this design (with multicast and a TMA-store epilogue) reaches 1300-1550
// TFLOP/s on H800; ~1100-1400 is the expectation here, against cuBLASLt's 500-820 at these shapes.
//
// Note [fp8 scale reads]
// The consumers read a slot's scales with ordinary loads (the generic proxy); the producer refills
// the slot with bulk copies (the async proxy). The empty barrier's release and acquire order the
// two sides within the generic proxy only: PTX asks for a proxy fence (fence.proxy.async) between
// generic and async-proxy accesses of the same bytes, and a bulk copy's completion implies one in
// the other direction alone (landed before read). The first GPU run fits a refill overtaking
// such reads: the rows layout read its 16 float2 of column scales after the products, just before
// the release, and wgrad products (and only they) came out nondeterministic, off cuBLASLt by 2e-3
// .. 7e-3 normwise with the error in a few rows and columns (0.07 .. 0.4 there) — what a few
// elements scaled by another k-block's (or tile's) column scales give, which differ by up to 2^12
// in the tests; a warp's stale broadcast load spoils 2 columns of its 16 rows. Hence:
// - each consumer thread fences (async_proxy_fence) after its promotions and before its warp's
//   arrival, which orders its reads of the slot before the refill's writes;
// - a half's scales are read into registers before its products (as DeepGEMM does), so the
//   loads are long done when the slot is let go and their latency hides under the products —
//   except BN = 256's column scales, read after the products' wait: held across them, their 32
//   registers beside the accumulator's 128 and the partial's 64 spill (ptxas, CUDA 13.0: rows
//   BN = 128 now fits at 176 registers, BN = 256 at 208 as before).
// The wgmma operand reads need neither: they are the async proxy already, and the warp's
// wait_group retires them before the arrival (Note [mbarrier phases] in model/cuda/tma.cuh).
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <type_traits>

#include "model/check.h"
#include "model/cuda/check.h"
#include "model/cuda/kernel_util.cuh"
#include "model/cuda/mma_tile.cuh"
#include "model/cuda/tma.cuh"
#include "model/cuda/tma_map.h"
#include "model/cuda/wgmma.cuh"
#include "model/cuda/wgmma_wide.cuh"
#include "model/device.h"
#include "model/ops/fp8_gemm.h"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "fp8_gemm_cuda.cu is built for sm_90a only (bazel/cuda.bzl SM90A)"
#endif

namespace gtron::cuda {

namespace {

constexpr int kBM = 128;                          // output rows of a tile
constexpr int kBK = 128;                          // a k-block: one scale, one 128-byte code row
constexpr int kHalfN = 128;                       // output columns of one m64n128k32 product
constexpr int kRowsWg = 64;                       // rows of a consumer warpgroup
constexpr int kConsumers = 2;                     // consumer warpgroups
constexpr int kThreads = 128 * (1 + kConsumers);  // producer warpgroup + consumers
constexpr int kProducerRegs = 40;
constexpr int kConsumerRegs = 232;
constexpr int kGroupM = 16;  // m-tiles walked together (Note [fp8 block GEMM], order)

// Where everything sits in the (1024-byte aligned) dynamic shared memory: the code tiles first
// (each 1024-byte aligned, as the 128-byte swizzle and wg::desc want), then the scales, then the
// barriers.
template <int BN>
struct Fp8GemmSmem {
  static constexpr int kStages = BN == 128 ? 6 : 4;
  static constexpr int kABytes = kBM * kBK;
  static constexpr int kBBytes = BN * kBK;
  static constexpr int kSaBytes = kBM * 4;
  static constexpr int kSbBytes = BN * 4;
  static constexpr int kA = 0;
  static constexpr int kB = kA + kStages * kABytes;
  static constexpr int kSa = kB + kStages * kBBytes;
  static constexpr int kSb = kSa + kStages * kSaBytes;
  static constexpr int kBars = kSb + kStages * kSbBytes;         // full[kStages], empty[kStages]
  static constexpr int kBytes = kBars + 2 * kStages * 8 + 1024;  // + the alignment pad
  static_assert(kBytes <= 227 * 1024, "fp8 GEMM: shared memory over the 227 KB of a CTA");
};

// What the kernel reads besides the two tensor maps.
struct Fp8Params {
  const float* sa;  // A's rows-layout scales
  const float* sb;  // B's scales (blocks or rows layout)
  const void* c;    // C (d_type), read when beta != 0
  void* d;          // D (d_type)
  int M, N, K;
  int sb_ld;  // blocks layout: floats between the scale rows of two n-blocks
  float beta;
};

// The persistent walk over the output tiles (Note [fp8 block GEMM], order).
struct TileWalk {
  int m_tiles, n_tiles;
  __device__ __forceinline__ int count() const { return m_tiles * n_tiles; }
  __device__ __forceinline__ void at(int t, int& mt, int& nt) const {
    const int per_group = kGroupM * n_tiles;
    const int group = t / per_group;
    const int m_first = group * kGroupM;
    const int rows = min(kGroupM, m_tiles - m_first);
    const int r = t - group * per_group;
    mt = m_first + r % rows;
    nt = r / rows;
  }
};

// A ring position: the slot and the parity of its current fill (Note [mbarrier phases]).
template <int kStages>
struct Ring {
  int slot = 0;
  uint32_t parity = 0;
  __device__ __forceinline__ void next() {
    if (++slot == kStages) {
      slot = 0;
      parity ^= 1;
    }
  }
};

// The producer thread: every k-block of every tile of this CTA's walk into the ring.
template <int BN, bool kBlocks>
__device__ __forceinline__ void produce(const CUtensorMap* map_a, const CUtensorMap* map_b,
                                        const Fp8Params& p, unsigned char* base, uint64_t* full,
                                        uint64_t* empty) {
  using S = Fp8GemmSmem<BN>;
  constexpr int kHalves = BN / kHalfN;
  constexpr uint32_t kTx =
      S::kABytes + S::kBBytes + S::kSaBytes + (kBlocks ? 16 * kHalves : S::kSbBytes);
  tma::prefetch_map(map_a);
  tma::prefetch_map(map_b);
  const TileWalk walk{p.M / kBM, p.N / BN};
  const int k_blocks = p.K / kBK;
  Ring<S::kStages> ring;
  for (int t = blockIdx.x; t < walk.count(); t += gridDim.x) {
    int mt, nt;
    walk.at(t, mt, nt);
    for (int kb = 0; kb < k_blocks; ++kb, ring.next()) {
      const int s = ring.slot;
      tma::mbar_wait(empty + s, ring.parity ^ 1);
      tma::mbar_expect_tx(full + s, kTx);
      tma::load_2d(base + S::kA + s * S::kABytes, map_a, full + s, kb * kBK, mt * kBM);
      tma::load_2d(base + S::kB + s * S::kBBytes, map_b, full + s, kb * kBK, nt * BN);
      tma::load_bulk(base + S::kSa + s * S::kSaBytes,
                     p.sa + static_cast<int64_t>(kb) * p.M + mt * kBM, S::kSaBytes, full + s);
      unsigned char* sb = base + S::kSb + s * S::kSbBytes;
      if constexpr (kBlocks) {
        // Scales kb & ~3 .. (kb & ~3) + 3 of n-block nt·kHalves + h: 16 aligned bytes (sb_ld is
        // a multiple of 4), 4 of them past the last k-block at most, within the row's padding.
#pragma unroll
        for (int h = 0; h < kHalves; ++h) {
          const float* src = p.sb + static_cast<int64_t>(nt * kHalves + h) * p.sb_ld + (kb & ~3);
          tma::load_bulk(sb + 16 * h, src, 16, full + s);
        }
      } else {
        tma::load_bulk(sb, p.sb + static_cast<int64_t>(kb) * p.N + nt * BN, S::kSbBytes, full + s);
      }
    }
  }
}

// The B scales of one half of a k-block as this lane applies them (Note [fp8 scale reads]):
// blocks, the half's scalar; rows, its 16 pairs of column scales, n-tile j's columns 8j + col0
// and 8j + col0 + 1 (col0 = 2·(lane % 4)).
template <bool kBlocks>
struct HalfScales {
  float s;
};
template <>
struct HalfScales<false> {
  float2 s[kHalfN / 8];
};

// Reads half h's B scales of k-block kb from the slot's scales at sb into registers.
template <bool kBlocks>
__device__ __forceinline__ void load_half_scales(HalfScales<kBlocks>& out, const float* sb, int kb,
                                                 int h, int col0) {
  if constexpr (kBlocks) {
    out.s = sb[4 * h + (kb & 3)];  // the 4 k-blocks' group holding kb (produce)
  } else {
#pragma unroll
    for (int j = 0; j < kHalfN / 8; ++j) {
      out.s[j] = *reinterpret_cast<const float2*>(sb + h * kHalfN + 8 * j + col0);
    }
  }
}

// acc[16h + j] += part[j] · sa(row) · sb(column) for the 128 columns of half h.
template <bool kBlocks, int NT>
__device__ __forceinline__ void promote(float (&acc)[NT][4], const float (&part)[kHalfN / 8][4],
                                        int h, float sa0, float sa1,
                                        const HalfScales<kBlocks>& sb) {
  if constexpr (kBlocks) {
    const float c0 = sa0 * sb.s, c1 = sa1 * sb.s;
#pragma unroll
    for (int j = 0; j < kHalfN / 8; ++j) {
      float(&o)[4] = acc[h * (kHalfN / 8) + j];
      o[0] = fmaf(part[j][0], c0, o[0]);
      o[1] = fmaf(part[j][1], c0, o[1]);
      o[2] = fmaf(part[j][2], c1, o[2]);
      o[3] = fmaf(part[j][3], c1, o[3]);
    }
  } else {
#pragma unroll
    for (int j = 0; j < kHalfN / 8; ++j) {
      const float2 c = sb.s[j];
      float(&o)[4] = acc[h * (kHalfN / 8) + j];
      o[0] = fmaf(part[j][0], sa0 * c.x, o[0]);
      o[1] = fmaf(part[j][1], sa0 * c.y, o[1]);
      o[2] = fmaf(part[j][2], sa1 * c.x, o[2]);
      o[3] = fmaf(part[j][3], sa1 * c.y, o[3]);
    }
  }
}

template <typename TD>
__device__ __forceinline__ float2 load_pair(const TD* p) {
  if constexpr (std::is_same_v<TD, float>) {
    return *reinterpret_cast<const float2*>(p);
  } else {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
  }
}

template <typename TD>
__device__ __forceinline__ void store_pair(TD* p, float v0, float v1) {
  if constexpr (std::is_same_v<TD, float>) {
    *reinterpret_cast<float2*>(p) = make_float2(v0, v1);
  } else {
    *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(v0, v1);
  }
}

// D = acc (+ beta·C) for this lane's rows row and row + 8 (global), columns col + 8j, col + 8j + 1
// (global, j < NT): the accumulator layout of Note [fp8 wgmma operands]. C is read whole before
// the first store: C may be D, so a load after a store could not be moved above it, and each
// would wait out its own trip to memory.
template <typename TD, int NT>
__device__ __forceinline__ void store_tile(const Fp8Params& p, float (&acc)[NT][4], int row,
                                           int col) {
  TD* d = static_cast<TD*>(p.d);
  const TD* c = p.c != nullptr ? static_cast<const TD*>(p.c) : d;
  const int64_t off0 = static_cast<int64_t>(row) * p.N + col, off1 = off0 + int64_t{8} * p.N;
  if (p.beta != 0.0f) {
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const float2 c0 = load_pair(c + off0 + 8 * j), c1 = load_pair(c + off1 + 8 * j);
      acc[j][0] = fmaf(p.beta, c0.x, acc[j][0]);
      acc[j][1] = fmaf(p.beta, c0.y, acc[j][1]);
      acc[j][2] = fmaf(p.beta, c1.x, acc[j][2]);
      acc[j][3] = fmaf(p.beta, c1.y, acc[j][3]);
    }
  }
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    store_pair(d + off0 + 8 * j, acc[j][0], acc[j][1]);
    store_pair(d + off1 + 8 * j, acc[j][2], acc[j][3]);
  }
}

// Consumer warpgroup w (rows 64w .. 64w + 63 of each tile): the products, promotions and
// epilogue of every tile of the walk (Note [fp8 block GEMM]).
template <int BN, bool kBlocks, typename TD>
__device__ __forceinline__ void consume(const Fp8Params& p, const unsigned char* base,
                                        uint64_t* full, uint64_t* empty, int w) {
  using S = Fp8GemmSmem<BN>;
  constexpr int kHalves = BN / kHalfN;
  // A half's scales held across its products (Note [fp8 scale reads]) but for BN = 256's
  // column scales: 32 registers more beside its 128 + 64 spill at kConsumerRegs.
  constexpr bool kScalesFirst = kBlocks || BN == kHalfN;
  const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
  const int row0 = w * kRowsWg + warp * 16 + lane / 4;  // this lane's rows: row0, row0 + 8
  const int col0 = 2 * (lane % 4);                      // and columns 8j + col0, + 1
  const TileWalk walk{p.M / kBM, p.N / BN};
  const int k_blocks = p.K / kBK;
  Ring<S::kStages> ring;
  float acc[BN / 8][4];
  float part[kHalfN / 8][4];
  for (int tile = blockIdx.x; tile < walk.count(); tile += gridDim.x) {
    int mt, nt;
    walk.at(tile, mt, nt);
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    for (int kb = 0; kb < k_blocks; ++kb, ring.next()) {
      const int s = ring.slot;
      tma::mbar_wait(full + s, ring.parity);
      const float* sa = reinterpret_cast<const float*>(base + S::kSa + s * S::kSaBytes);
      const float* sb = reinterpret_cast<const float*>(base + S::kSb + s * S::kSbBytes);
      // sa (and each half's sb where kScalesFirst) read before the products, so their latency
      // hides under them (Note [fp8 scale reads]).
      const float sa0 = sa[row0], sa1 = sa[row0 + 8];
      const unsigned char* a_tile = base + S::kA + s * S::kABytes + w * kRowsWg * kBK;
      const unsigned char* b_tile = base + S::kB + s * S::kBBytes;
#pragma unroll
      for (int h = 0; h < kHalves; ++h) {
        HalfScales<kBlocks> sbh;
        if constexpr (kScalesFirst) load_half_scales<kBlocks>(sbh, sb, kb, h, col0);
        wg::fence();
        wg::abt_e4m3_n128(part, a_tile, b_tile + h * kHalfN * kBK, false);
        wg::commit();
        wg::wait<0>();
        wg::hold(part);
        if constexpr (!kScalesFirst) load_half_scales<kBlocks>(sbh, sb, kb, h, col0);
        promote<kBlocks>(acc, part, h, sa0, sa1, sbh);
      }
      // This thread's reads of the slot's scales (generic proxy) before the refill's bulk copies
      // (async proxy), then every lane's before lane 0's arrival (Note [fp8 scale reads]).
      async_proxy_fence();
      __syncwarp();
      if (lane == 0) tma::mbar_arrive(empty + s);
    }
    store_tile<TD>(p, acc, mt * kBM + row0, nt * BN + col0);
  }
}

template <int BN, bool kBlocks, typename TD>
__global__ void __launch_bounds__(kThreads, 1)
    fp8_gemm_kernel(const __grid_constant__ CUtensorMap map_a,
                    const __grid_constant__ CUtensorMap map_b, Fp8Params p) {
  using S = Fp8GemmSmem<BN>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t pad = (1024 - (smem_u32(smem_raw) & 1023)) & 1023;
  unsigned char* base = smem_raw + pad;
  uint64_t* full = reinterpret_cast<uint64_t*>(base + S::kBars);
  uint64_t* empty = full + S::kStages;
  if (threadIdx.x == 0) {
    for (int s = 0; s < S::kStages; ++s) {
      tma::mbar_init(full + s, 1);
      tma::mbar_init(empty + s, kConsumers * 4);
    }
    tma::mbar_init_fence();
  }
  __syncthreads();  // the last CTA-wide barrier: from here the roles run apart

  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    tma::setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x == 0) produce<BN, kBlocks>(&map_a, &map_b, p, base, full, empty);
    return;
  }
  tma::setmaxnreg_inc<kConsumerRegs>();
  consume<BN, kBlocks, TD>(p, base, full, empty, wg - 1);
}

// Streaming multiprocessors of the current device (cached per device).
int sm_count() {
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  static std::array<std::atomic<int>, 64> count{};
  if (device < 0 || device >= static_cast<int>(count.size())) return 1;
  int n = count[device].load(std::memory_order_relaxed);
  if (n == 0) {
    CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
    count[device].store(n, std::memory_order_relaxed);
  }
  return n;
}

// The share of the last wave's CTAs that have a tile when BN-wide tiles are walked by `sms`.
double wave_fill(int64_t M, int64_t N, int BN, int sms) {
  const int64_t tiles = (M / kBM) * (N / BN);
  return static_cast<double>(tiles) / static_cast<double>(ceil_div<int64_t>(tiles, sms) * sms);
}

template <int BN, bool kBlocks, typename TD>
void launch(const Fp8GemmArgs& g, int sms, cudaStream_t st) {
  using S = Fp8GemmSmem<BN>;
  static const bool once = [] {
    CUDA_CHECK(cudaFuncSetAttribute(fp8_gemm_kernel<BN, kBlocks, TD>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, S::kBytes));
    return true;
  }();
  (void)once;
  const CUtensorMap map_a = tma::codes_map(g.a, g.m, g.k, kBM);
  const CUtensorMap map_b = tma::codes_map(g.b, g.n, g.k, BN);
  Fp8Params p;
  p.sa = g.scale_a;
  p.sb = g.scale_b;
  p.c = g.c;
  p.d = g.d;
  p.M = static_cast<int>(g.m);
  p.N = static_cast<int>(g.n);
  p.K = static_cast<int>(g.k);
  p.sb_ld = static_cast<int>((g.k / kBK + 3) / 4 * 4);  // fp8::block_scale_ld(K)
  p.beta = g.beta;
  const int64_t tiles = (g.m / kBM) * (g.n / BN);
  const unsigned grid = static_cast<unsigned>(tiles < sms ? tiles : sms);
  fp8_gemm_kernel<BN, kBlocks, TD><<<grid, kThreads, S::kBytes, st>>>(map_a, map_b, p);
  CUDA_CHECK_LAUNCH();
}

template <int BN>
void launch_bn(const Fp8GemmArgs& g, int sms, cudaStream_t st) {
  const bool f32 = g.d_type == DType::kF32;
  if (g.b_blocks) {
    f32 ? launch<BN, true, float>(g, sms, st) : launch<BN, true, bf16>(g, sms, st);
  } else {
    f32 ? launch<BN, false, float>(g, sms, st) : launch<BN, false, bf16>(g, sms, st);
  }
}

}  // namespace

bool fp8_block_gemm_usable() { return current_cuda_device_is_sm90(); }

bool fp8_block_gemm_ok(int64_t M, int64_t N, int64_t K) {
  auto tiled = [](int64_t v) { return v > 0 && v % kBK == 0 && v < (int64_t{1} << 31); };
  return tiled(M) && tiled(N) && tiled(K);
}

void fp8_block_gemm(const Fp8GemmArgs& g, void* stream) {
  GTRON_CHECK(fp8_block_gemm_ok(g.m, g.n, g.k), "fp8_block_gemm: M ", g.m, ", N ", g.n, ", K ", g.k,
              "; expected positive multiples of 128");
  GTRON_CHECK(g.d_type == DType::kBF16 || g.d_type == DType::kF32, "fp8_block_gemm: D in ",
              dtype_name(g.d_type), "; expected bf16 or f32");
  GTRON_CHECK(g.block_n == 0 || g.block_n == 128 || g.block_n == 256, "fp8_block_gemm: block_n ",
              g.block_n, "; expected 0, 128 or 256");
  GTRON_CHECK(g.block_n == 0 || g.n % g.block_n == 0, "fp8_block_gemm: N ", g.n,
              " is not a multiple of block_n ", g.block_n);
  GTRON_CHECK(is_aligned(g.a, 16) && is_aligned(g.b, 16) && is_aligned(g.scale_a, 16) &&
                  is_aligned(g.scale_b, 16) && is_aligned(g.d, 16) &&
                  (g.c == nullptr || is_aligned(g.c, 16)),
              "fp8_block_gemm: operands and scales must be 16-byte aligned");
  GTRON_CHECK(g.a != nullptr && g.b != nullptr && g.scale_a != nullptr && g.scale_b != nullptr &&
                  g.d != nullptr,
              "fp8_block_gemm: a null operand");
  GTRON_CHECK(fp8_block_gemm_usable(), "fp8_block_gemm: needs a compute-capability 9.0 GPU");
  const int sms = sm_count();
  int bn = g.block_n;
  if (bn == 0) {  // 256 (less L2 traffic a FLOP) unless its last wave leaves many more SMs idle
    bn = g.n % 256 == 0 && wave_fill(g.m, g.n, 256, sms) + 0.1 >= wave_fill(g.m, g.n, 128, sms)
             ? 256
             : 128;
  }
  const auto st = static_cast<cudaStream_t>(stream);
  bn == 256 ? launch_bn<256>(g, sms, st) : launch_bn<128>(g, sms, st);
}

}  // namespace gtron::cuda

// The grouped GEMMs of the MoE experts on Hopper's warpgroup MMA (sm_90a; Note [grouped GEMM on
// wgmma]). The contract is grouped_linear.h's; grouped_linear_cuda.cu picks this kernel or the
// mma.sync one (grouped_wgmma.h).
//
// Note [grouped GEMM on wgmma]
// The same launch as the mma.sync kernel (Note [grouped GEMM on CUDA]): the same grid of 128x128
// output tiles over the groups, resolved by the same find_row_tile / resolve, so a graph captures
// it the same way and the group sizes stay on the device. What changes is the product:
// - 256 threads, two warpgroups; warpgroup w owns rows 64w .. 64w + 63 of the tile and both of
//   its 64-column halves (two 64x64 fp32 accumulators, 64 registers).
// - K in steps of 64 through a ring of kStages shared-memory slots filled by cp.async from every
//   thread (each operand's rows of one group are plain strided rows, so there is no tensor map
//   to make per group; rows past the group's end and columns past K read zeros). A slot holds A
//   and B as [64, 64] bf16 tiles in the 128-byte swizzle wgmma reads (mma_tile.cuh's swz<64> on a
//   1024-byte boundary): a K-major [128, 64] operand is two of them stacked, an MN-major one
//   ([64 (k), 128]) two side by side, so tile h (rows or columns 64h ..) sits at the same offset
//   in both layouts and only the step between 16-deep slices differs (32 bytes K-major, 2048
//   MN-major; Note [wgmma operands]).
// - Per step each warpgroup issues 4 x 2 m64n64k16 products from shared memory (A transposed by
//   the instruction where it is MN-major: the weight gradient's dyᵀ), commits, and waits for them
//   before the next step's barrier, so a slot is refilled only after both warpgroups have read
//   it; the refill of the slot read one step earlier is issued right after that barrier and runs
//   under the products.
// - The epilogue stores from the accumulators as the mma.sync kernel does (a warp's registers
//   are laid out like its m16n8 accumulators): bf16 rows, or fp32 weight gradients written or
//   added per the overwrite mask.
// - With fp32 weights (Note [grouped GEMM on fp32 masters] in grouped_linear.h) the forward's
//   and data gradient's B operand, the experts' weights, is read as fp32 and rounded to bf16 (to
//   nearest even, the rounding of the bf16 shadow's cast) on its way into shared memory: each
//   thread loads its 4 chunks of 8 weights for step kt + kStages - 1 into registers before it
//   issues step kt's products, and converts and stores them while those run. The products read
//   the same bf16 values a shadow would hold, so the results equal the shadow path's bit for bit.
// Measured (H100, bench_grouped, 32,768 rows over 64 experts, 2026-12-07): 3 stages 230-280
// TFLOP/s, 4 stages 190-220, mma.sync 170-230; the fp32-weight variant (4 stages) 134-157. Both
// far from the tensor cores' ~800: every thread waits for its own copies (no producer warps, no
// TMA), 64x64 products from shared memory, 128x128 tiles over groups of ~512 rows. Next: a TMA
// producer warp with per-group tensor maps (or im2col-free 2-d maps over the weight stack), m64n128
// products, and 3 stages for the fp32-weight variant.
// Occupancy: 3 stages take 96 KiB of shared memory, so two CTAs fit an SM when a thread stays at
// 128 registers. The bf16 variants get there by themselves (122-128). The fp32-weight ones are
// held there by a minimum of 2 blocks in __launch_bounds__: without it ptxas gave the data
// gradient 164 (one CTA an SM); at 128 it spills 48 bytes, and the Qwen3-MoE step on the masters
// ran 33,875 tokens/s instead of 32,991 (H100, 2026-12-07). Asking the bf16 variants for 2 blocks
// too changed their code (126-128 registers) and cost them 2-5% in bench_grouped.
// Sums: each output element adds its k-steps in order with the tensor cores' fp32 accumulation;
// no atomics, no split-K: reruns are bit-identical. The mma.sync kernel adds the same 16-deep
// steps in the same order, and on an H100 the two gave the same bits (bench_grouped).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "model/check.h"
#include "model/cuda/check.h"
#include "model/cuda/kernel_util.cuh"
#include "model/cuda/mma_tile.cuh"
#include "model/cuda/wgmma.cuh"
#include "model/device.h"
#include "model/ops/grouped_args.cuh"
#include "model/ops/grouped_wgmma.h"

namespace gtron::cuda {

namespace {

using grouped::GroupedArgs;
using grouped::kAKMajor;
using grouped::kBKMajor;
using grouped::Product;
using grouped::resolve;
using grouped::View;

constexpr int kBM = 128, kBN = 128, kBK = 64, kThreads = 256;
constexpr int kTileElems = 64 * 64;            // one [64, 64] swizzled tile
constexpr int kOperandElems = 2 * kTileElems;  // an operand's 128 x 64 (either layout)
static_assert(kBM == kBN && kBM == 2 * 64, "two [64, 64] tiles an operand");

template <int kStages>
constexpr int smem_bytes() {
  return kStages * 2 * kOperandElems * 2;
}

// One operand's [128, 64] (K-major: 128 rows of m or n, 64 of k) or [64, 128] (MN-major: 64 rows
// of k) into two swizzled [64, 64] tiles at t; chunks outside [MN) x [K) become zeros.
template <bool kKMajor>
__device__ __forceinline__ void load_operand(bf16* t, const bf16* g, int64_t ld, int mn0, int MN,
                                             int k0, int K) {
  if constexpr (kKMajor) {
    for (int i = threadIdx.x; i < kBM * (kBK / 8); i += kThreads) {
      const int r = i / (kBK / 8), c = i % (kBK / 8);
      const bool valid = mn0 + r < MN && k0 + c * 8 < K;
      const bf16* src = valid ? g + static_cast<int64_t>(mn0 + r) * ld + k0 + c * 8 : g;
      cp_async16(t + swz<64>(r, c), src, valid);  // rows 64.. land in the second tile
    }
  } else {
    for (int i = threadIdx.x; i < kBK * (kBM / 8); i += kThreads) {
      const int r = i / (kBM / 8), c = i % (kBM / 8);
      const bool valid = k0 + r < K && mn0 + c * 8 < MN;
      const bf16* src = valid ? g + static_cast<int64_t>(k0 + r) * ld + mn0 + c * 8 : g;
      cp_async16(t + (c / 8) * kTileElems + swz<64>(r, c % 8), src, valid);
    }
  }
}

// Descriptor of the 16-deep slice kk of tile h of an operand at t.
template <bool kKMajor>
__device__ __forceinline__ uint64_t slice(const bf16* t, int h, int kk) {
  return wg::advance(wg::desc(t + h * kTileElems), kKMajor ? 32 * kk : 2048 * kk);
}

// A thread's 4 chunks of 8 fp32 weights of one step (Note [grouped GEMM on wgmma]).
struct F32Chunks {
  float4 v[4][2];
};

// Chunk j of this thread: its row and 8-wide column in the operand's [128, 64] (K-major) or
// [64, 128] (MN-major) step, and its offset in the slot's two swizzled tiles.
template <bool kKMajor>
__device__ __forceinline__ void chunk_of(int j, int& r, int& c, int& at) {
  const int i = static_cast<int>(threadIdx.x) + j * kThreads;
  if constexpr (kKMajor) {
    r = i / (kBK / 8);
    c = i % (kBK / 8);
    at = swz<64>(r, c);
  } else {
    r = i / (kBM / 8);
    c = i % (kBM / 8);
    at = (c / 8) * kTileElems + swz<64>(r, c % 8);
  }
}

template <bool kKMajor>
__device__ __forceinline__ void fetch_f32(F32Chunks& f, const float* g, int64_t ld, int mn0, int MN,
                                          int k0, int K) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    int r, c, at;
    chunk_of<kKMajor>(j, r, c, at);
    const bool valid = kKMajor ? mn0 + r < MN && k0 + c * 8 < K : k0 + r < K && mn0 + c * 8 < MN;
    const float* src = kKMajor ? g + static_cast<int64_t>(mn0 + r) * ld + k0 + c * 8
                               : g + static_cast<int64_t>(k0 + r) * ld + mn0 + c * 8;
    const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
    f.v[j][0] = valid ? __ldg(reinterpret_cast<const float4*>(src)) : zero;
    f.v[j][1] = valid ? __ldg(reinterpret_cast<const float4*>(src) + 1) : zero;
  }
}

template <bool kKMajor>
__device__ __forceinline__ void store_f32(const F32Chunks& f, bf16* t) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    int r, c, at;
    chunk_of<kKMajor>(j, r, c, at);
    const float4 a = f.v[j][0], b = f.v[j][1];
    *reinterpret_cast<uint4*>(t + at) = make_uint4(pack_bf16(a.x, a.y), pack_bf16(a.z, a.w),
                                                   pack_bf16(b.x, b.y), pack_bf16(b.z, b.w));
  }
}

template <typename Out>
__device__ __forceinline__ void store_acc(const float (&acc)[2][8][4], Out* c, int64_t ldc, int M,
                                          int N, int m0, int n0, bool overwrite) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;  // warp 4w + i: rows 64w + 16i ..
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int m = m0 + warp * 16 + lane / 4 + r * 8;
        const int n = n0 + h * 64 + j * 8 + 2 * (lane % 4);
        if (m >= M || n >= N) continue;  // N is a multiple of 8: n + 1 < N too
        const float v[2] = {acc[h][j][2 * r], acc[h][j][2 * r + 1]};
        Out* p = c + static_cast<int64_t>(m) * ldc + n;
        overwrite ? store_floats<2>(p, v) : add_floats<2>(p, v);
      }
    }
  }
}

template <Product P, int kStages, bool kWF32>
__global__ void __launch_bounds__(kThreads, kWF32 ? 2 : 0)
    grouped_wgmma_kernel(const __grid_constant__ GroupedArgs args) {
  static_assert(!kWF32 || P != Product::kWeight, "the weight gradient reads no weights");
  View<bf16> v;
  int m0 = 0, n0 = 0;
  bool overwrite = false;
  if (!resolve<P, bf16, kBM, kBN>(args, v, m0, n0, overwrite)) return;
  constexpr bool kAK = kAKMajor<P>, kBK_ = kBKMajor<P>;
  extern __shared__ __align__(1024) unsigned char smem[];
  bf16* tiles = reinterpret_cast<bf16*>(smem);
  auto a_slot = [&](int s) { return tiles + (2 * s) * kOperandElems; };
  auto b_slot = [&](int s) { return tiles + (2 * s + 1) * kOperandElems; };
  const int nk = (v.K + kBK - 1) / kBK;
  const float* wf = reinterpret_cast<const float*>(v.b);  // kWF32: the fp32 weights
  F32Chunks staged;                                       // kWF32: step kt + kStages - 1's B
  // Step kt's copies, always one commit group (empty past the end); B's fp32 weights only
  // fetched into `staged` (stored after the products are issued).
  auto load_step = [&](int kt) {
    if (kt < nk) {
      const int s = kt % kStages;
      load_operand<kAK>(a_slot(s), v.a, v.lda, m0, v.M, kt * kBK, v.K);
      if constexpr (kWF32) {
        fetch_f32<kBK_>(staged, wf, v.ldb, n0, v.N, kt * kBK, v.K);
      } else {
        load_operand<kBK_>(b_slot(s), v.b, v.ldb, n0, v.N, kt * kBK, v.K);
      }
    }
    cp_async_commit();
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    load_step(s);
    if constexpr (kWF32) {
      if (s < nk) store_f32<kBK_>(staged, b_slot(s));
    }
  }
  const int w = threadIdx.x / 128;
  float acc[2][8][4] = {};
  for (int kt = 0; kt < nk; ++kt) {
    cp_async_wait<kStages - 2>();  // this thread's part of step kt has landed
    async_proxy_fence();
    __syncthreads();  // everyone's part, and both warpgroups are done with step kt - 1's slot
    load_step(kt + kStages - 1);
    const bf16* As = a_slot(kt % kStages);
    const bf16* Bs = b_slot(kt % kStages);
    wg::fence();
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      const uint64_t da = slice<kAK>(As, w, kk);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        wg::mma_ss<kBK_ ? 0 : 1, kAK ? 0 : 1>(acc[h], da, slice<kBK_>(Bs, h, kk), true);
      }
    }
    wg::commit();
    if constexpr (kWF32) {  // the next fill of the slot step kt - 1 read, under the products
      if (kt + kStages - 1 < nk) store_f32<kBK_>(staged, b_slot((kt + kStages - 1) % kStages));
    }
    wg::wait<0>();
    wg::hold(acc[0]);
    wg::hold(acc[1]);
  }
  cp_async_wait<0>();  // no copy outlives the CTA
  if constexpr (P == Product::kWeight) {
    store_acc(acc, static_cast<float*>(v.c), v.ldc, v.M, v.N, m0, n0, overwrite);
  } else {
    store_acc(acc, static_cast<bf16*>(v.c), v.ldc, v.M, v.N, m0, n0, overwrite);
  }
}

template <Product P, int kStages, bool kWF32>
void launch_stages(const GroupedArgs& a, dim3 grid, cudaStream_t st) {
  static const bool smem_allowed = [] {
    CUDA_CHECK(cudaFuncSetAttribute(grouped_wgmma_kernel<P, kStages, kWF32>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    smem_bytes<kStages>()));
    return true;
  }();
  (void)smem_allowed;
  grouped_wgmma_kernel<P, kStages, kWF32><<<grid, kThreads, smem_bytes<kStages>(), st>>>(a);
  CUDA_CHECK_LAUNCH();
}

template <Product P, bool kWF32>
void launch_product(const GroupedArgs& a, dim3 grid, int stages, cudaStream_t st) {
  if (stages == 3) {
    launch_stages<P, 3, kWF32>(a, grid, st);
  } else {
    launch_stages<P, 4, kWF32>(a, grid, st);
  }
}

}  // namespace

bool grouped_wgmma_usable() { return current_cuda_device_is_sm90(); }

void grouped_wgmma_launch(const GroupedArgs& a, int product, unsigned grid_x, unsigned grid_y,
                          int stages, void* stream) {
  const dim3 grid(grid_x, grid_y);
  GTRON_CHECK(stages == 3 || stages == 4, "grouped wgmma: ", stages, " stages; 3 or 4");
  auto st = static_cast<cudaStream_t>(stream);
  switch (static_cast<Product>(product)) {
    case Product::kForward:
      a.w_f32 ? launch_product<Product::kForward, true>(a, grid, stages, st)
              : launch_product<Product::kForward, false>(a, grid, stages, st);
      break;
    case Product::kData:
      a.w_f32 ? launch_product<Product::kData, true>(a, grid, stages, st)
              : launch_product<Product::kData, false>(a, grid, stages, st);
      break;
    case Product::kWeight:
      launch_product<Product::kWeight, false>(a, grid, stages, st);
      break;
  }
}

}  // namespace gtron::cuda

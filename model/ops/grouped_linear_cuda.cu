// Grouped GEMMs of the MoE experts on CUDA (Note [grouped GEMM on CUDA]): one kernel launch per
// product over every expert, the group sizes read from the device offsets by the kernel itself.
//
// Note [grouped GEMM on CUDA]
// The MoE forward must not wait for the GPU to learn how many rows each expert got (that would
// stall every layer and forbid graph capture), and padding every expert to the worst case would
// cost E times the work. So the sizes stay on the device:
// - Forward (y = x·Wᵀ) and data gradient (dx = dy·W) tile the rows of each group: group g has
//   ceil(rows_g / BM) row tiles, in group order. A launch covers the upper bound of tiles,
//   ceil(M / BM) + G, by the column tiles; each CTA finds its (group, row tile) from the offsets
//   (find_row_tile: the CTA's threads split the groups, scan their tile counts, and the one
//   holding tile slot t names it), and the CTAs past the last tile exit at once. A tile never
//   straddles two groups; its rows past the group's end read zeros and are not stored.
// - Weight gradient (dW_g = dy_gᵀ·x_g): a CTA per (output tile, group) reduces over the group's
//   rows in order, K-tile after K-tile, so the sum has one order: bit-identical reruns, no
//   atomics. An empty group adds nothing, or writes zeros when its gradient is to be written.
// - The groups' weight (or weight-gradient) pointers travel by value in the kernel arguments
//   (__grid_constant__, read in place): a graph captures them, and the bf16 shadows and
//   main_grads they point at live at fixed addresses.
// Two kernels do the products, one product form each through View (A and B either K-major, the
// reduced index contiguous, or MN-major):
// - bf16 rows with Cin and Cout multiples of 8 and 16-byte aligned operands: tensor cores
//   (mma.sync m16n8k16 from mma_tile.cuh), 128×128 CTA tiles, K in steps of 64 through two
//   cp.async stages of XOR-swizzled shared-memory tiles, 8 warps of 64×32, fp32 accumulators;
//   MN-major operands are read with ldmatrix.trans. The output is rounded once.
// - anything else (f32, odd sizes): a plain fp32 tiled kernel (64×64 tiles, 4×4 a thread, K in
//   order) — the reference twin and the f32 path (true fp32 products, as the CPU's).
// Performance plan (measured later, on the H100/H200): wgmma with TMA loads and 3-4 stages, a
// persistent tile scheduler that reads the offsets once, the SwiGLU fused into the gate_up
// epilogue, smaller row tiles for small groups (a group of 1 row still costs a 128-row tile).
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#include "model/cuda/mma_tile.cuh"
#include "model/env.h"
#include "model/ops/grouped_args.cuh"
#include "model/ops/grouped_linear.h"
#include "model/ops/grouped_wgmma.h"

namespace gtron::cuda {

namespace {

using grouped::GroupedArgs;
using grouped::kAKMajor;
using grouped::kBKMajor;
using grouped::Product;
using grouped::resolve;
using grouped::View;

// ---- tensor-core kernel (bf16) ----

constexpr int kTBM = 128, kTBN = 128, kTBK = 64, kTThreads = 256;
constexpr int kTileElems = kTBM * kTBK;              // one operand tile, either layout
constexpr int kTSmemBytes = 2 * 2 * kTileElems * 2;  // 2 stages × (A, B) × bf16 = 64 KiB
static_assert(kTBM == kTBN, "an MN-major tile is [kTBK, 128] for A and B alike");

// A [128, K-tile] operand tile into shared memory: K-major as [128 rows, 64] (swz<64>), MN-major
// as [64 rows of k, 128] (swz<128>); chunks outside [MN) × [K) become zeros.
template <bool kKMajor>
__device__ __forceinline__ void load_operand(bf16* t, const bf16* g, int64_t ld, int mn0, int MN,
                                             int k0, int K) {
  if constexpr (kKMajor) {
    for (int i = threadIdx.x; i < kTBM * (kTBK / 8); i += kTThreads) {
      const int r = i / (kTBK / 8), c = i % (kTBK / 8);
      const bool valid = mn0 + r < MN && k0 + c * 8 < K;
      const bf16* src = valid ? g + static_cast<int64_t>(mn0 + r) * ld + k0 + c * 8 : g;
      cp_async16(t + swz<kTBK>(r, c), src, valid);
    }
  } else {
    for (int i = threadIdx.x; i < kTBK * (kTBM / 8); i += kTThreads) {
      const int r = i / (kTBM / 8), c = i % (kTBM / 8);
      const bool valid = k0 + r < K && mn0 + c * 8 < MN;
      const bf16* src = valid ? g + static_cast<int64_t>(k0 + r) * ld + mn0 + c * 8 : g;
      cp_async16(t + swz<kTBM>(r, c), src, valid);
    }
  }
}

// acc (the warp's 64×32: 4 m16 tiles by 4 n8 tiles) += the stage's A·B over kTBK.
template <bool kAK, bool kBK>
__device__ __forceinline__ void mma_stage(float (&acc)[4][4][4], const bf16* As, const bf16* Bs,
                                          int wm, int wn, int lane) {
#pragma unroll
  for (int kk = 0; kk < kTBK / 16; ++kk) {
    uint32_t af[4][4];
#pragma unroll
    for (int mt = 0; mt < 4; ++mt) {
      const int m = wm * 64 + mt * 16;
      if constexpr (kAK) {
        ldsm_x4(af[mt], lds_a<kTBK>(As, m, kk * 2, lane));
      } else {  // At[k][m]: the transposed 8×8 blocks are A's fragment
        ldsm_x4_t(af[mt], lds_b<kTBM>(As, kk * 16, m / 8, lane));
      }
    }
#pragma unroll
    for (int n2 = 0; n2 < 2; ++n2) {
      const int n = wn * 32 + n2 * 16;
      uint32_t r[4];
      if constexpr (kBK) {
        ldsm_x4(r, lds_b<kTBK>(Bs, n, kk * 2, lane));
      } else {
        ldsm_x4_t(r, lds_a<kTBN>(Bs, kk * 16, n / 8, lane));
      }
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
        mma16816(acc[mt][2 * n2], af[mt], r[0], r[1]);
        mma16816(acc[mt][2 * n2 + 1], af[mt], r[2], r[3]);
      }
    }
  }
}

template <typename Out>
__device__ __forceinline__ void store_mma(const float (&acc)[4][4][4], Out* c, int64_t ldc, int M,
                                          int N, int m0, int n0, int wm, int wn, int lane,
                                          bool overwrite) {
#pragma unroll
  for (int mt = 0; mt < 4; ++mt) {
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int m = m0 + wm * 64 + mt * 16 + lane / 4 + h * 8;
        const int n = n0 + wn * 32 + nt * 8 + 2 * (lane % 4);
        if (m >= M || n >= N) continue;  // N is a multiple of 8: n + 1 < N too
        const float v[2] = {acc[mt][nt][2 * h], acc[mt][nt][2 * h + 1]};
        Out* p = c + static_cast<int64_t>(m) * ldc + n;
        overwrite ? store_floats<2>(p, v) : add_floats<2>(p, v);
      }
    }
  }
}

template <Product P>
__global__ void __launch_bounds__(kTThreads)
    grouped_mma_kernel(const __grid_constant__ GroupedArgs args) {
  View<bf16> v;
  int m0 = 0, n0 = 0;
  bool overwrite = false;
  if (!resolve<P, bf16, kTBM, kTBN>(args, v, m0, n0, overwrite)) return;
  extern __shared__ __align__(1024) unsigned char smem[];
  bf16* tiles = reinterpret_cast<bf16*>(smem);
  auto a_tile = [&](int s) { return tiles + (2 * s) * kTileElems; };
  auto b_tile = [&](int s) { return tiles + (2 * s + 1) * kTileElems; };
  auto load_stage = [&](int s, int k0) {
    load_operand<kAKMajor<P>>(a_tile(s), v.a, v.lda, m0, v.M, k0, v.K);
    load_operand<kBKMajor<P>>(b_tile(s), v.b, v.ldb, n0, v.N, k0, v.K);
    cp_async_commit();
  };
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int wm = warp / 4, wn = warp % 4;
  float acc[4][4][4] = {};
  const int nk = (v.K + kTBK - 1) / kTBK;
  if (nk > 0) load_stage(0, 0);
  for (int kt = 0; kt < nk; ++kt) {
    if (kt + 1 < nk) {
      load_stage((kt + 1) & 1, (kt + 1) * kTBK);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    mma_stage<kAKMajor<P>, kBKMajor<P>>(acc, a_tile(kt & 1), b_tile(kt & 1), wm, wn, lane);
    __syncthreads();  // the next load overwrites this stage
  }
  if constexpr (P == Product::kWeight) {
    store_mma(acc, static_cast<float*>(v.c), v.ldc, v.M, v.N, m0, n0, wm, wn, lane, overwrite);
  } else {
    store_mma(acc, static_cast<bf16*>(v.c), v.ldc, v.M, v.N, m0, n0, wm, wn, lane, overwrite);
  }
}

// ---- fp32 tiled kernel (f32, odd sizes) ----

constexpr int kSBM = 64, kSBN = 64, kSBK = 16, kSThreads = 256;

template <Product P, typename T>
__global__ void __launch_bounds__(kSThreads)
    grouped_simt_kernel(const __grid_constant__ GroupedArgs args) {
  __shared__ float As[kSBK][kSBM];
  __shared__ float Bs[kSBK][kSBN];
  View<T> v;
  int m0 = 0, n0 = 0;
  bool overwrite = false;
  if (!resolve<P, T, kSBM, kSBN>(args, v, m0, n0, overwrite)) return;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  float acc[4][4] = {};
  for (int k0 = 0; k0 < v.K; k0 += kSBK) {
    // Consecutive threads take consecutive addresses of each operand's contiguous index.
    for (int i = threadIdx.x; i < kSBM * kSBK; i += kSThreads) {
      const bool ak = kAKMajor<P>;
      const int m = ak ? i / kSBK : i % kSBM, k = ak ? i % kSBK : i / kSBM;
      const int gm = m0 + m, gk = k0 + k;
      float val = 0;
      if (gm < v.M && gk < v.K) {
        val = to_float(ak ? v.a[static_cast<int64_t>(gm) * v.lda + gk]
                          : v.a[static_cast<int64_t>(gk) * v.lda + gm]);
      }
      As[k][m] = val;
    }
    for (int i = threadIdx.x; i < kSBN * kSBK; i += kSThreads) {
      const bool bk = kBKMajor<P>;
      const int n = bk ? i / kSBK : i % kSBN, k = bk ? i % kSBK : i / kSBN;
      const int gn = n0 + n, gk = k0 + k;
      float val = 0;
      if (gn < v.N && gk < v.K) {
        val = to_float(bk ? v.b[static_cast<int64_t>(gn) * v.ldb + gk]
                          : v.b[static_cast<int64_t>(gk) * v.ldb + gn]);
      }
      Bs[k][n] = val;
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kSBK; ++k) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        a[i] = As[k][ty * 4 + i];
        b[i] = Bs[k][tx * 4 + i];
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
      }
    }
    __syncthreads();
  }
  using Out = std::conditional_t<P == Product::kWeight, float, T>;
  auto* c = static_cast<Out*>(v.c);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int m = m0 + ty * 4 + i, n = n0 + tx * 4 + j;
      if (m >= v.M || n >= v.N) continue;
      Out* p = c + static_cast<int64_t>(m) * v.ldc + n;
      *p = from_float<Out>(overwrite ? acc[i][j] : to_float(*p) + acc[i][j]);
    }
  }
}

// ---- launchers ----

// Note [grouped launches of 128 groups]: the arguments of one launch name at most
// kGroupsPerLaunch groups, so G groups take ceil(G / 128) launches, each over its own run of
// groups (the offsets from its first group on: the rows stay absolute).
void check_sizes(int G, int64_t Cin, int64_t Cout) {
  GTRON_CHECK(G >= 1 && G <= kMaxGroups, "grouped_linear: ", G, " groups; CUDA takes 1 to ",
              kMaxGroups);
  GTRON_CHECK(Cin > 0 && Cout > 0 && Cin < (int64_t{1} << 31) && Cout < (int64_t{1} << 31),
              "grouped_linear: Cin ", Cin, ", Cout ", Cout);
}

// The arguments of the launch over groups [g0, g0 + n).
GroupedArgs make_args(const void* x, const void* dy, void* out, const int32_t* offsets, int64_t Cin,
                      int64_t Cout, int g0, int n, const void* const* group) {
  GroupedArgs a;
  a.x = x;
  a.dy = dy;
  a.out = out;
  a.offsets = offsets + g0;
  a.Cin = Cin;
  a.Cout = Cout;
  a.G = n;
  for (int g = 0; g < n; ++g) a.group[g] = group[g0 + g];
  return a;
}

// Whether the tensor-core kernel takes these operands (bf16, rows of whole 16-byte chunks).
bool mma_ok(const GroupedArgs& a, DType act) {
  bool ok = act == DType::kBF16 && a.Cin % 8 == 0 && a.Cout % 8 == 0 && is_aligned(a.x, 16) &&
            is_aligned(a.dy, 16) && is_aligned(a.out, 16);
  for (int g = 0; g < a.G && ok; ++g) ok = is_aligned(a.group[g], 16);
  return ok;
}

template <Product P>
void launch(const GroupedArgs& a, int64_t M, DType act, void* stream) {
  auto st = static_cast<cudaStream_t>(stream);
  const bool mma = mma_ok(a, act);
  const int bm = mma ? kTBM : kSBM, bn = mma ? kTBN : kSBN;
  dim3 grid;
  if constexpr (P == Product::kWeight) {
    grid = dim3(static_cast<unsigned>(ceil_div<int64_t>(a.Cout, bm) * ceil_div<int64_t>(a.Cin, bn)),
                static_cast<unsigned>(a.G));
  } else {
    const int64_t N = P == Product::kForward ? a.Cout : a.Cin;
    grid = dim3(static_cast<unsigned>(ceil_div<int64_t>(M, bm) + a.G),
                static_cast<unsigned>(ceil_div<int64_t>(N, bn)));
  }
  const GroupedKernel kernel = grouped_kernel();
  const bool wgmma = mma && kernel != GroupedKernel::kMma && grouped_wgmma_usable();
  GTRON_CHECK(!a.w_f32 || wgmma, "grouped_linear: fp32 weights beside bf16 rows need the wgmma ",
              "kernel (grouped_master_weights(); Note [grouped GEMM on fp32 masters])");
  if (wgmma) {
    grouped_wgmma_launch(a, static_cast<int>(P), grid.x, grid.y,
                         kernel == GroupedKernel::kWgmma3 ? 3 : 4, stream);
    return;
  }
  if (mma) {
    static const bool smem_allowed = [] {
      CUDA_CHECK(cudaFuncSetAttribute(grouped_mma_kernel<P>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, kTSmemBytes));
      return true;
    }();
    (void)smem_allowed;
    grouped_mma_kernel<P><<<grid, kTThreads, kTSmemBytes, st>>>(a);
  } else {
    dispatch_act("grouped_linear", act, [&](auto tag) {
      using T = decltype(tag);
      grouped_simt_kernel<P, T><<<grid, kSThreads, 0, st>>>(a);
    });
  }
  CUDA_CHECK_LAUNCH();
}

// set_grouped_kernel; -1 until GTRON_GROUPED_KERNEL has been read.
std::atomic<int> g_grouped_kernel{-1};
// set_grouped_master_weights; -1 until GTRON_MOE_MASTER_WEIGHTS has been read.
std::atomic<int> g_master_weights{-1};

}  // namespace

void set_grouped_kernel(GroupedKernel k) { g_grouped_kernel.store(static_cast<int>(k)); }

GroupedKernel grouped_kernel() {
  // The choices in GroupedKernel's order.
  return static_cast<GroupedKernel>(env_once(g_grouped_kernel, [] {
    return env_choice("GTRON_GROUPED_KERNEL", {"mma", "wgmma3", "wgmma4"},
                      static_cast<int>(GroupedKernel::kWgmma3));
  }));
}

void set_grouped_master_weights(bool on) { g_master_weights.store(on ? 1 : 0); }

bool grouped_master_weights() {
  const int on = env_once(g_master_weights,
                          [] { return env_flag("GTRON_MOE_MASTER_WEIGHTS", false) ? 1 : 0; });
  return on == 1 && grouped_kernel() != GroupedKernel::kMma && grouped_wgmma_usable();
}

void grouped_linear_forward(const void* x, const void* const* w, void* y, const int32_t* offsets,
                            int64_t M, int64_t Cin, int64_t Cout, int G, DType act, void* stream,
                            bool w_f32) {
  check_sizes(G, Cin, Cout);
  if (M == 0) return;
  for (int g0 = 0; g0 < G; g0 += kGroupsPerLaunch) {
    GroupedArgs a =
        make_args(x, nullptr, y, offsets, Cin, Cout, g0, std::min(kGroupsPerLaunch, G - g0), w);
    a.w_f32 = w_f32;
    launch<Product::kForward>(a, M, act, stream);
  }
}

void grouped_linear_backward_data(const void* dy, const void* const* w, void* dx,
                                  const int32_t* offsets, int64_t M, int64_t Cin, int64_t Cout,
                                  int G, DType act, void* stream, bool overwrite, bool w_f32) {
  check_sizes(G, Cin, Cout);
  if (M == 0) return;
  for (int g0 = 0; g0 < G; g0 += kGroupsPerLaunch) {
    GroupedArgs a =
        make_args(nullptr, dy, dx, offsets, Cin, Cout, g0, std::min(kGroupsPerLaunch, G - g0), w);
    a.overwrite = overwrite;  // each launch writes the rows of its own groups
    a.w_f32 = w_f32;
    launch<Product::kData>(a, M, act, stream);
  }
}

void grouped_linear_backward_weight(const void* x, const void* dy, float* const* dw,
                                    const bool* overwrite, const int32_t* offsets, int64_t M,
                                    int64_t Cin, int64_t Cout, int G, DType act, void* stream) {
  check_sizes(G, Cin, Cout);
  std::vector<const void*> group(dw, dw + G);
  for (int g0 = 0; g0 < G; g0 += kGroupsPerLaunch) {
    const int n = std::min(kGroupsPerLaunch, G - g0);
    GroupedArgs a = make_args(x, dy, nullptr, offsets, Cin, Cout, g0, n, group.data());
    bool any = false;
    for (int g = 0; g < n; ++g) {
      if (overwrite[g0 + g]) a.overwrite_mask[g / 32] |= 1u << (g % 32);
      any = any || dw[g0 + g] != nullptr;
    }
    if (any) launch<Product::kWeight>(a, M, act, stream);
  }
}

}  // namespace gtron::cuda

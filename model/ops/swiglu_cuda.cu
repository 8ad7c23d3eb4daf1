// SwiGLU on CUDA. Memory-bound elementwise: thread i owns outputs [i·kV, i·kV + kV) of the N·F
// grid, moved as 16-byte packs when F is a multiple of the pack (a pack then never straddles two
// rows) and every operand is aligned, else one element at a time. fp32 math with the accurate
// expf, so f32 results track the CPU kernel to a few ulps. With FP8 codes of the output wanted
// (Note [fp8 fused producers] in model/ops/fp8.h) and F % 128 == 0, 16 threads' packs are one
// 1x128 tile of a row, which they quantize as they store it.
#include "model/cuda/kernel_util.cuh"
#include "model/ops/fp8.h"
#include "model/ops/fp8_tile.cuh"
#include "model/ops/swiglu.h"

namespace gtron::cuda {

namespace {

__device__ __forceinline__ float sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

// The forward and backward of one element, shared by every kernel here so that the tile kernels'
// codes equal the quantizers' of the plain kernels' outputs bit for bit.
__device__ __forceinline__ float swiglu_of(float g, float u) { return g * sigmoid(g) * u; }
__device__ __forceinline__ void swiglu_grad(float g, float u, float d, float& dg, float& du) {
  const float s = sigmoid(g);
  const float dsilu = s * (1.0f + g * (1.0f - s));
  du = d * g * s;
  dg = d * u * dsilu;
}

// y = silu(gate)·up; with kQ also y's FP8 codes (kV = 8, F % 128 == 0: whole half-warps leave
// at the end of the grid together).
template <typename T, int kV, bool kQ>
__global__ void swiglu_forward_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t N,
                                      int64_t F, RowCodes codes) {
  const int64_t e = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kV;
  if (e >= N * F) return;
  const int64_t n = e / F, j = e - n * F;
  const T* gate = x + n * 2 * F + j;
  float g[kV], u[kV];
  load_floats<kV>(gate, g);
  load_floats<kV>(gate + F, u);
#pragma unroll
  for (int k = 0; k < kV; ++k) g[k] = swiglu_of(g[k], u[k]);
  store_floats<kV>(y + e, g);
  if constexpr (kQ) {
    static_assert(kV == 8, "fp8 codes from 16-byte bf16 packs only");
#pragma unroll
    for (int k = 0; k < kV; ++k) g[k] = to_float(from_float<T>(g[k]));  // as stored
    codes.put(g, n, j);
  }
}

template <typename T, int kV, bool kOverwrite>
__global__ void swiglu_backward_kernel(const T* __restrict__ x, const T* __restrict__ dy,
                                       T* __restrict__ dx, int64_t N, int64_t F) {
  const int64_t e = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kV;
  if (e >= N * F) return;
  const int64_t n = e / F, j = e - n * F;
  const int64_t off = n * 2 * F + j;
  float g[kV], u[kV], d[kV];
  load_floats<kV>(x + off, g);
  load_floats<kV>(x + off + F, u);
  load_floats<kV>(dy + e, d);
#pragma unroll
  for (int k = 0; k < kV; ++k) swiglu_grad(g[k], u[k], d[k], g[k], u[k]);  // d gate, d up
  if constexpr (kOverwrite) {
    store_floats<kV>(dx + off, g);
    store_floats<kV>(dx + off + F, u);
  } else {
    add_floats<kV>(dx + off, g);
    add_floats<kV>(dx + off + F, u);
  }
}

// Note [SwiGLU backward with FP8 codes]
// The backward of SwiGLU writes d[gate | up] = dx [N, 2F], which is the output gradient of the
// FP8 gate|up projection: its data gradient reads dx in 1x128 tiles along the rows, its weight
// gradient in 1x128 tiles along the columns (transposed), i.e. fp8_quantize_rows_cols of dx, one
// more read of 2·N·2F bytes. Asked for (Note [gradient fp8 codes] in model/autograd.h), this
// kernel writes those codes from the values it stores: a CTA of 256 takes rows [r0, r0 + 128) and
// columns [j0, j0 + 128) of F, computes d gate and d up there (thread t: chunk t % 16 of rows
// t / 16 + 16i, the layout code_tile_rows_cols takes), stores them as bf16 and codes the two
// 128x128 tiles they form (columns j0 and F + j0 of dx): d gate from its registers, d up read
// back from the stores just made (L2, not DRAM: both tiles in registers spilled). Same math and
// rounding as swiglu_backward_kernel's, so dx is bit-identical to it and the codes to
// fp8_quantize_rows_cols of it. Written, not accumulated (the first writer of dx only).
// When the projection reads the codes only (dx null: Note [gradient fp8 codes] in
// model/autograd.h), dx is not stored at all and the d up tile waits in 32 KiB of dynamic shared
// memory instead of the stores: 2·N·2F bytes less to write, about a third of the kernel's traffic
// (an H100 trace of the Llama-3.2-1B fp8 step put the kernel at 430 us a layer).
constexpr int kCodesThreads = 256;

// d gate and d up of 8 elements from the bf16 inputs, rounded to bf16 (swiglu_backward_kernel's
// math): hg, hu packed in pairs.
__device__ __forceinline__ void swiglu_backward_8(const bf16* x, const bf16* dy, int64_t r,
                                                  int64_t F, int64_t j, uint4& hg4, uint4& hu4) {
  float g[8], u[8], d[8];
  load_floats<8>(x + r * 2 * F + j, g);
  load_floats<8>(x + r * 2 * F + F + j, u);
  load_floats<8>(dy + r * F + j, d);
  uint32_t hg[8], hu[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    float dg, du;
    swiglu_grad(g[k], u[k], d[k], dg, du);
    hg[k] = __bfloat16_as_ushort(from_float<bf16>(dg));
    hu[k] = __bfloat16_as_ushort(from_float<bf16>(du));
  }
  hg4 = make_uint4(hg[0] | hg[1] << 16, hg[2] | hg[3] << 16, hg[4] | hg[5] << 16,
                   hg[6] | hg[7] << 16);
  hu4 = make_uint4(hu[0] | hu[1] << 16, hu[2] | hu[3] << 16, hu[4] | hu[5] << 16,
                   hu[6] | hu[7] << 16);
}

template <bool kStore>
__global__ void __launch_bounds__(kCodesThreads, 2)
    swiglu_backward_codes_kernel(const bf16* __restrict__ x, const bf16* __restrict__ dy,
                                 bf16* __restrict__ dx, int64_t N, int64_t F,
                                 uint8_t* __restrict__ q, float* __restrict__ s,
                                 uint8_t* __restrict__ qt, float* __restrict__ st) {
  __shared__ uint4 tile[128][16];
  // Codes only: the d up tile waits in shared memory, each thread's 8 chunks in its own slots
  // (chunk i of thread t at i·256 + t: conflict-free), read back by the same thread; computing
  // it again instead spilled 288 bytes a thread (the accurate division's registers).
  extern __shared__ uint4 up[];
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * 128;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * 128 + 8 * (threadIdx.x % 16);
  uint4 w[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int64_t r = r0 + threadIdx.x / 16 + 16 * i;
    uint4 hu;
    swiglu_backward_8(x, dy, r, F, j, w[i], hu);
    if constexpr (kStore) {
      *reinterpret_cast<uint4*>(dx + r * 2 * F + j) = w[i];
      *reinterpret_cast<uint4*>(dx + r * 2 * F + F + j) = hu;
    } else {
      up[i * kCodesThreads + threadIdx.x] = hu;
    }
  }
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * 128;
  code_tile_rows_cols<true>(tile, w, r0, j0, N, 2 * F, q, s, qt, st);
  // The d up tile (holding both tiles in registers spilled): read back what this thread stored,
  // after every thread's column pass has read the shared tile.
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    if constexpr (kStore) {
      const int64_t r = r0 + threadIdx.x / 16 + 16 * i;
      w[i] = *reinterpret_cast<const uint4*>(dx + r * 2 * F + F + j);
    } else {
      w[i] = up[i * kCodesThreads + threadIdx.x];
    }
  }
  __syncthreads();
  code_tile_rows_cols<true>(tile, w, r0, F + j0, N, 2 * F, q, s, qt, st);
}

// Note [SwiGLU forward with both codes]
// For the FP8 down projection fused with SwiGLU (swiglu_linear_fp8, model/ops/fused_mlp.h): a CTA
// of 256 takes rows [r0, r0 + 128) and columns [j0, j0 + 128) of y, computes them as
// swiglu_forward_kernel does (rounded to bf16 as stored), and codes the tile both ways with
// code_tile_rows_cols: the row tiles for the forward product, the column tiles (yᵀ in 1x128
// tiles along the rows) for the weight gradient, which would otherwise quantize y again from a
// bf16 copy kept for the backward. y itself is stored only when asked for (y non-null).
__global__ void __launch_bounds__(kCodesThreads, 2)
    swiglu_forward_codes_kernel(const bf16* __restrict__ x, bf16* __restrict__ y, int64_t N,
                                int64_t F, uint8_t* __restrict__ q, float* __restrict__ s,
                                uint8_t* __restrict__ qt, float* __restrict__ st) {
  __shared__ uint4 tile[128][16];
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * 128;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * 128 + 8 * (threadIdx.x % 16);
  uint4 w[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int64_t r = r0 + threadIdx.x / 16 + 16 * i;
    float g[8], u[8];
    load_floats<8>(x + r * 2 * F + j, g);
    load_floats<8>(x + r * 2 * F + F + j, u);
    uint32_t h[8];
#pragma unroll
    for (int k = 0; k < 8; ++k)
      h[k] = __bfloat16_as_ushort(from_float<bf16>(swiglu_of(g[k], u[k])));
    w[i] = make_uint4(h[0] | h[1] << 16, h[2] | h[3] << 16, h[4] | h[5] << 16, h[6] | h[7] << 16);
    if (y != nullptr) *reinterpret_cast<uint4*>(y + r * F + j) = w[i];
  }
  code_tile_rows_cols<true>(tile, w, r0, static_cast<int64_t>(blockIdx.x) * 128, N, F, q, s, qt,
                            st);
}

// Whether kV-element packs fit every operand (F a multiple of kV, pointers 16-byte aligned).
bool packed(int64_t F, int kV, const void* a, const void* b, const void* c = nullptr) {
  return F % kV == 0 && is_aligned(a, 16) && is_aligned(b, 16) && is_aligned(c, 16);
}

}  // namespace

void swiglu_forward(const void* x, void* y, int64_t N, int64_t F, DType act, void* stream,
                    uint8_t* q, float* qs) {
  GTRON_CHECK(N >= 0 && F > 0, "swiglu: N = ", N, ", F = ", F);
  GTRON_CHECK(q == nullptr || act == DType::kBF16, "swiglu: fp8 codes of ", dtype_name(act),
              " rows; expected bf16");
  if (N == 0) return;
  const RowCodes codes{q, qs, N, F};
  dispatch_act("swiglu", act, [&](auto tag) {
    using T = decltype(tag);
    constexpr int kV = kPack<T>;
    const auto* xp = static_cast<const T*>(x);
    auto* yp = static_cast<T*>(y);
    auto st = static_cast<cudaStream_t>(stream);
    const bool pk = packed(F, kV, x, y);
    if constexpr (kV == 8) {
      if (q != nullptr && pk && F % fp8::kTile == 0 && is_aligned(q, 8)) {
        swiglu_forward_kernel<T, kV, true>
            <<<pack_blocks(N * F, kV), 256, 0, st>>>(xp, yp, N, F, codes);
        CUDA_CHECK_LAUNCH();
        return;
      }
    }
    if (pk) {
      swiglu_forward_kernel<T, kV, false>
          <<<pack_blocks(N * F, kV), 256, 0, st>>>(xp, yp, N, F, RowCodes{});
    } else {
      swiglu_forward_kernel<T, 1, false>
          <<<pack_blocks(N * F, 1), 256, 0, st>>>(xp, yp, N, F, RowCodes{});
    }
    CUDA_CHECK_LAUNCH();
    if (q != nullptr) fp8_quantize_rows(y, N, F, q, qs, stream);  // a layout the tiles do not fit
  });
}

void swiglu_backward(const void* x, const void* dy, void* dx, int64_t N, int64_t F, DType act,
                     void* stream, bool overwrite) {
  GTRON_CHECK(N >= 0 && F > 0, "swiglu: N = ", N, ", F = ", F);
  if (N == 0) return;
  dispatch_act("swiglu", act, [&](auto tag) {
    using T = decltype(tag);
    constexpr int kV = kPack<T>;
    const auto* xp = static_cast<const T*>(x);
    const auto* dyp = static_cast<const T*>(dy);
    auto* dxp = static_cast<T*>(dx);
    auto st = static_cast<cudaStream_t>(stream);
    const int64_t n = N * F;
    if (packed(F, kV, x, dy, dx) && overwrite) {
      swiglu_backward_kernel<T, kV, true><<<pack_blocks(n, kV), 256, 0, st>>>(xp, dyp, dxp, N, F);
    } else if (packed(F, kV, x, dy, dx)) {
      swiglu_backward_kernel<T, kV, false><<<pack_blocks(n, kV), 256, 0, st>>>(xp, dyp, dxp, N, F);
    } else if (overwrite) {
      swiglu_backward_kernel<T, 1, true><<<pack_blocks(n, 1), 256, 0, st>>>(xp, dyp, dxp, N, F);
    } else {
      swiglu_backward_kernel<T, 1, false><<<pack_blocks(n, 1), 256, 0, st>>>(xp, dyp, dxp, N, F);
    }
    CUDA_CHECK_LAUNCH();
  });
}

void swiglu_forward_fp8(const void* x, void* y, int64_t N, int64_t F, uint8_t* q, float* qs,
                        uint8_t* qt, float* qts, void* stream) {
  GTRON_CHECK(
      swiglu_backward_codes_ok(N, F, x, y, nullptr) && is_aligned(q, 16) && is_aligned(qt, 16),
      "swiglu_forward_fp8: N = ", N, ", F = ", F,
      " (both multiples of 128, 16-byte aligned operands required)");
  const dim3 grid(static_cast<unsigned>(F / 128), static_cast<unsigned>(N / 128));
  swiglu_forward_codes_kernel<<<grid, kCodesThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const bf16*>(x), static_cast<bf16*>(y), N, F, q, qs, qt, qts);
  CUDA_CHECK_LAUNCH();
}

bool swiglu_backward_codes_ok(int64_t N, int64_t F, const void* x, const void* dy, const void* dx) {
  return N > 0 && N % 128 == 0 && F % 128 == 0 && N / 128 <= 65535 && is_aligned(x, 16) &&
         is_aligned(dy, 16) && is_aligned(dx, 16);
}

void swiglu_backward_fp8(const void* x, const void* dy, void* dx, int64_t N, int64_t F, uint8_t* q,
                         float* qs, uint8_t* qt, float* qts, void* stream) {
  GTRON_CHECK(swiglu_backward_codes_ok(N, F, x, dy, dx) && is_aligned(q, 16) && is_aligned(qt, 16),
              "swiglu_backward_fp8: N = ", N, ", F = ", F,
              " (both multiples of 128, 16-byte aligned operands required)");
  const dim3 grid(static_cast<unsigned>(F / 128), static_cast<unsigned>(N / 128));
  const auto st = static_cast<cudaStream_t>(stream);
  const auto* xb = static_cast<const bf16*>(x);
  const auto* dyb = static_cast<const bf16*>(dy);
  if (dx != nullptr) {
    swiglu_backward_codes_kernel<true>
        <<<grid, kCodesThreads, 0, st>>>(xb, dyb, static_cast<bf16*>(dx), N, F, q, qs, qt, qts);
  } else {
    constexpr int kUpBytes = 8 * kCodesThreads * 16;  // beside the static 32 KiB tile
    static const bool once = [] {
      CUDA_CHECK(cudaFuncSetAttribute(swiglu_backward_codes_kernel<false>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, kUpBytes));
      return true;
    }();
    (void)once;
    swiglu_backward_codes_kernel<false>
        <<<grid, kCodesThreads, kUpBytes, st>>>(xb, dyb, nullptr, N, F, q, qs, qt, qts);
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace gtron::cuda

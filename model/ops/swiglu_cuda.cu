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
  for (int k = 0; k < kV; ++k) g[k] = g[k] * sigmoid(g[k]) * u[k];
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
  for (int k = 0; k < kV; ++k) {
    const float s = sigmoid(g[k]);
    const float dsilu = s * (1.0f + g[k] * (1.0f - s));
    const float dup = d[k] * g[k] * s;
    g[k] = d[k] * u[k] * dsilu;  // d gate
    u[k] = dup;
  }
  if constexpr (kOverwrite) {
    store_floats<kV>(dx + off, g);
    store_floats<kV>(dx + off + F, u);
  } else {
    add_floats<kV>(dx + off, g);
    add_floats<kV>(dx + off + F, u);
  }
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

}  // namespace gtron::cuda

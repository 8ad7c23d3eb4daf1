// GELU (tanh approximation) on CUDA. Memory-bound elementwise: thread i owns elements
// [i·kV, i·kV + kV), moved as 16-byte packs when every operand is aligned, the last partial pack
// element by element. fp32 math with the accurate tanhf (not the fast approximation), so f32
// results track the CPU kernel to a few ulps. With FP8 codes of the output wanted (Note [fp8
// fused producers] in model/ops/fp8.h) over rows of K % 128 == 0, 16 threads' packs are one 1x128
// tile of a row, which they quantize as they store it.
#include "model/cuda/kernel_util.cuh"
#include "model/ops/fp8.h"
#include "model/ops/fp8_tile.cuh"
#include "model/ops/gelu.h"

namespace gtron::cuda {

namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;  // sqrt(2/π)
constexpr float kCubic = 0.044715f;
constexpr float kCubic3 = static_cast<float>(3 * 0.044715);

__device__ __forceinline__ float gelu(float x) {
  const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}

// gelu'(x) = ½(1 + tanh u) + ½·x·(1 − tanh²u)·sqrt(2/π)·(1 + 3·0.044715·x²)
__device__ __forceinline__ float gelu_grad(float x) {
  const float th = tanhf(kSqrt2OverPi * (x + kCubic * x * x * x));
  const float du = kSqrt2OverPi * (1.0f + kCubic3 * x * x);
  return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
}

// y = gelu(x); with kQ also y's FP8 codes as rows of codes.K (kV = 8, n a multiple of K and K of
// 128: every live thread takes the packed branch, and half-warps leave the grid together).
template <typename T, int kV, bool kQ>
__global__ void gelu_forward_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n,
                                    RowCodes codes) {
  const int64_t base = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kV;
  if (base + kV <= n) {
    float v[kV];
    load_floats<kV>(x + base, v);
#pragma unroll
    for (int k = 0; k < kV; ++k) v[k] = gelu(v[k]);
    store_floats<kV>(y + base, v);
    if constexpr (kQ) {
      static_assert(kV == 8, "fp8 codes from 16-byte bf16 packs only");
#pragma unroll
      for (int k = 0; k < kV; ++k) v[k] = to_float(from_float<T>(v[k]));  // as stored
      const int64_t r = base / codes.K;
      codes.put(v, r, base - r * codes.K);
    }
  } else {
    for (int64_t e = base; e < n; ++e) y[e] = from_float<T>(gelu(to_float(x[e])));
  }
}

template <typename T, int kV, bool kOverwrite>
__global__ void gelu_backward_kernel(const T* __restrict__ x, const T* __restrict__ dy,
                                     T* __restrict__ dx, int64_t n) {
  const int64_t base = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kV;
  if (base + kV <= n) {
    float v[kV], d[kV];
    load_floats<kV>(x + base, v);
    load_floats<kV>(dy + base, d);
#pragma unroll
    for (int k = 0; k < kV; ++k) v[k] = gelu_grad(v[k]) * d[k];
    if constexpr (kOverwrite) {
      store_floats<kV>(dx + base, v);
    } else {
      add_floats<kV>(dx + base, v);
    }
  } else {
    for (int64_t e = base; e < n; ++e) {
      const float g = gelu_grad(to_float(x[e])) * to_float(dy[e]);
      dx[e] = from_float<T>(kOverwrite ? g : to_float(dx[e]) + g);
    }
  }
}

}  // namespace

void gelu_forward(const void* x, void* y, int64_t n, DType act, void* stream, uint8_t* q, float* qs,
                  int64_t K) {
  GTRON_CHECK(q == nullptr || (act == DType::kBF16 && K > 0 && n % K == 0), "gelu: fp8 codes of ",
              n, " ", dtype_name(act), " values as rows of ", K, "; expected bf16 rows");
  if (n == 0) return;
  const RowCodes codes{q, qs, q ? n / K : 0, K};
  dispatch_act("gelu", act, [&](auto tag) {
    using T = decltype(tag);
    constexpr int kV = kPack<T>;
    const auto* xp = static_cast<const T*>(x);
    auto* yp = static_cast<T*>(y);
    auto st = static_cast<cudaStream_t>(stream);
    const bool packed = is_aligned(x, 16) && is_aligned(y, 16);
    if constexpr (kV == 8) {
      if (q != nullptr && packed && K % fp8::kTile == 0 && is_aligned(q, 8)) {
        gelu_forward_kernel<T, kV, true><<<pack_blocks(n, kV), 256, 0, st>>>(xp, yp, n, codes);
        CUDA_CHECK_LAUNCH();
        return;
      }
    }
    if (packed) {
      gelu_forward_kernel<T, kV, false><<<pack_blocks(n, kV), 256, 0, st>>>(xp, yp, n, RowCodes{});
    } else {
      gelu_forward_kernel<T, 1, false><<<pack_blocks(n, 1), 256, 0, st>>>(xp, yp, n, RowCodes{});
    }
    CUDA_CHECK_LAUNCH();
    if (q != nullptr) fp8_quantize_rows(y, n / K, K, q, qs, stream);  // a layout tiles do not fit
  });
}

void gelu_backward(const void* x, const void* dy, void* dx, int64_t n, DType act, void* stream,
                   bool overwrite) {
  if (n == 0) return;
  dispatch_act("gelu", act, [&](auto tag) {
    using T = decltype(tag);
    constexpr int kV = kPack<T>;
    const auto* xp = static_cast<const T*>(x);
    const auto* dyp = static_cast<const T*>(dy);
    auto* dxp = static_cast<T*>(dx);
    auto st = static_cast<cudaStream_t>(stream);
    const bool packed = is_aligned(x, 16) && is_aligned(dy, 16) && is_aligned(dx, 16);
    if (packed && overwrite) {
      gelu_backward_kernel<T, kV, true><<<pack_blocks(n, kV), 256, 0, st>>>(xp, dyp, dxp, n);
    } else if (packed) {
      gelu_backward_kernel<T, kV, false><<<pack_blocks(n, kV), 256, 0, st>>>(xp, dyp, dxp, n);
    } else if (overwrite) {
      gelu_backward_kernel<T, 1, true><<<pack_blocks(n, 1), 256, 0, st>>>(xp, dyp, dxp, n);
    } else {
      gelu_backward_kernel<T, 1, false><<<pack_blocks(n, 1), 256, 0, st>>>(xp, dyp, dxp, n);
    }
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace gtron::cuda

// The fp32 -> bf16 cast behind the bf16 weight shadows (model/mixed_precision.h). Memory-bound:
// 16-byte loads (4 floats) and 8-byte stores when both pointers allow, else one element a thread.
#include <cuda_bf16.h>

#include <algorithm>

#include "model/cuda/check.h"
#include "model/mixed_precision.h"
#include "model/packed_master.h"

namespace gtron::cuda {

namespace {

__global__ void cast_vec4_kernel(const float4* x, __nv_bfloat162* y, int64_t n4) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n4;
       i += stride) {
    const float4 v = x[i];
    y[2 * i] = __floats2bfloat162_rn(v.x, v.y);
    y[2 * i + 1] = __floats2bfloat162_rn(v.z, v.w);
  }
}

__global__ void cast_scalar_kernel(const float* x, __nv_bfloat16* y, int64_t begin, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = begin + blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride) {
    y[i] = __float2bfloat16_rn(x[i]);
  }
}

// Note [packed masters]: element i's shadow to hi[i], its low half to lo[i], and back.
__global__ void pack_kernel(const uint32_t* x, uint16_t* hi, uint16_t* lo, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride) {
    const uint32_t b = x[i];
    hi[i] = packed::high_of(b);
    lo[i] = packed::low_of(b);
  }
}

__global__ void unpack_kernel(const uint16_t* hi, const uint16_t* lo, uint32_t* y, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride) {
    y[i] = packed::unpack(hi[i], lo[i]);
  }
}

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;

int blocks_for(int64_t n) {
  return static_cast<int>(
      std::max<int64_t>(1, std::min(kMaxBlocks, ceil_div<int64_t>(n, kThreads))));
}

}  // namespace

void cast_f32_to_bf16(const float* x, void* y, int64_t n, void* stream) {
  GTRON_CHECK(n >= 0 && (n == 0 || (x != nullptr && y != nullptr)), "cast_f32_to_bf16: n ", n);
  if (n == 0) return;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  auto* yb = static_cast<__nv_bfloat16*>(y);
  int64_t done = 0;
  if (reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(y) % 8 == 0) {
    const int64_t n4 = n / 4;
    if (n4 > 0) {
      cast_vec4_kernel<<<blocks_for(n4), kThreads, 0, s>>>(
          reinterpret_cast<const float4*>(x), reinterpret_cast<__nv_bfloat162*>(y), n4);
      CUDA_CHECK_LAUNCH();
    }
    done = n4 * 4;
  }
  if (done < n) {
    cast_scalar_kernel<<<blocks_for(n - done), kThreads, 0, s>>>(x, yb, done, n);
    CUDA_CHECK_LAUNCH();
  }
}

void pack_masters(const float* x, void* out, int64_t n, void* stream) {
  GTRON_CHECK(n >= 0 && (n == 0 || (x != nullptr && out != nullptr)), "pack_masters: n ", n);
  if (n == 0) return;
  auto* hi = static_cast<uint16_t*>(out);
  pack_kernel<<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      reinterpret_cast<const uint32_t*>(x), hi, hi + n, n);
  CUDA_CHECK_LAUNCH();
}

void unpack_masters(const void* packed, float* out, int64_t n, void* stream) {
  GTRON_CHECK(n >= 0 && (n == 0 || (packed != nullptr && out != nullptr)), "unpack_masters: n ", n);
  if (n == 0) return;
  const auto* hi = static_cast<const uint16_t*>(packed);
  unpack_kernel<<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      hi, hi + n, reinterpret_cast<uint32_t*>(out), n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace gtron::cuda

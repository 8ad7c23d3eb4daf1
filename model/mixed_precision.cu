// The fp32 -> bf16 cast behind the bf16 weight shadows (model/mixed_precision.h). Memory-bound:
// 16-byte loads (4 floats) and 8-byte stores when both pointers allow, else one element a thread.
#include <cuda_bf16.h>

#include <algorithm>

#include "model/cuda/check.h"
#include "model/mixed_precision.h"

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

}  // namespace gtron::cuda

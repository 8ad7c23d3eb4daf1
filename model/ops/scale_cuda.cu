// scale (loss scaling, MTP weighting) on CUDA: y = s·x, or dx += s·dy for the backward.
#include "model/cuda/kernel_util.cuh"
#include "model/ops/loss.h"

namespace gtron::cuda {

namespace {

template <typename T, int kV>
__global__ void scale_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n, float f,
                             bool accumulate) {
  const int64_t base = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kV;
  if (base + kV <= n) {
    float v[kV];
    load_floats<kV>(x + base, v);
#pragma unroll
    for (int k = 0; k < kV; ++k) v[k] *= f;
    if (accumulate) {
      add_floats<kV>(y + base, v);
    } else {
      store_floats<kV>(y + base, v);
    }
  } else {
    for (int64_t e = base; e < n; ++e) {
      const float v = f * to_float(x[e]);
      y[e] = from_float<T>(accumulate ? to_float(y[e]) + v : v);
    }
  }
}

void launch_scale(const void* x, void* y, int64_t n, double s, DType dtype, bool accumulate,
                  void* stream) {
  if (n == 0) return;
  const float f = static_cast<float>(s);
  dispatch_act("scale", dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr int kV = kPack<T>;
    const auto* xp = static_cast<const T*>(x);
    auto* yp = static_cast<T*>(y);
    auto st = static_cast<cudaStream_t>(stream);
    if (is_aligned(x, 16) && is_aligned(y, 16)) {
      scale_kernel<T, kV><<<pack_blocks(n, kV), 256, 0, st>>>(xp, yp, n, f, accumulate);
    } else {
      scale_kernel<T, 1><<<pack_blocks(n, 1), 256, 0, st>>>(xp, yp, n, f, accumulate);
    }
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

void scale_forward(const void* x, void* y, int64_t n, double s, DType dtype, void* stream) {
  launch_scale(x, y, n, s, dtype, false, stream);
}

void scale_backward(const void* dy, void* dx, int64_t n, double s, DType dtype, void* stream) {
  launch_scale(dy, dx, n, s, dtype, true, stream);
}

}  // namespace gtron::cuda

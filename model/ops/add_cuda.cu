// Elementwise add and accumulate on CUDA. Memory-bound: thread i owns elements
// [i·kV, i·kV + kV); whole packs move as 16-byte vectors (4 floats, 8 bf16) when every operand is
// 16-byte aligned, the last partial pack element by element. Unaligned operands (views) take the
// kV = 1 instantiation.
#include "model/cuda/kernel_util.cuh"
#include "model/ops/add.h"

namespace gtron::cuda {

namespace {

// y = a + b. In place (y == a) is fine: each element is read before it is written, by one thread.
template <typename T, int kV>
__global__ void add_kernel(const T* a, const T* b, T* y, int64_t n) {
  const int64_t base = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kV;
  if (base + kV <= n) {
    float va[kV], vb[kV];
    load_floats<kV>(a + base, va);
    load_floats<kV>(b + base, vb);
#pragma unroll
    for (int k = 0; k < kV; ++k) va[k] += vb[k];
    store_floats<kV>(y + base, va);
  } else {
    for (int64_t e = base; e < n; ++e) y[e] = from_float<T>(to_float(a[e]) + to_float(b[e]));
  }
}

template <typename T>
void launch(const void* a, const void* b, void* y, int64_t n, void* stream) {
  if (n == 0) return;
  constexpr int kThreads = 256;
  constexpr int kV = kPack<T>;
  const auto* ap = static_cast<const T*>(a);
  const auto* bp = static_cast<const T*>(b);
  auto* yp = static_cast<T*>(y);
  auto st = static_cast<cudaStream_t>(stream);
  if (is_aligned(a, 16) && is_aligned(b, 16) && is_aligned(y, 16)) {
    const auto blocks =
        static_cast<unsigned>(ceil_div<int64_t>(ceil_div<int64_t>(n, kV), kThreads));
    add_kernel<T, kV><<<blocks, kThreads, 0, st>>>(ap, bp, yp, n);
  } else {
    const auto blocks = static_cast<unsigned>(ceil_div<int64_t>(n, kThreads));
    add_kernel<T, 1><<<blocks, kThreads, 0, st>>>(ap, bp, yp, n);
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void add_forward(const void* a, const void* b, void* y, int64_t n, DType dtype, void* stream) {
  dispatch_act("add", dtype, [&](auto tag) { launch<decltype(tag)>(a, b, y, n, stream); });
}

void accumulate(void* dst, const void* src, int64_t n, DType dtype, void* stream) {
  add_forward(dst, src, dst, n, dtype, stream);  // in place: each element is read before written
}

}  // namespace gtron::cuda

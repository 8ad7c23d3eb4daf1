// Elementwise add and accumulate on CUDA. Memory-bound: each thread moves 16 bytes per operand
// (4 floats or 8 bf16) when the pointers are 16-byte aligned, with a scalar tail.
#include <cuda_bf16.h>

#include "model/cuda/check.cuh"
#include "model/ops/add.h"

namespace gtron::cuda {

namespace {

template <typename T>
struct alignas(16) Pack {
  static constexpr int kN = 16 / sizeof(T);
  T v[kN];
};

template <typename T>
__global__ void add_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ y,
                           int64_t n, bool accumulate) {
  using P = Pack<T>;
  const int64_t packs = n / P::kN;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < packs) {
    P pa = reinterpret_cast<const P*>(a)[i];
    P pb = reinterpret_cast<const P*>(b)[i];
    P out;
#pragma unroll
    for (int k = 0; k < P::kN; ++k) {
      out.v[k] = static_cast<T>(static_cast<float>(pa.v[k]) + static_cast<float>(pb.v[k]));
    }
    reinterpret_cast<P*>(y)[i] = out;
  }
  // The tail (n not a multiple of the pack) is handled by the first threads.
  const int64_t t = packs * P::kN + i;
  if (i < P::kN && t < n) y[t] = static_cast<T>(static_cast<float>(a[t]) + static_cast<float>(b[t]));
  (void)accumulate;
}

template <typename T>
void launch(const void* a, const void* b, void* y, int64_t n, void* stream) {
  GTRON_CHECK(reinterpret_cast<uintptr_t>(a) % 16 == 0 && reinterpret_cast<uintptr_t>(b) % 16 == 0 &&
                  reinterpret_cast<uintptr_t>(y) % 16 == 0,
              "add: operands must be 16-byte aligned");
  if (n == 0) return;
  constexpr int kThreads = 256;
  const int64_t packs = n / Pack<T>::kN;
  const int64_t threads_needed = packs > Pack<T>::kN ? packs : Pack<T>::kN;
  const int blocks = static_cast<int>(ceil_div<int64_t>(threads_needed, kThreads));
  add_kernel<T><<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(y), n, false);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void add_forward(const void* a, const void* b, void* y, int64_t n, DType dtype, void* stream) {
  if (dtype == DType::kF32) {
    launch<float>(a, b, y, n, stream);
  } else {
    GTRON_CHECK(dtype == DType::kBF16, "add: f32 or bf16 on CUDA; got ", dtype_name(dtype));
    launch<__nv_bfloat16>(a, b, y, n, stream);
  }
}

void accumulate(void* dst, const void* src, int64_t n, DType dtype, void* stream) {
  add_forward(dst, src, dst, n, dtype, stream);  // in place: each element is read before written
}

}  // namespace gtron::cuda

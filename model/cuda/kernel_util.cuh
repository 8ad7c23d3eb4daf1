// Device helpers shared by the op kernels: element conversion, 16-byte packs, dtype dispatch,
// warp and block reductions, and a scratch carver.
//
// Policy for memory-bound kernels: a thread moves 16 bytes per operand (4 floats, 8 bf16) when
// every pointer it touches is aligned to its pack width and the row length is a multiple of the
// pack; otherwise the same kernel is instantiated with packs of one element. All math is fp32.
//
// Reductions are deterministic: warp sums use the xor butterfly (every lane ends with the same
// bits) and block sums combine the warp results in a fixed tree, so for a fixed block size the
// result does not depend on timing.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "model/cuda/check.h"
#include "model/dtype.h"

namespace gtron::cuda {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(bf16 v) { return __bfloat162float(v); }

// Rounds to nearest even for bf16 (the same rounding as float_to_bf16 on the host).
template <typename T>
__device__ __forceinline__ T from_float(float v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
    return __float2bfloat16_rn(v);
  }
}

// kV elements of T moved as one access (16 bytes for the full pack).
template <typename T, int kV>
struct alignas(sizeof(T) * kV) Pack {
  T v[kV];
};

// Elements per 16-byte pack.
template <typename T>
constexpr int kPack = 16 / sizeof(T);

// Blocks of 256 threads for an elementwise kernel over n elements, kV a thread.
inline unsigned pack_blocks(int64_t n, int kV) {
  return static_cast<unsigned>(ceil_div<int64_t>(ceil_div<int64_t>(n, kV), 256));
}

template <int kV, typename T>
__device__ __forceinline__ void load_floats(const T* p, float (&out)[kV]) {
  const Pack<T, kV> pk = *reinterpret_cast<const Pack<T, kV>*>(p);
#pragma unroll
  for (int k = 0; k < kV; ++k) out[k] = to_float(pk.v[k]);
}

template <int kV, typename T>
__device__ __forceinline__ void store_floats(T* p, const float (&in)[kV]) {
  Pack<T, kV> pk;
#pragma unroll
  for (int k = 0; k < kV; ++k) pk.v[k] = from_float<T>(in[k]);
  *reinterpret_cast<Pack<T, kV>*>(p) = pk;
}

// p[0, kV) += in (read in T, added in fp32, rounded once).
template <int kV, typename T>
__device__ __forceinline__ void add_floats(T* p, const float (&in)[kV]) {
  float cur[kV];
  load_floats<kV>(p, cur);
#pragma unroll
  for (int k = 0; k < kV; ++k) cur[k] += in[k];
  store_floats<kV>(p, cur);
}

// 2^x on the special-function unit alone (ex2.approx.ftz: results below 2^-126 flush to zero,
// -inf gives 0). exp2f would add a range check and two multiplies per call to keep denormal
// results, which softmax weights and probabilities never need (in the flash kernels those extra
// steps were a third of the exponent step's instructions).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block, returned to every thread. REQUIRES: blockDim.x a multiple of 32 (at most
// 1024), called by all threads; `smem` holds 32 floats.
__device__ __forceinline__ float block_sum(float v, float* smem) {
  v = warp_sum(v);
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  __syncthreads();  // a previous call may still be reading smem
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  const float w = lane < static_cast<int>(blockDim.x / 32) ? smem[lane] : 0.0f;
  return warp_sum(w);
}

// Host side: is `p` aligned to `bytes`? (null counts as aligned: it is never dereferenced.)
inline bool is_aligned(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// Calls fn(T{}) with T = float or bf16 by the activation dtype.
template <typename Fn>
void dispatch_act(const char* op, DType act, Fn&& fn) {
  if (act == DType::kF32) {
    fn(float{});
  } else {
    GTRON_CHECK(act == DType::kBF16, op, ": CUDA activations are f32 or bf16; got ",
                dtype_name(act));
    fn(bf16{});
  }
}

// Calls fn(T{}, P{}) for activations T and parameter values P: f32/f32, bf16/f32 or bf16/bf16.
template <typename Fn>
void dispatch_act_param(const char* op, DType act, DType param, Fn&& fn) {
  if (act == DType::kF32 && param == DType::kF32) {
    fn(float{}, float{});
  } else if (act == DType::kBF16 && param == DType::kF32) {
    fn(bf16{}, float{});
  } else if (act == DType::kBF16 && param == DType::kBF16) {
    fn(bf16{}, bf16{});
  } else {
    GTRON_CHECK(false, op, ": activations ", dtype_name(act), " with parameters ",
                dtype_name(param), "; CUDA takes f32/f32, bf16/f32 or bf16/bf16");
  }
}

// Cuts one scratch buffer into 256-byte aligned pieces. With a null base it only counts bytes,
// so a launcher's size query and its launch share one layout.
class ScratchCarver {
 public:
  explicit ScratchCarver(void* base) : base_(static_cast<char*>(base)) {}
  template <typename T>
  T* take(int64_t n) {
    offset_ = (offset_ + 255) / 256 * 256;
    T* p = base_ ? reinterpret_cast<T*>(base_ + offset_) : nullptr;
    offset_ += static_cast<size_t>(n) * sizeof(T);
    return p;
  }
  size_t bytes() const { return offset_; }

 private:
  char* base_;
  size_t offset_ = 0;
};

}  // namespace gtron::cuda

// RoPE on CUDA (Note [rotate-half RoPE] in model/ops/rope.h). Memory-bound: one thread per pair
// slot of a row. A row of W = (NH + 2·NKV)·HS columns has W/2 slots: the first (NH + NKV)·HS/2
// rotate the pair (i, i + HS/2) of one q or k head, the rest copy two adjacent v columns.
// Consecutive threads take consecutive i of a head, so accesses coalesce. The rotation itself is
// rope_math.cuh's (fp32, the accurate sincosf).
//
// Note [packed RoPE]
// The kernel above moves 2 bytes per load in bf16: on the H200 a pass over the Llama-3.2-1B
// shape's q|k|v rows (8192 × 3072) took 102 µs, a quarter of the bandwidth. When HS/2 and the
// row width are multiples of the 16-byte pack (8 bf16 or 4 f32 elements) and the pointers are
// 16-byte aligned, a thread instead takes kV consecutive pair slots of one head (or kV pairs of
// v columns) with pack loads and stores; the per-element arithmetic is the same, so the results
// are bit-identical.
#include "model/cuda/kernel_util.cuh"
#include "model/ops/rope.h"
#include "model/ops/rope_math.cuh"

namespace gtron::cuda {

namespace {

constexpr int kThreads = 256;

struct RopeDims {
  int64_t rows, Tlen, pos0;
  const int32_t* row_start = nullptr;  // set: batch row b's positions start at row_start[b]
  int W, H, rotated_slots, slots;      // row width, HS/2, q/k pair slots, all slots of a row
};

RopeDims rope_dims(int64_t B, int64_t Tlen, int64_t NH, int64_t NKV, int64_t HS, int64_t pos0) {
  GTRON_CHECK(NH > 0 && NKV > 0 && HS > 0 && HS % 2 == 0, "rope: NH = ", NH, ", NKV = ", NKV,
              ", HS = ", HS, "; need NH, NKV > 0 and HS even");
  const int64_t W = (NH + 2 * NKV) * HS;
  GTRON_CHECK(W < (int64_t{1} << 30), "rope: row width ", W, " too large");
  RopeDims d;
  d.rows = B * Tlen;
  d.Tlen = Tlen;
  d.pos0 = pos0;
  d.W = static_cast<int>(W);
  d.H = static_cast<int>(HS / 2);
  d.rotated_slots = static_cast<int>((NH + NKV) * HS / 2);
  d.slots = d.W / 2;
  return d;
}

// The position of row r (of B·Tlen): pos0, or its batch row's device-side start, plus r % Tlen.
__device__ __forceinline__ float position(const RopeDims& d, int64_t r) {
  const int64_t t = r % d.Tlen;
  return static_cast<float>((d.row_start != nullptr ? d.row_start[r / d.Tlen] : d.pos0) + t);
}

// kSign = 1: y = R·x (forward); kSign = −1: y (+)= Rᵀ·x (backward).
template <typename T, int kSign, bool kAccumulate>
__global__ void rope_kernel(const T* __restrict__ x, const float* __restrict__ inv_freq,
                            T* __restrict__ y, RopeDims d) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= d.rows * d.slots) return;
  const int64_t r = e / d.slots;
  const int p = static_cast<int>(e - r * d.slots);
  int c0, c1;  // the two columns of the slot
  float lo, hi;
  const T* xr = x + r * d.W;
  if (p < d.rotated_slots) {
    const int head = p / d.H, i = p - head * d.H;
    c0 = head * 2 * d.H + i;
    c1 = c0 + d.H;
    rope_rotate<kSign>(position(d, r), inv_freq[i], to_float(xr[c0]), to_float(xr[c1]), &lo, &hi);
  } else {
    c0 = 2 * d.rotated_slots + 2 * (p - d.rotated_slots);
    c1 = c0 + 1;
    lo = to_float(xr[c0]);
    hi = to_float(xr[c1]);
  }
  T* yr = y + r * d.W;
  if constexpr (kAccumulate) {
    lo += to_float(yr[c0]);
    hi += to_float(yr[c1]);
  }
  yr[c0] = from_float<T>(lo);
  yr[c1] = from_float<T>(hi);
}

// Note [packed RoPE]: a thread takes kV slots of a row: kV rotated pairs of one head (slot p = a
// multiple of kV, so all within one head as H % kV == 0), or kV·2 adjacent v columns.
template <typename T, int kSign, bool kAccumulate>
__global__ void rope_packed_kernel(const T* __restrict__ x, const float* __restrict__ inv_freq,
                                   T* __restrict__ y, RopeDims d) {
  constexpr int kV = kPack<T>;
  const int groups = d.slots / kV;
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= d.rows * groups) return;
  const int64_t r = e / groups;
  const int p = static_cast<int>(e - r * groups) * kV;
  const T* xr = x + r * d.W;
  T* yr = y + r * d.W;
  if (p < d.rotated_slots) {
    const int head = p / d.H, i = p - head * d.H;
    const int c0 = head * 2 * d.H + i, c1 = c0 + d.H;
    const float pos = position(d, r);
    float a[kV], b[kV], lo[kV], hi[kV];
    load_floats<kV>(xr + c0, a);
    load_floats<kV>(xr + c1, b);
#pragma unroll
    for (int k = 0; k < kV; ++k)
      rope_rotate<kSign>(pos, inv_freq[i + k], a[k], b[k], &lo[k], &hi[k]);
    if constexpr (kAccumulate) {
      add_floats<kV>(yr + c0, lo);
      add_floats<kV>(yr + c1, hi);
    } else {
      store_floats<kV>(yr + c0, lo);
      store_floats<kV>(yr + c1, hi);
    }
  } else {
    const int c0 = 2 * d.rotated_slots + 2 * (p - d.rotated_slots);  // 2·kV v columns
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float v[kV];
      load_floats<kV>(xr + c0 + half * kV, v);
      if constexpr (kAccumulate) {
        add_floats<kV>(yr + c0 + half * kV, v);
      } else {
        store_floats<kV>(yr + c0 + half * kV, v);
      }
    }
  }
}

template <int kSign, bool kAccumulate>
void launch(const void* x, const float* inv_freq, void* y, const RopeDims& d, DType act,
            void* stream) {
  dispatch_act("rope", act, [&](auto tag) {
    using T = decltype(tag);
    constexpr int kV = kPack<T>;
    const auto st = static_cast<cudaStream_t>(stream);
    if (d.H % kV == 0 && d.W % (2 * kV) == 0 && is_aligned(x, 16) && is_aligned(y, 16)) {
      const auto blocks =
          static_cast<unsigned>(ceil_div<int64_t>(d.rows * (d.slots / kV), kThreads));
      rope_packed_kernel<T, kSign, kAccumulate>
          <<<blocks, kThreads, 0, st>>>(static_cast<const T*>(x), inv_freq, static_cast<T*>(y), d);
    } else {
      const auto blocks = static_cast<unsigned>(ceil_div<int64_t>(d.rows * d.slots, kThreads));
      rope_kernel<T, kSign, kAccumulate>
          <<<blocks, kThreads, 0, st>>>(static_cast<const T*>(x), inv_freq, static_cast<T*>(y), d);
    }
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

void rope_forward(const void* x, const float* inv_freq, void* y, int64_t B, int64_t Tlen,
                  int64_t NH, int64_t NKV, int64_t HS, int64_t pos0, DType act, void* stream) {
  const RopeDims d = rope_dims(B, Tlen, NH, NKV, HS, pos0);
  if (d.rows == 0) return;
  GTRON_CHECK(x != y, "rope: the output must not alias the input");
  launch<1, false>(x, inv_freq, y, d, act, stream);
}

void rope_forward_at(const void* x, const float* inv_freq, void* y, int64_t B, int64_t Tlen,
                     int64_t NH, int64_t NKV, int64_t HS, const int32_t* start, DType act,
                     void* stream) {
  RopeDims d = rope_dims(B, Tlen, NH, NKV, HS, 0);
  if (d.rows == 0) return;
  GTRON_CHECK(x != y && start != nullptr, "rope_forward_at: needs its starts, and y apart from x");
  d.row_start = start;
  launch<1, false>(x, inv_freq, y, d, act, stream);
}

void rope_forward_inplace(void* x, const float* inv_freq, int64_t B, int64_t Tlen, int64_t NH,
                          int64_t NKV, int64_t HS, int64_t pos0, DType act, void* stream) {
  RopeDims d = rope_dims(B, Tlen, NH, NKV, HS, pos0);
  if (d.rows == 0) return;
  d.slots = d.rotated_slots;  // a row's q/k pairs only: the v columns stay as they are
  // Each pair is read and written by one thread, so the rotation may overwrite its input.
  launch<1, false>(x, inv_freq, x, d, act, stream);
}

void rope_backward(const void* dy, const float* inv_freq, void* dx, int64_t B, int64_t Tlen,
                   int64_t NH, int64_t NKV, int64_t HS, int64_t pos0, DType act, void* stream,
                   bool overwrite) {
  const RopeDims d = rope_dims(B, Tlen, NH, NKV, HS, pos0);
  if (d.rows == 0) return;
  if (overwrite) {
    launch<-1, false>(dy, inv_freq, dx, d, act, stream);
  } else {
    launch<-1, true>(dy, inv_freq, dx, d, act, stream);
  }
}

}  // namespace gtron::cuda

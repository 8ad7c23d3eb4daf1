// RoPE on CUDA (Note [rotate-half RoPE] in model/ops/rope.h). Memory-bound: one thread per pair
// slot of a row. A row of W = (NH + 2·NKV)·HS columns has W/2 slots: the first (NH + NKV)·HS/2
// rotate the pair (i, i + HS/2) of one q or k head, the rest copy two adjacent v columns.
// Consecutive threads take consecutive i of a head, so accesses coalesce. fp32 math with the
// accurate sincosf (angles reach pos·inv_freq[0] = pos radians: the fast __sincosf would lose
// them).
#include "model/cuda/kernel_util.cuh"
#include "model/ops/rope.h"

namespace gtron::cuda {

namespace {

constexpr int kThreads = 256;

struct RopeDims {
  int64_t rows, Tlen, pos0;
  int W, H, rotated_slots, slots;  // row width, HS/2, q/k pair slots, all slots of a row
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
    const float pos = static_cast<float>(d.pos0 + r % d.Tlen);
    float s, c;
    sincosf(pos * inv_freq[i], &s, &c);
    s *= kSign;
    const float a = to_float(xr[c0]), b = to_float(xr[c1]);
    lo = a * c - b * s;
    hi = b * c + a * s;
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

template <int kSign, bool kAccumulate>
void launch(const void* x, const float* inv_freq, void* y, const RopeDims& d, DType act,
            void* stream) {
  dispatch_act("rope", act, [&](auto tag) {
    using T = decltype(tag);
    const auto blocks = static_cast<unsigned>(ceil_div<int64_t>(d.rows * d.slots, kThreads));
    rope_kernel<T, kSign, kAccumulate><<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const T*>(x), inv_freq, static_cast<T*>(y), d);
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

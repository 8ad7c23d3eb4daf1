// concat_features on CUDA: one thread per kV elements of the output row space [N, Ca + Cb]. When
// Ca and Cb are multiples of the 16-byte pack (and the buffers aligned), a pack never straddles
// the a|b boundary and moves as one vector; otherwise kV = 1. With FP8 codes of the output wanted
// (Note [fp8 fused producers] in model/ops/fp8.h) and Ca + Cb % 128 == 0, 16 threads' packs are
// one 1x128 tile of a row, which they quantize as they store it.
#include "model/cuda/kernel_util.cuh"
#include "model/ops/concat.h"
#include "model/ops/fp8.h"
#include "model/ops/fp8_tile.cuh"

namespace gtron::cuda {

namespace {

constexpr int kThreads = 256;

// With kQ also y's FP8 codes (kV = 8, (Ca + Cb) % 128 == 0: half-warps leave the grid together).
template <typename T, int kV, bool kQ>
__global__ void concat_forward_kernel(const T* __restrict__ a, const T* __restrict__ b,
                                      T* __restrict__ y, int64_t N, int64_t Ca, int64_t Cb,
                                      RowCodes codes) {
  const int64_t C = Ca + Cb;
  const int64_t e = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kV;
  if (e >= N * C) return;
  const int64_t i = e / C;
  const int64_t c = e % C;
  const T* src = c < Ca ? a + i * Ca + c : b + i * Cb + (c - Ca);
  const Pack<T, kV> p = *reinterpret_cast<const Pack<T, kV>*>(src);
  *reinterpret_cast<Pack<T, kV>*>(y + e) = p;
  if constexpr (kQ) {
    static_assert(kV == 8, "fp8 codes from 16-byte bf16 packs only");
    float v[kV];
#pragma unroll
    for (int k = 0; k < kV; ++k) v[k] = to_float(p.v[k]);
    codes.put(v, i, c);
  }
}

template <typename T, int kV>
__global__ void concat_backward_kernel(const T* __restrict__ dy, T* __restrict__ da,
                                       T* __restrict__ db, int64_t N, int64_t Ca, int64_t Cb) {
  const int64_t C = Ca + Cb;
  const int64_t e = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kV;
  if (e >= N * C) return;
  const int64_t i = e / C;
  const int64_t c = e % C;
  T* dst = c < Ca ? (da ? da + i * Ca + c : nullptr) : (db ? db + i * Cb + (c - Ca) : nullptr);
  if (dst == nullptr) return;
  float g[kV];
  load_floats<kV>(dy + e, g);
  add_floats<kV>(dst, g);
}

template <typename T>
bool packed(int64_t Ca, int64_t Cb, const void* p, const void* q, const void* r) {
  constexpr int kV = kPack<T>;
  return Ca % kV == 0 && Cb % kV == 0 && is_aligned(p, 16) && is_aligned(q, 16) &&
         is_aligned(r, 16);
}

}  // namespace

void concat_forward(const void* a, const void* b, void* y, int64_t N, int64_t Ca, int64_t Cb,
                    DType act, void* stream, uint8_t* q, float* qs) {
  GTRON_CHECK(q == nullptr || act == DType::kBF16, "concat_features: fp8 codes of ",
              dtype_name(act), " rows; expected bf16");
  const int64_t n = N * (Ca + Cb);
  if (n == 0) return;
  const RowCodes codes{q, qs, N, Ca + Cb};
  dispatch_act("concat_features", act, [&](auto tag) {
    using T = decltype(tag);
    constexpr int kV = kPack<T>;
    const auto* ap = static_cast<const T*>(a);
    const auto* bp = static_cast<const T*>(b);
    auto* yp = static_cast<T*>(y);
    auto st = static_cast<cudaStream_t>(stream);
    const auto packed_blocks = static_cast<unsigned>(ceil_div<int64_t>(n / kV, kThreads));
    const bool pk = packed<T>(Ca, Cb, a, b, y);
    if constexpr (kV == 8) {
      if (q != nullptr && pk && (Ca + Cb) % fp8::kTile == 0 && is_aligned(q, 8)) {
        concat_forward_kernel<T, kV, true>
            <<<packed_blocks, kThreads, 0, st>>>(ap, bp, yp, N, Ca, Cb, codes);
        CUDA_CHECK_LAUNCH();
        return;
      }
    }
    if (pk) {
      concat_forward_kernel<T, kV, false>
          <<<packed_blocks, kThreads, 0, st>>>(ap, bp, yp, N, Ca, Cb, RowCodes{});
    } else {
      const auto blocks = static_cast<unsigned>(ceil_div<int64_t>(n, kThreads));
      concat_forward_kernel<T, 1, false>
          <<<blocks, kThreads, 0, st>>>(ap, bp, yp, N, Ca, Cb, RowCodes{});
    }
    CUDA_CHECK_LAUNCH();
    if (q != nullptr) fp8_quantize_rows(y, N, Ca + Cb, q, qs, stream);  // packs that do not fit
  });
}

void concat_backward(const void* dy, void* da, void* db, int64_t N, int64_t Ca, int64_t Cb,
                     DType act, void* stream) {
  const int64_t n = N * (Ca + Cb);
  if (n == 0 || (da == nullptr && db == nullptr)) return;
  dispatch_act("concat_features", act, [&](auto tag) {
    using T = decltype(tag);
    constexpr int kV = kPack<T>;
    const auto* dyp = static_cast<const T*>(dy);
    auto* dap = static_cast<T*>(da);
    auto* dbp = static_cast<T*>(db);
    auto st = static_cast<cudaStream_t>(stream);
    if (packed<T>(Ca, Cb, dy, da, db)) {
      const auto blocks = static_cast<unsigned>(ceil_div<int64_t>(n / kV, kThreads));
      concat_backward_kernel<T, kV><<<blocks, kThreads, 0, st>>>(dyp, dap, dbp, N, Ca, Cb);
    } else {
      const auto blocks = static_cast<unsigned>(ceil_div<int64_t>(n, kThreads));
      concat_backward_kernel<T, 1><<<blocks, kThreads, 0, st>>>(dyp, dap, dbp, N, Ca, Cb);
    }
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace gtron::cuda

// CPU kernels of RoPE (Note [rotate-half RoPE] in model/ops/rope.h). Rows run in parallel, each
// on one thread: every element is computed by the same scalar code whatever the thread count, so
// results are bit-deterministic. A row's cos/sin are formed once and shared by its heads.
#include <cmath>
#include <vector>

#include "model/ops/rope.h"

namespace gtron::cpu {

namespace {

constexpr int64_t kParallelMin = 1 << 14;  // elements; below this a thread team costs more

// cs[i] = cos, cs[H + i] = sin of angle pos·inv_freq[i], in T (fp32 for f32, as on the GPU).
template <typename T>
void row_angles(const T* inv_freq, int64_t H, int64_t pos, T* cs) {
  for (int64_t i = 0; i < H; ++i) {
    const T a = static_cast<T>(pos) * inv_freq[i];
    cs[i] = std::cos(a);
    cs[H + i] = std::sin(a);
  }
}

// The rows of x (or dy) through the rotation by +angle (forward) or −angle (backward, kSign = −1),
// written (forward) or added (backward) into out.
template <typename T, int kSign, bool kAccumulate>
void rotate_rows(const T* x, const T* inv_freq, T* out, int64_t B, int64_t Tlen, int64_t NH,
                 int64_t NKV, int64_t HS, int64_t pos0) {
  const int64_t H = HS / 2;
  const int64_t W = (NH + 2 * NKV) * HS;
  const int64_t rotated = (NH + NKV) * HS;  // q and k columns; the v columns follow
  const int64_t N = B * Tlen;
#pragma omp parallel if (N * W >= kParallelMin)
  {
    std::vector<T> cs(static_cast<size_t>(HS));
#pragma omp for
    for (int64_t r = 0; r < N; ++r) {
      row_angles(inv_freq, H, pos0 + r % Tlen, cs.data());
      const T* xr = x + r * W;
      T* yr = out + r * W;
      for (int64_t c0 = 0; c0 < rotated; c0 += HS) {
        for (int64_t i = 0; i < H; ++i) {
          const T c = cs[i], s = kSign * cs[H + i];
          const T a = xr[c0 + i], b = xr[c0 + H + i];
          const T lo = a * c - b * s, hi = b * c + a * s;
          if constexpr (kAccumulate) {
            yr[c0 + i] += lo;
            yr[c0 + H + i] += hi;
          } else {
            yr[c0 + i] = lo;
            yr[c0 + H + i] = hi;
          }
        }
      }
      for (int64_t c = rotated; c < W; ++c) {
        if constexpr (kAccumulate) {
          yr[c] += xr[c];
        } else {
          yr[c] = xr[c];
        }
      }
    }
  }
}

}  // namespace

template <typename T>
void rope_forward(const T* x, const T* inv_freq, T* y, int64_t B, int64_t Tlen, int64_t NH,
                  int64_t NKV, int64_t HS, int64_t pos0) {
  rotate_rows<T, 1, false>(x, inv_freq, y, B, Tlen, NH, NKV, HS, pos0);
}

template <typename T>
void rope_backward(const T* dy, const T* inv_freq, T* dx, int64_t B, int64_t Tlen, int64_t NH,
                   int64_t NKV, int64_t HS, int64_t pos0) {
  rotate_rows<T, -1, true>(dy, inv_freq, dx, B, Tlen, NH, NKV, HS, pos0);
}

template void rope_forward<float>(const float*, const float*, float*, int64_t, int64_t, int64_t,
                                  int64_t, int64_t, int64_t);
template void rope_forward<double>(const double*, const double*, double*, int64_t, int64_t, int64_t,
                                   int64_t, int64_t, int64_t);
template void rope_backward<float>(const float*, const float*, float*, int64_t, int64_t, int64_t,
                                   int64_t, int64_t, int64_t);
template void rope_backward<double>(const double*, const double*, double*, int64_t, int64_t,
                                    int64_t, int64_t, int64_t, int64_t);

}  // namespace gtron::cpu

// The CPU reference of the FP8 quantization (Note [fp8 recipe], [fp8 layouts] in fp8.h): what the
// CUDA quantizers are tested against bit for bit, and what the CPU emulation trains with.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "model/check.h"
#include "model/ops/fp8.h"
#include "model/ops/linear.h"

namespace gtron::fp8 {

uint8_t encode_e4m3(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  if (std::isnan(x)) return sign | 0x7f;
  const float a = std::fabs(x);
  if (a >= kE4M3Max) return sign | 0x7e;  // saturate (448 = 2^8 · 1.75)
  // Subnormals and zero: a multiple of 2^-9 (exact scaling), rounded to nearest even. 8 · 2^-9 is
  // the smallest normal, whose code is 8 too.
  if (a < 0x1p-6f) return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f));
  int e2 = 0;
  std::frexp(a, &e2);  // a = f · 2^e2, f in [0.5, 1)
  int e = e2 - 1;      // a in [2^e, 2^(e+1)), e in [-6, 8]
  int m = static_cast<int>(std::nearbyint(std::ldexp(a, 3 - e)));  // in [8, 16]
  if (m == 16) {
    m = 8;
    ++e;
  }
  return sign | static_cast<uint8_t>(((e + 7) << 3) | (m - 8));
}

float decode_e4m3(uint8_t q) {
  const float sign = (q & 0x80) ? -1.0f : 1.0f;
  const int e = (q >> 3) & 0xf;
  const int m = q & 7;
  if (e == 0xf && m == 7) return std::numeric_limits<float>::quiet_NaN();
  if (e == 0) return sign * std::ldexp(static_cast<float>(m), -9);
  return sign * std::ldexp(static_cast<float>(8 + m), e - 10);
}

int scale_exponent(float amax) {
  if (amax == 0.0f) return 0;
  int e2 = 0;
  const float f = std::frexp(amax, &e2);  // amax = f · 2^e2; 448 = 0.875 · 2^9
  const int e = e2 - 9 + (f > 0.875f ? 1 : 0);
  return std::clamp(e, -126, 127);
}

namespace {

// The largest magnitude of n values at stride `step`; NaN if any is not finite.
float amax_of(const float* x, int64_t n, int64_t step) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i * step]);
    if (!std::isfinite(a)) return std::numeric_limits<float>::quiet_NaN();
    m = std::max(m, a);
  }
  return m;
}

// A tile of largest magnitude amax (NaN: it holds a non-finite value): its scale 2^e, and the
// codes of its values, x / 2^e exactly.
struct TileScale {
  bool bad = false;
  int e = 0;
  explicit TileScale(float amax) : bad(std::isnan(amax)), e(bad ? 0 : scale_exponent(amax)) {}
  float scale() const {
    return bad ? std::numeric_limits<float>::quiet_NaN() : std::ldexp(1.0f, e);
  }
  uint8_t encode(float x) const { return bad ? 0x7f : encode_e4m3(std::ldexp(x, -e)); }
};

std::atomic<bool> g_quantize{true};

}  // namespace

void quantize_rows(const float* x, int64_t R, int64_t K, uint8_t* q, float* s) {
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t kb = 0; kb < tiles(K); ++kb) {
      const int64_t k0 = kb * kTile, n = std::min(kTile, K - k0);
      const TileScale t(amax_of(x + r * K + k0, n, 1));
      s[kb * R + r] = t.scale();
      for (int64_t k = k0; k < k0 + n; ++k) q[r * K + k] = t.encode(x[r * K + k]);
    }
  }
}

void quantize_blocks(const float* w, int64_t N, int64_t K, uint8_t* q, float* s) {
  const int64_t ld = block_scale_ld(K);
  for (int64_t nb = 0; nb < tiles(N); ++nb) {
    const int64_t n0 = nb * kTile, nn = std::min(kTile, N - n0);
    for (int64_t kb = 0; kb < tiles(K); ++kb) {
      const int64_t k0 = kb * kTile, nk = std::min(kTile, K - k0);
      float amax = 0.0f;
      for (int64_t n = n0; n < n0 + nn; ++n) {
        const float a = amax_of(w + n * K + k0, nk, 1);
        amax = std::isnan(a) ? a : std::max(amax, a);
        if (std::isnan(amax)) break;
      }
      const TileScale t(amax);
      s[nb * ld + kb] = t.scale();
      for (int64_t n = n0; n < n0 + nn; ++n)
        for (int64_t k = k0; k < k0 + nk; ++k) q[n * K + k] = t.encode(w[n * K + k]);
    }
    for (int64_t kb = tiles(K); kb < ld; ++kb) s[nb * ld + kb] = 0.0f;  // padding, unread
  }
}

void dequantize_rows(const uint8_t* q, const float* s, int64_t R, int64_t K, float* x) {
  for (int64_t r = 0; r < R; ++r)
    for (int64_t k = 0; k < K; ++k) x[r * K + k] = decode_e4m3(q[r * K + k]) * s[k / kTile * R + r];
}

void dequantize_blocks(const uint8_t* q, const float* s, int64_t N, int64_t K, float* w) {
  const int64_t ld = block_scale_ld(K);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k)
      w[n * K + k] = decode_e4m3(q[n * K + k]) * s[n / kTile * ld + k / kTile];
}

void round_trip_rows(float* x, int64_t R, int64_t K) {
  std::vector<uint8_t> q(static_cast<size_t>(R * K));
  std::vector<float> s(static_cast<size_t>(row_scale_floats(R, K)));
  quantize_rows(x, R, K, q.data(), s.data());
  dequantize_rows(q.data(), s.data(), R, K, x);
}

void round_trip_blocks(float* w, int64_t N, int64_t K) {
  std::vector<uint8_t> q(static_cast<size_t>(N * K));
  std::vector<float> s(static_cast<size_t>(block_scale_floats(N, K)));
  quantize_blocks(w, N, K, q.data(), s.data());
  dequantize_blocks(q.data(), s.data(), N, K, w);
}

void set_quantize_for_testing(bool on) { g_quantize.store(on, std::memory_order_relaxed); }
bool quantize_enabled() { return g_quantize.load(std::memory_order_relaxed); }

}  // namespace gtron::fp8

namespace gtron::fp8 {

namespace {

// A quantized-then-dequantized copy of x[R, K] (as T): tiles along K (rows) or 128x128 blocks; the
// identity when quantization is off for a test.
enum class Cut { kRows, kBlocks, kCols };

template <typename T>
std::vector<T> quantized_copy(const T* x, int64_t R, int64_t K, Cut cut) {
  std::vector<T> out(x, x + R * K);
  if (!quantize_enabled()) return out;
  std::vector<float> f(static_cast<size_t>(R * K));
  if (cut == Cut::kCols) {  // tiles along R: quantize xᵀ as rows, transpose back
    for (int64_t r = 0; r < R; ++r)
      for (int64_t k = 0; k < K; ++k) f[k * R + r] = static_cast<float>(x[r * K + k]);
    round_trip_rows(f.data(), K, R);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t k = 0; k < K; ++k) out[r * K + k] = static_cast<T>(f[k * R + r]);
    return out;
  }
  for (int64_t i = 0; i < R * K; ++i) f[i] = static_cast<float>(x[i]);
  if (cut == Cut::kRows) {
    round_trip_rows(f.data(), R, K);
  } else {
    round_trip_blocks(f.data(), R, K);
  }
  for (int64_t i = 0; i < R * K; ++i) out[i] = static_cast<T>(f[i]);
  return out;
}

}  // namespace

template <typename T>
void emulate_forward(const T* x, const T* w, const T* b, T* y, int64_t N, int64_t Cin,
                     int64_t Cout) {
  const std::vector<T> xq = quantized_copy(x, N, Cin, Cut::kRows);
  const std::vector<T> wq = quantized_copy(w, Cout, Cin, Cut::kBlocks);
  cpu::linear_forward<T>(xq.data(), wq.data(), b, y, N, Cin, Cout);
}

template <typename T>
void emulate_backward(const T* x, const T* w, const T* dy, T* dx, T* dw, T* db, int64_t N,
                      int64_t Cin, int64_t Cout) {
  if (dx != nullptr) {  // dgrad: dy in tiles along Cout, w's blocks
    const std::vector<T> dyq = quantized_copy(dy, N, Cout, Cut::kRows);
    const std::vector<T> wq = quantized_copy(w, Cout, Cin, Cut::kBlocks);
    cpu::linear_backward<T>(x, wq.data(), dyq.data(), dx, nullptr, nullptr, N, Cin, Cout);
  }
  if (dw != nullptr) {  // wgrad: dyᵀ and xᵀ in tiles along the N rows
    const std::vector<T> dyq = quantized_copy(dy, N, Cout, Cut::kCols);
    const std::vector<T> xq = quantized_copy(x, N, Cin, Cut::kCols);
    cpu::linear_backward<T>(xq.data(), w, dyq.data(), nullptr, dw, nullptr, N, Cin, Cout);
  }
  if (db != nullptr) cpu::linear_backward<T>(x, w, dy, nullptr, nullptr, db, N, Cin, Cout);
}

template void emulate_forward<float>(const float*, const float*, const float*, float*, int64_t,
                                     int64_t, int64_t);
template void emulate_forward<double>(const double*, const double*, const double*, double*, int64_t,
                                      int64_t, int64_t);
template void emulate_backward<float>(const float*, const float*, const float*, float*, float*,
                                      float*, int64_t, int64_t, int64_t);
template void emulate_backward<double>(const double*, const double*, const double*, double*,
                                       double*, double*, int64_t, int64_t, int64_t);

}  // namespace gtron::fp8

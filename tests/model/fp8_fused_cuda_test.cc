// FP8 codes written by the producing kernels (Note [fp8 fused producers] in model/ops/fp8.h; GPU
// test, skipped without a GPU). Each producer (RMSNorm, LayerNorm, SwiGLU, GELU) asked for its
// output's codes writes the plain kernel's bf16 output byte for byte, and codes and scales equal to
// fp8_quantize_rows of that output bit for bit: odd row counts, several widths (register-resident
// and streamed norm rows, half-warp tails at K % 256 == 128), a misaligned input (the fallback
// through fp8_quantize_rows), zero tiles, and tiles holding a NaN or an overflow. Then tiny llama
// and GPT-2 models (MTP depth 1) in fp8 give the same losses and gradients, bit for bit, with the
// fusion on and off, without recompute and under selective and full recompute, and the counts of
// handed-in codes show the fusion ran.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "model/dtype.h"
#include "model/gpt.h"
#include "model/mixed_precision.h"
#include "model/ops/concat.h"
#include "model/ops/fp8.h"
#include "model/ops/fused_mlp.h"
#include "model/ops/gelu.h"
#include "model/ops/norm.h"
#include "model/ops/swiglu.h"
#include "model/stream.h"
#include "tests/model/cuda_op_check.h"
#include "tests/model/gradcheck.h"

namespace gtron {
namespace {

const Device kGpu = Device::cuda(0);

void* stream() { return current_stream(kGpu).native(); }

// n bytes of device memory at p, on the host (after everything queued has run).
std::vector<uint8_t> host_bytes(const void* p, size_t n) {
  std::vector<uint8_t> b(n);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(b.data(), p, n, cudaMemcpyDeviceToHost), cudaSuccess);
  return b;
}

int64_t differing(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  if (a.size() != b.size()) return -1;
  int64_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += a[i] != b[i];
  return n;
}

// Device memory of `bytes` bytes (from the caching allocator, 256-byte aligned).
Tensor device_bytes(int64_t bytes) {
  return Tensor::empty(Shape{(bytes + 3) / 4}, DType::kF32, kGpu);
}

// bf16 values on the GPU, `shift` elements into their buffer: shift 1 misaligns them, which sends
// the kernels down their one-element path (and the codes through the fallback).
struct DeviceValues {
  Tensor buf;
  int shift = 0;
  const void* ptr() const { return static_cast<const uint16_t*>(buf.raw()) + shift; }
};

DeviceValues device_bf16(const std::vector<float>& v, int shift) {
  std::vector<BF16> h(v.size() + 8, float_to_bf16(0.0f));
  for (size_t i = 0; i < v.size(); ++i) h[i + shift] = float_to_bf16(v[i]);
  DeviceValues d{device_bytes(static_cast<int64_t>(h.size() * sizeof(BF16))), shift};
  EXPECT_EQ(cudaMemcpy(d.buf.raw(), h.data(), h.size() * sizeof(BF16), cudaMemcpyHostToDevice),
            cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return d;
}

Tensor device_f32(const std::vector<float>& v) {
  Tensor t = device_bytes(static_cast<int64_t>(v.size() * sizeof(float)));
  EXPECT_EQ(cudaMemcpy(t.raw(), v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice),
            cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return t;
}

std::vector<float> normal_values(int64_t n, uint64_t seed, double std = 1.0) {
  const std::vector<double> d = testing::randn_tensor({n}, seed, std, DType::kF32).to_vector();
  return {d.begin(), d.end()};
}

// A producer writing R rows of K bf16 at y, and with q non-null also their codes at q and
// rows-layout scales at s.
using Producer = std::function<void(void* y, uint8_t* q, float* s)>;

// Runs `produce` plain and with codes, and checks: the same bf16 output bytes, and codes and
// scales equal to fp8_quantize_rows of that output bit for bit. Returns the reference's NaN
// scales (the tiles holding a non-finite value) for the caller to check they were exercised.
int64_t expect_fused_codes(const std::string& what, int64_t R, int64_t K, const Producer& produce) {
  SCOPED_TRACE(what);
  const int64_t ns = fp8::row_scale_floats(R, K);
  Tensor y_plain = device_bytes(2 * R * K), y = device_bytes(2 * R * K);
  Tensor q = device_bytes(R * K), s = device_bytes(4 * ns);
  Tensor q_ref = device_bytes(R * K), s_ref = device_bytes(4 * ns);
  cudaMemset(q.raw(), 0xa5, R * K);  // nothing left over from an earlier buffer can pass
  cudaMemset(s.raw(), 0xa5, 4 * ns);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  produce(y_plain.raw(), nullptr, nullptr);
  produce(y.raw(), static_cast<uint8_t*>(q.raw()), s.data<float>());
  cuda::fp8_quantize_rows(y.raw(), R, K, static_cast<uint8_t*>(q_ref.raw()), s_ref.data<float>(),
                          stream());
  const std::vector<uint8_t> yb = host_bytes(y.raw(), 2 * R * K);
  EXPECT_EQ(differing(yb, host_bytes(y_plain.raw(), 2 * R * K)), 0) << "bf16 output bytes";
  const std::vector<uint8_t> qr = host_bytes(q_ref.raw(), R * K);
  EXPECT_EQ(differing(host_bytes(q.raw(), R * K), qr), 0) << "codes";
  const std::vector<uint8_t> sb = host_bytes(s_ref.raw(), 4 * ns);
  EXPECT_EQ(differing(host_bytes(s.raw(), 4 * ns), sb), 0) << "scales";
  int64_t nonzero = 0;
  for (uint8_t c : qr) nonzero += (c & 0x7f) != 0;
  EXPECT_GT(nonzero, R * K / 4) << "the codes are mostly zero: the comparison would be empty";
  std::vector<float> sf(ns);
  std::memcpy(sf.data(), sb.data(), sb.size());
  int64_t nan = 0;
  for (float v : sf) nan += std::isnan(v);
  return nan;
}

// RMSNorm and LayerNorm at widths that take the register-resident rows (C <= 2048) and the
// streamed ones (2304), with C % 256 == 128 (a half-warp's tail) among them, both norm kernel
// families (norm_fast off: the reference kernels), f32 and bf16 gamma, aligned and misaligned x.
// Row 3 holds a NaN (every tile of it NaN), gamma is 0 over columns [128, 256) (zero tiles) and,
// from C = 384 on, 3e38 at column 0 (tile 0 overflows to inf in rows whose normalized value there
// exceeds ~1.1). Where it does not overflow, that column swamps the rest of tile 0: its scale is
// ~2^120, and the other 127 values (~0.5) quantize to code 0. At C = 128, tile 0 is the whole row,
// so every row would hold only NaN codes or one nonzero code (an H100 counted 926 = 7·128 + 30
// nonzero codes of 37·128 for RMSNorm, 1180 = 9·128 + 28 for LayerNorm): no ordinary value would
// be compared. C = 128 keeps its ordinary codes instead; the overflow is covered at C = 384, the
// same half-warp tail.
TEST(Fp8Fused, NormCodesEqualQuantizedOutput) {
  GTRON_REQUIRE_GPU();
  const int64_t R = 37;
  for (int64_t C : {128, 384, 2048, 2304}) {
    std::vector<float> x = normal_values(R * C, 1);
    x[3 * C + 7] = NAN;
    std::vector<float> gamma = normal_values(C, 2, 0.5), beta = normal_values(C, 3, 0.1);
    for (int64_t c = 128; c < 256 && c < C; ++c) gamma[c] = 0.0f;
    const bool overflow = C > fp8::kTile;
    if (overflow) gamma[0] = 3e38f;
    // Row 3's tiles, and at least one overflowing tile 0.
    const int64_t min_nan_tiles = fp8::tiles(C) + (overflow ? 1 : 0);
    for (bool fast : {true, false}) {
      cuda::set_norm_fast(fast);
      for (int shift : {0, 1}) {
        for (DType param : {DType::kF32, DType::kBF16}) {
          const DeviceValues xd = device_bf16(x, shift);
          const Tensor g32 = device_f32(gamma), b32 = device_f32(beta);
          const DeviceValues gbf = device_bf16(gamma, 0), bbf = device_bf16(beta, 0);
          const void* g = param == DType::kF32 ? g32.raw() : gbf.ptr();
          const void* b = param == DType::kF32 ? b32.raw() : bbf.ptr();
          Tensor mean = device_bytes(4 * R), rstd = device_bytes(4 * R);
          const std::string at = "C " + std::to_string(C) + (fast ? ", fast" : ", reference") +
                                 ", shift " + std::to_string(shift) + ", gamma " +
                                 dtype_name(param);
          const int64_t nan_rms =
              expect_fused_codes("rmsnorm, " + at, R, C, [&](void* y, uint8_t* q, float* s) {
                cuda::rmsnorm_forward(xd.ptr(), g, param, y, rstd.data<float>(), R, C, 1e-5,
                                      DType::kBF16, stream(), q, s);
              });
          const int64_t nan_ln =
              expect_fused_codes("layernorm, " + at, R, C, [&](void* y, uint8_t* q, float* s) {
                cuda::layernorm_forward(xd.ptr(), g, b, param, y, mean.data<float>(),
                                        rstd.data<float>(), R, C, 1e-5, DType::kBF16, stream(), q,
                                        s);
              });
          EXPECT_GE(nan_rms, min_nan_tiles) << at << ": row 3 and an overflow tile";
          EXPECT_GE(nan_ln, min_nan_tiles) << at << ": row 3 and an overflow tile";
        }
      }
    }
    cuda::set_norm_fast(true);
  }
}

// SwiGLU over [N, 2F] at F = 128, 384 (a warp's two halves in different rows) and 1280, odd N,
// aligned and misaligned: a NaN gate (its tile NaN), gate·up overflowing to inf, and a row whose
// first tile has zero gates (a zero tile).
TEST(Fp8Fused, SwigluCodesEqualQuantizedOutput) {
  GTRON_REQUIRE_GPU();
  for (int64_t N : {37, 3}) {
    for (int64_t F : {128, 384, 1280}) {
      std::vector<float> x = normal_values(N * 2 * F, 4, 2.0);
      x[1 * 2 * F + 5] = NAN;
      x[2 * 2 * F + F - 1] = 1e30f;  // gate and up of row 2's last column
      x[2 * 2 * F + 2 * F - 1] = 1e30f;
      if (N > 7)
        for (int64_t j = 0; j < 128; ++j) x[7 * 2 * F + j] = 0.0f;
      for (int shift : {0, 1}) {
        const DeviceValues xd = device_bf16(x, shift);
        const std::string at = "N " + std::to_string(N) + ", F " + std::to_string(F) + ", shift " +
                               std::to_string(shift);
        const int64_t nan =
            expect_fused_codes("swiglu, " + at, N, F, [&](void* y, uint8_t* q, float* s) {
              cuda::swiglu_forward(xd.ptr(), y, N, F, DType::kBF16, stream(), q, s);
            });
        EXPECT_EQ(nan, 2) << at << ": the NaN tile and the overflowing one";
      }
    }
  }
}

// SwiGLU's forward with both codes (Note [SwiGLU forward with both codes]): y byte for byte the
// plain forward's, and its codes both ways equal to fp8_quantize_rows_cols of it, at N, F = 128 and
// 384, with a NaN input (its row tile and column tile NaN) and a zero tile; then the same codes
// without y stored (swiglu_linear_fp8's case).
TEST(Fp8Fused, SwigluForwardBothCodesEqualQuantizedOutput) {
  GTRON_REQUIRE_GPU();
  for (int64_t N : {128, 384}) {
    for (int64_t F : {128, 384}) {
      SCOPED_TRACE("N " + std::to_string(N) + ", F " + std::to_string(F));
      std::vector<float> x = normal_values(N * 2 * F, 8, 2.0);
      x[3 * 2 * F + 7] = NAN;
      for (int64_t j = 0; j < 128; ++j) x[11 * 2 * F + F + j] = 0.0f;  // up zero: y zero there
      const DeviceValues xd = device_bf16(x, 0);
      const int64_t ns = fp8::row_scale_floats(N, F), nst = fp8::row_scale_floats(F, N);
      Tensor plain = device_bytes(2 * N * F), y = device_bytes(2 * N * F);
      Tensor q_ref = device_bytes(N * F), s_ref = device_bytes(4 * ns),
             qt_ref = device_bytes(N * F), st_ref = device_bytes(4 * nst);
      cuda::swiglu_forward(xd.ptr(), plain.raw(), N, F, DType::kBF16, stream());
      cuda::fp8_quantize_rows_cols(plain.raw(), N, F, static_cast<uint8_t*>(q_ref.raw()),
                                   s_ref.data<float>(), static_cast<uint8_t*>(qt_ref.raw()),
                                   st_ref.data<float>(), stream());
      const std::vector<uint8_t> qr = host_bytes(q_ref.raw(), N * F),
                                 sr = host_bytes(s_ref.raw(), 4 * ns),
                                 qtr = host_bytes(qt_ref.raw(), N * F),
                                 str = host_bytes(st_ref.raw(), 4 * nst);
      for (bool store : {true, false}) {
        SCOPED_TRACE(store ? "y stored" : "codes only");
        Tensor q = device_bytes(N * F), sc = device_bytes(4 * ns), qt = device_bytes(N * F),
               st = device_bytes(4 * nst);
        for (const Tensor* t : {&q, &sc, &qt, &st}) cudaMemset(t->raw(), 0xa5, t->nbytes());
        cudaMemset(y.raw(), 0x5a, y.nbytes());
        cuda::swiglu_forward_fp8(xd.ptr(), store ? y.raw() : nullptr, N, F,
                                 static_cast<uint8_t*>(q.raw()), sc.data<float>(),
                                 static_cast<uint8_t*>(qt.raw()), st.data<float>(), stream());
        if (store) {
          EXPECT_EQ(differing(host_bytes(y.raw(), 2 * N * F), host_bytes(plain.raw(), 2 * N * F)),
                    0)
              << "y bytes";
        }
        EXPECT_EQ(differing(host_bytes(q.raw(), N * F), qr), 0) << "row codes";
        EXPECT_EQ(differing(host_bytes(sc.raw(), 4 * ns), sr), 0) << "row scales";
        EXPECT_EQ(differing(host_bytes(qt.raw(), N * F), qtr), 0) << "column codes";
        EXPECT_EQ(differing(host_bytes(st.raw(), 4 * nst), str), 0) << "column scales";
      }
      int64_t nonzero = 0;
      for (uint8_t c : qr) nonzero += (c & 0x7f) != 0;
      EXPECT_GT(nonzero, N * F / 4) << "the codes are mostly zero: the comparison would be empty";
      std::vector<float> sf(static_cast<size_t>(nst));
      std::memcpy(sf.data(), str.data(), str.size());
      int64_t nan = 0;
      for (float v : sf) nan += std::isnan(v);
      EXPECT_EQ(nan, 1) << "row 3's NaN: one column tile";
    }
  }
}

// SwiGLU's backward with its gradient's FP8 codes (Note [SwiGLU backward with FP8 codes]): dx
// byte for byte the plain backward's (written, not accumulated), and codes and scales of both
// orientations equal to fp8_quantize_rows_cols of it, at F = 128 and 384 and N = 128 and 384, with
// a NaN gradient (its row tile and column tile NaN) and a zero tile, and the same codes with dx
// null (codes only); swiglu_backward_codes_ok
// refuses sizes that are not whole tiles.
TEST(Fp8Fused, SwigluBackwardCodesEqualQuantizedGradient) {
  GTRON_REQUIRE_GPU();
  for (int64_t N : {128, 384}) {
    for (int64_t F : {128, 384}) {
      SCOPED_TRACE("N " + std::to_string(N) + ", F " + std::to_string(F));
      std::vector<float> x = normal_values(N * 2 * F, 6, 2.0), dy = normal_values(N * F, 7);
      dy[5 * F + 3] = NAN;
      for (int64_t j = 0; j < 128; ++j) dy[9 * F + j] = 0.0f;  // d up zero over a tile of row 9
      const DeviceValues xd = device_bf16(x, 0), dyd = device_bf16(dy, 0);
      const int64_t K = 2 * F, ns = fp8::row_scale_floats(N, K), nst = fp8::row_scale_floats(K, N);
      Tensor plain = device_bytes(2 * N * K), dx = device_bytes(2 * N * K);
      Tensor q = device_bytes(N * K), s = device_bytes(4 * ns), qt = device_bytes(N * K),
             st = device_bytes(4 * nst);
      Tensor q_ref = device_bytes(N * K), s_ref = device_bytes(4 * ns),
             qt_ref = device_bytes(N * K), st_ref = device_bytes(4 * nst);
      for (const Tensor* t : {&q, &s, &qt, &st}) cudaMemset(t->raw(), 0xa5, t->nbytes());
      ASSERT_TRUE(cuda::swiglu_backward_codes_ok(N, F, xd.ptr(), dyd.ptr(), dx.raw()));
      cuda::swiglu_backward(xd.ptr(), dyd.ptr(), plain.raw(), N, F, DType::kBF16, stream(), true);
      cuda::swiglu_backward_fp8(xd.ptr(), dyd.ptr(), dx.raw(), N, F, static_cast<uint8_t*>(q.raw()),
                                s.data<float>(), static_cast<uint8_t*>(qt.raw()), st.data<float>(),
                                stream());
      cuda::fp8_quantize_rows_cols(plain.raw(), N, K, static_cast<uint8_t*>(q_ref.raw()),
                                   s_ref.data<float>(), static_cast<uint8_t*>(qt_ref.raw()),
                                   st_ref.data<float>(), stream());
      EXPECT_EQ(differing(host_bytes(dx.raw(), 2 * N * K), host_bytes(plain.raw(), 2 * N * K)), 0)
          << "dx bytes";
      const std::vector<uint8_t> qr = host_bytes(q_ref.raw(), N * K);
      EXPECT_EQ(differing(host_bytes(q.raw(), N * K), qr), 0) << "row codes";
      EXPECT_EQ(differing(host_bytes(s.raw(), 4 * ns), host_bytes(s_ref.raw(), 4 * ns)), 0)
          << "row scales";
      EXPECT_EQ(differing(host_bytes(qt.raw(), N * K), host_bytes(qt_ref.raw(), N * K)), 0)
          << "column codes";
      const std::vector<uint8_t> stb = host_bytes(st_ref.raw(), 4 * nst);
      EXPECT_EQ(differing(host_bytes(st.raw(), 4 * nst), stb), 0) << "column scales";
      int64_t nonzero = 0, nan = 0;
      for (uint8_t c : qr) nonzero += (c & 0x7f) != 0;
      std::vector<float> sf(nst);
      std::memcpy(sf.data(), stb.data(), stb.size());
      for (float v : sf) nan += std::isnan(v);
      EXPECT_GT(nonzero, N * K / 4) << "the codes are mostly zero: the comparison would be empty";
      EXPECT_EQ(nan, 2) << "row 5's NaN: its d gate and d up columns";
      // Codes only (dx null: the d up tile computed again instead of read back): the same bytes.
      Tensor q2 = device_bytes(N * K), s2 = device_bytes(4 * ns), qt2 = device_bytes(N * K),
             st2 = device_bytes(4 * nst);
      for (const Tensor* t : {&q2, &s2, &qt2, &st2}) cudaMemset(t->raw(), 0x5a, t->nbytes());
      cuda::swiglu_backward_fp8(xd.ptr(), dyd.ptr(), nullptr, N, F, static_cast<uint8_t*>(q2.raw()),
                                s2.data<float>(), static_cast<uint8_t*>(qt2.raw()),
                                st2.data<float>(), stream());
      EXPECT_EQ(differing(host_bytes(q2.raw(), N * K), qr), 0) << "codes only: row codes";
      EXPECT_EQ(differing(host_bytes(s2.raw(), 4 * ns), host_bytes(s_ref.raw(), 4 * ns)), 0)
          << "codes only: row scales";
      EXPECT_EQ(differing(host_bytes(qt2.raw(), N * K), host_bytes(qt_ref.raw(), N * K)), 0)
          << "codes only: column codes";
      EXPECT_EQ(differing(host_bytes(st2.raw(), 4 * nst), stb), 0) << "codes only: column scales";
    }
  }
  EXPECT_FALSE(cuda::swiglu_backward_codes_ok(100, 128, nullptr, nullptr, nullptr));
  EXPECT_FALSE(cuda::swiglu_backward_codes_ok(128, 192, nullptr, nullptr, nullptr));
}

// GELU over rows of K = 128, 640 (a warp's two halves in different rows) and 3072 (GPT-2's 4C at
// C = 768), odd row
// counts, aligned and misaligned: +inf (its tile inf), -inf (gelu gives NaN) and a zero tile.
TEST(Fp8Fused, GeluCodesEqualQuantizedOutput) {
  GTRON_REQUIRE_GPU();
  const int64_t R = 37;
  for (int64_t K : {128, 640, 3072}) {
    std::vector<float> x = normal_values(R * K, 5, 2.0);
    x[1 * K + 3] = INFINITY;
    x[4 * K + K - 2] = -INFINITY;
    for (int64_t j = 0; j < 128; ++j) x[7 * K + j] = 0.0f;
    for (int shift : {0, 1}) {
      const DeviceValues xd = device_bf16(x, shift);
      const std::string at = "K " + std::to_string(K) + ", shift " + std::to_string(shift);
      const int64_t nan =
          expect_fused_codes("gelu, " + at, R, K, [&](void* y, uint8_t* q, float* s) {
            cuda::gelu_forward(xd.ptr(), y, R * K, DType::kBF16, stream(), q, s, K);
          });
      EXPECT_EQ(nan, 2) << at << ": the +inf and -inf tiles";
    }
  }
}

// concat_features (the MTP projection's input) over Ca | Cb = 128 | 128, 64 | 192 (a tile across
// the seam) and 1024 | 1024, odd N, aligned and misaligned: a NaN in a, an inf in b, a zero tile.
TEST(Fp8Fused, ConcatCodesEqualQuantizedOutput) {
  GTRON_REQUIRE_GPU();
  const int64_t N = 37;
  for (auto [Ca, Cb] : {std::pair<int64_t, int64_t>{128, 128}, {64, 192}, {1024, 1024}}) {
    std::vector<float> a = normal_values(N * Ca, 8), b = normal_values(N * Cb, 9, 3.0);
    a[2 * Ca + 1] = NAN;
    b[5 * Cb + Cb - 1] = INFINITY;
    for (int64_t j = 0; j < Ca; ++j) a[7 * Ca + j] = 0.0f;
    for (int64_t j = 0; j < 128 - Ca % 128; ++j) b[7 * Cb + j] = 0.0f;  // row 7's first tile
    for (int shift : {0, 1}) {
      const DeviceValues ad = device_bf16(a, shift), bd = device_bf16(b, 0);
      const std::string at =
          std::to_string(Ca) + " | " + std::to_string(Cb) + ", shift " + std::to_string(shift);
      const int64_t nan =
          expect_fused_codes("concat, " + at, N, Ca + Cb, [&](void* y, uint8_t* q, float* s) {
            cuda::concat_forward(ad.ptr(), bd.ptr(), y, N, Ca, Cb, DType::kBF16, stream(), q, s);
          });
      EXPECT_EQ(nan, 2) << at << ": the NaN tile and the inf one";
    }
  }
}

// The op-level contract: rmsnorm(x, gamma, eps, &codes) hands back codes of y's size, equal to
// fp8_quantize_rows of y (the refusals off CUDA: fp8_test.cc).
TEST(Fp8Fused, NormOpHandsBackTheCodes) {
  GTRON_REQUIRE_GPU();
  const int64_t R = 5, C = 256;
  const Var x = Var::constant(testing::randn_tensor({R, C}, 6, 1.0, DType::kF32)
                                  .to(DType::kBF16)
                                  .to(kGpu, &current_stream(kGpu)));
  const Var gamma = Var::constant(testing::randn_tensor({C}, 7, 1.0, DType::kF32).to(kGpu));
  fp8::QuantizedRows codes;
  const Var y = rmsnorm(x, gamma, 1e-5, &codes);
  ASSERT_TRUE(codes.q.defined() && codes.s.defined());
  ASSERT_GE(codes.q.nbytes(), static_cast<size_t>(R * C));
  ASSERT_GE(codes.s.numel(), fp8::row_scale_floats(R, C));
  Tensor q_ref = device_bytes(R * C), s_ref = device_bytes(4 * fp8::row_scale_floats(R, C));
  cuda::fp8_quantize_rows(y.value().raw(), R, C, static_cast<uint8_t*>(q_ref.raw()),
                          s_ref.data<float>(), stream());
  EXPECT_EQ(differing(host_bytes(codes.q.raw(), R * C), host_bytes(q_ref.raw(), R * C)), 0);
  const size_t ns = 4 * fp8::row_scale_floats(R, C);
  EXPECT_EQ(differing(host_bytes(codes.s.raw(), ns), host_bytes(s_ref.raw(), ns)), 0);
}

// ---- Whole models: fused against unfused ----

GPTConfig tiny_fp8(Arch arch, Recompute recompute) {
  GPTConfig c;
  c.arch = arch;
  c.vocab_size = 100;  // padded to 128
  c.context_length = 64;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 128;
  c.mtp_depth = 1;
  c.fp8 = true;
  c.recompute = recompute;
  if (arch == Arch::kLlama) {
    c.n_kv_head = 1;
    c.head_dim = 64;
    c.intermediate_size = 384;  // SwiGLU rows of 384: a half-warp's tail
    c.tied_embeddings = false;
  }
  return c;
}

// A window of B sequences of T + 1 tokens from a linear congruential generator.
Tensor token_window(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  std::vector<int32_t> tok(static_cast<size_t>(B * (T + 1)));
  for (auto& t : tok) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    t = static_cast<int32_t>((seed >> 33) % static_cast<uint64_t>(V));
  }
  return Tensor::from_ints(tok, {B, T + 1});
}

struct Step {
  std::vector<double> losses;              // total, main, MTP
  std::vector<std::vector<double>> grads;  // per parameter
  fp8::ForwardInputCounts counts;          // of this forward + backward
  fp8::ForwardInputCounts grad_counts;     // the backward's output gradients
};

// One forward + backward of a fresh model (bf16 mixed precision) with the fusion on or off.
Step train_step(const GPTConfig& c, bool fused) {
  fp8::set_fused_producers_for_testing(fused);
  Bf16Weights access;
  GPT model(c, DType::kF32, kGpu, 5);
  model.set_weight_access(&access);
  const Tensor window = token_window(2, 64, c.vocab_size, 3).to(kGpu);  // 128 rows
  const fp8::ForwardInputCounts before = fp8::forward_input_counts();
  const fp8::ForwardInputCounts grads_before = fp8::backward_grad_counts();
  GPTOutput out = model.forward(window);
  backward(out.loss);
  Step r;
  r.losses = {out.loss.value().item(), out.main_loss.value().item()};
  for (const Var& l : out.mtp_losses) r.losses.push_back(l.value().item());
  for (Parameter* p : model.parameters()) r.grads.push_back(p->main_grad.to_vector());
  const fp8::ForwardInputCounts after = fp8::forward_input_counts();
  r.counts = {after.handed_in - before.handed_in, after.quantized - before.quantized};
  const fp8::ForwardInputCounts grads_after = fp8::backward_grad_counts();
  r.grad_counts = {grads_after.handed_in - grads_before.handed_in,
                   grads_after.quantized - grads_before.quantized};
  fp8::set_fused_producers_for_testing(true);
  return r;
}

// Per block, three linears take producer-made codes (qkv from the attention norm, gate|up or fc
// from the MLP norm, down or fc2 from SwiGLU or GELU) and one quantizes (the output projection,
// fed by the attention); each MTP projection takes the concatenation's. Main blocks run twice
// under full recompute.
void expect_fusion_bit_identical(Arch arch, Recompute recompute) {
  const GPTConfig c = tiny_fp8(arch, recompute);
  const int64_t L = c.n_layer, D = c.mtp_depth;
  const int64_t blocks = (recompute == Recompute::kFull ? 2 * L : L) + D;
  const int64_t calls_before = swiglu_linear_fp8_calls();
  const Step fused = train_step(c, true);
  const int64_t calls_fused = swiglu_linear_fp8_calls() - calls_before;
  const Step plain = train_step(c, false);
  // Note [SwiGLU into an FP8 down projection]: llama's down projections took the fused op.
  EXPECT_EQ(calls_fused, arch == Arch::kLlama ? blocks : 0);
  EXPECT_EQ(swiglu_linear_fp8_calls() - calls_before, calls_fused) << "the unfused run took it";
  EXPECT_EQ(fused.counts.handed_in, 3 * blocks + D);
  EXPECT_EQ(fused.counts.quantized, blocks);
  EXPECT_EQ(plain.counts.handed_in, 0);
  EXPECT_EQ(plain.counts.quantized, 4 * blocks + D);
  // The backward runs each block once (a full recompute re-forms only the forward): llama's
  // gate|up output gradients come with SwiGLU's codes (Note [gradient fp8 codes]); GPT-2's GELU
  // sits in no such path, so every one of its output gradients is quantized by its linear.
  const int64_t backward_linears = 4 * (L + D) + D;
  const int64_t from_swiglu = arch == Arch::kLlama ? L + D : 0;
  EXPECT_EQ(fused.grad_counts.handed_in, from_swiglu);
  EXPECT_EQ(fused.grad_counts.quantized, backward_linears - from_swiglu);
  EXPECT_EQ(plain.grad_counts.handed_in, 0);
  EXPECT_EQ(plain.grad_counts.quantized, backward_linears);
  ASSERT_EQ(fused.losses.size(), plain.losses.size());
  for (size_t k = 0; k < fused.losses.size(); ++k) {
    EXPECT_TRUE(std::isfinite(fused.losses[k])) << "loss " << k;
    EXPECT_EQ(fused.losses[k], plain.losses[k]) << "loss " << k;
  }
  ASSERT_EQ(fused.grads.size(), plain.grads.size());
  int64_t nonzero = 0;
  for (size_t i = 0; i < fused.grads.size(); ++i) {
    EXPECT_EQ(fused.grads[i], plain.grads[i]) << "gradient of parameter " << i;
    for (double g : fused.grads[i]) nonzero += g != 0.0;
  }
  EXPECT_GT(nonzero, 0);
}

TEST(Fp8Fused, LlamaLossesAndGradientsBitIdentical) {
  GTRON_REQUIRE_GPU();
  for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    SCOPED_TRACE("recompute " + std::to_string(static_cast<int>(r)));
    expect_fusion_bit_identical(Arch::kLlama, r);
  }
}

TEST(Fp8Fused, Gpt2LossesAndGradientsBitIdentical) {
  GTRON_REQUIRE_GPU();
  for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    SCOPED_TRACE("recompute " + std::to_string(static_cast<int>(r)));
    expect_fusion_bit_identical(Arch::kGpt2, r);
  }
}

}  // namespace
}  // namespace gtron

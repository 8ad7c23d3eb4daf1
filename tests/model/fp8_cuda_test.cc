// FP8 on CUDA (GPU test; skipped without a GPU): the quantizers give the CPU reference's codes
// and scales bit for bit; linear(..., fp8 = true) through cuBLASLt's block-scaled FP8 GEMMs
// matches the CPU emulation on the same bf16 values (the same codes: the difference is the
// GEMMs' accumulation order and the bf16 outputs), reruns bit-identically; and, timed, the FP8
// products of Llama-3.2-1B's linears against the bf16 ones (printed as JSON lines).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "model/dtype.h"
#include "model/layers.h"
#include "model/mixed_precision.h"
#include "model/ops/device_util.h"
#include "model/ops/fp8.h"
#include "model/ops/fp8_gemm.h"
#include "model/ops/linear.h"
#include "model/stream.h"
#include "tests/model/cuda_op_check.h"
#include "tests/model/gradcheck.h"

namespace gtron {
namespace {

// bf16 values of mixed magnitudes: tiles of very different scales, one all-zero tile.
std::vector<BF16> bf16_values(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<BF16> v(n);
  for (int64_t i = 0; i < n; ++i) {
    const float mag = std::ldexp(1.0f, static_cast<int>((i / 128) % 23) - 11);
    v[i] = float_to_bf16((i / 128) % 17 == 5 ? 0.0f : d(rng) * mag);
  }
  return v;
}

std::vector<float> as_floats(const std::vector<BF16>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = bf16_to_float(v[i]);
  return f;
}

template <typename T>
T* to_device(const std::vector<T>& v) {
  T* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, v.size() * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return p;
}

template <typename T>
std::vector<T> to_host(const T* p, size_t n) {
  std::vector<T> v(n);
  EXPECT_EQ(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

// Codes and scales on the device, freed with the object.
struct DeviceCodes {
  uint8_t* q = nullptr;
  float* s = nullptr;
  size_t n = 0, scales = 0;
  DeviceCodes(size_t elements, size_t scale_floats) : n(elements), scales(scale_floats) {
    EXPECT_EQ(cudaMalloc(&q, n), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&s, scales * sizeof(float)), cudaSuccess);
  }
  ~DeviceCodes() {
    cudaFree(q);
    cudaFree(s);
  }
  DeviceCodes(const DeviceCodes&) = delete;
  DeviceCodes& operator=(const DeviceCodes&) = delete;
};

// Codes equal; scales equal (NaN where the CPU has NaN).
void expect_same(const DeviceCodes& d, const std::vector<uint8_t>& ref_q,
                 const std::vector<float>& ref_s, const char* what) {
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<uint8_t> q = to_host(d.q, d.n);
  const std::vector<float> s = to_host(d.s, d.scales);
  ASSERT_EQ(q.size(), ref_q.size());
  int64_t bad = 0;
  for (size_t i = 0; i < q.size(); ++i) bad += q[i] != ref_q[i];
  EXPECT_EQ(bad, 0) << what << ": codes differing from the CPU reference";
  ASSERT_EQ(s.size(), ref_s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (std::isnan(ref_s[i])) {
      EXPECT_TRUE(std::isnan(s[i])) << what << " scale " << i;
    } else {
      EXPECT_EQ(s[i], ref_s[i]) << what << " scale " << i;
    }
  }
}

TEST(Fp8Cuda, RowTilesMatchTheCpuBitForBit) {
  GTRON_REQUIRE_GPU();
  for (auto [R, K] : {std::pair<int64_t, int64_t>{256, 384}, {36, 300}}) {
    std::vector<BF16> x = bf16_values(R * K, 1);
    x[5 * K + 7] = float_to_bf16(NAN);
    const std::vector<float> xf = as_floats(x);
    std::vector<uint8_t> ref_q(R * K);
    std::vector<float> ref_s(fp8::row_scale_floats(R, K));
    fp8::quantize_rows(xf.data(), R, K, ref_q.data(), ref_s.data());
    BF16* dx = to_device(x);
    DeviceCodes d(R * K, ref_s.size());
    cuda::fp8_quantize_rows(dx, R, K, d.q, d.s, nullptr);
    expect_same(d, ref_q, ref_s, "rows");
    cudaFree(dx);
  }
}

TEST(Fp8Cuda, ColumnTilesMatchTheCpuTransposedBitForBit) {
  GTRON_REQUIRE_GPU();
  const int64_t R = 384, K = 200;
  const std::vector<BF16> x = bf16_values(R * K, 2);
  std::vector<float> xt(R * K);  // xᵀ [K, R], quantized as rows on the CPU
  for (int64_t r = 0; r < R; ++r)
    for (int64_t k = 0; k < K; ++k) xt[k * R + r] = bf16_to_float(x[r * K + k]);
  std::vector<uint8_t> ref_q(R * K);
  std::vector<float> ref_s(fp8::row_scale_floats(K, R));
  fp8::quantize_rows(xt.data(), K, R, ref_q.data(), ref_s.data());
  BF16* dx = to_device(x);
  DeviceCodes d(R * K, ref_s.size());
  cuda::fp8_quantize_cols(dx, R, K, d.q, d.s, nullptr);
  expect_same(d, ref_q, ref_s, "cols");
  cudaFree(dx);
}

// w [N, K] (the fp32 values wf, or their bf16 copy wb) through fp8_quantize_blocks, both
// orientations, against the CPU's quantize_blocks of w and of wᵀ bit for bit.
void expect_blocks_match(const std::vector<float>& wf, const std::vector<BF16>& wb, DType wt,
                         int64_t N, int64_t K, const char* what) {
  std::vector<float> w = wt == DType::kF32 ? wf : as_floats(wb), wtf(N * K);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) wtf[k * N + n] = w[n * K + k];
  std::vector<uint8_t> ref_q(N * K), ref_qt(N * K);
  std::vector<float> ref_s(fp8::block_scale_floats(N, K)), ref_st(fp8::block_scale_floats(K, N));
  fp8::quantize_blocks(w.data(), N, K, ref_q.data(), ref_s.data());
  fp8::quantize_blocks(wtf.data(), K, N, ref_qt.data(), ref_st.data());
  void* dw = wt == DType::kF32 ? static_cast<void*>(to_device(wf)) : to_device(wb);
  DeviceCodes d(N * K, ref_s.size()), dt(N * K, ref_st.size());
  cuda::fp8_quantize_blocks(dw, wt, N, K, d.q, d.s, dt.q, dt.s, nullptr);
  expect_same(d, ref_q, ref_s, what);
  expect_same(dt, ref_qt, ref_st, what);
  cudaFree(dw);
}

TEST(Fp8Cuda, BlocksMatchTheCpuBothWaysRound) {
  GTRON_REQUIRE_GPU();
  const int64_t N = 300, K = 520;
  for (DType wt : {DType::kF32, DType::kBF16}) {
    const std::vector<BF16> wb = bf16_values(N * K, 3);
    std::vector<float> wf = as_floats(wb);
    if (wt == DType::kF32)  // f32 masters: values bf16 cannot hold
      for (size_t i = 0; i < wf.size(); ++i) wf[i] *= 1.0f + 1e-3f * static_cast<float>(i % 7);
    expect_blocks_match(wf, wb, wt, N, K, "blocks");
  }
}

// x[R, K] whose 128x128 blocks (so its row tiles, column tiles and weight blocks alike) each hold
// one kind of value: ordinary; subnormal (amax below 2^-126: the exponent clamps to -126); tiny
// with subnormals among normals; huge (near the largest bf16: the exponent reaches 120); zeros
// and one smallest subnormal (of fp32 where `f32`, else of bf16); a tile with an infinity. As
// floats, bf16-exact unless f32.
std::vector<float> extreme_values(int64_t R, int64_t K, uint64_t seed, bool f32) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(R * K);
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t k = 0; k < K; ++k) {
      const float g = std::clamp(d(rng), -6.0f, 6.0f);
      float x = g;
      switch ((r / 128 + k / 128) % 6) {
        case 1:
          x = std::ldexp(g, -130);
          break;
        case 2:
          x = std::ldexp(g, (r + k) % 2 ? -124 : -131);
          break;
        case 3:
          x = std::ldexp(g, 125);
          break;
        case 4:
          x = (r % 128 == 5 && k % 128 == 9) ? std::ldexp(1.0f, f32 ? -149 : -133) : 0.0f;
          break;
        case 5:
          x = (r % 128 == 70 && k % 128 == 3) ? INFINITY : g;
          break;
        default:
          break;
      }
      v[r * K + k] = f32 ? x * (1.0f + 1e-3f * static_cast<float>((r + k) % 7)) : x;
    }
  }
  if (!f32)
    for (float& x : v) x = bf16_to_float(float_to_bf16(x));
  return v;
}

// fp8_quantize_rows, _cols and (K % 128 == 0) _rows_cols of x [R, K], read `offset` bf16 elements
// past an aligned allocation, against the CPU bit for bit.
void expect_tiles_match(const std::vector<float>& xf, int64_t R, int64_t K, int offset,
                        const std::string& what) {
  std::vector<BF16> x(offset + R * K);
  for (int64_t i = 0; i < R * K; ++i) x[offset + i] = float_to_bf16(xf[i]);
  std::vector<float> xt(R * K);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t k = 0; k < K; ++k) xt[k * R + r] = xf[r * K + k];
  std::vector<uint8_t> ref_q(R * K), ref_qt(R * K);
  std::vector<float> ref_s(fp8::row_scale_floats(R, K)), ref_st(fp8::row_scale_floats(K, R));
  fp8::quantize_rows(xf.data(), R, K, ref_q.data(), ref_s.data());
  fp8::quantize_rows(xt.data(), K, R, ref_qt.data(), ref_st.data());
  BF16* dx = to_device(x);
  DeviceCodes rows(R * K, ref_s.size()), cols(R * K, ref_st.size());
  cuda::fp8_quantize_rows(dx + offset, R, K, rows.q, rows.s, nullptr);
  expect_same(rows, ref_q, ref_s, (what + " rows").c_str());
  cuda::fp8_quantize_cols(dx + offset, R, K, cols.q, cols.s, nullptr);
  expect_same(cols, ref_qt, ref_st, (what + " cols").c_str());
  if (K % 128 == 0) {
    DeviceCodes rows2(R * K, ref_s.size()), cols2(R * K, ref_st.size());
    cuda::fp8_quantize_rows_cols(dx + offset, R, K, rows2.q, rows2.s, cols2.q, cols2.s, nullptr);
    expect_same(rows2, ref_q, ref_s, (what + " rows of rows_cols").c_str());
    expect_same(cols2, ref_qt, ref_st, (what + " cols of rows_cols").c_str());
  }
  cudaFree(dx);
}

// Note [fp8 tile arithmetic] in model/ops/fp8_tile.cuh at the ends of the exponent range, and the
// quantizers' slower layouts (K % 8 == 4: element-wise loads; an input 2 bytes off 16-byte
// alignment; blocks with K % 4 != 0, with N % 8 == 0 and tails): the CPU's codes bit for bit.
TEST(Fp8Cuda, ExtremeMagnitudesAndOddLayoutsMatchTheCpu) {
  GTRON_REQUIRE_GPU();
  const std::vector<float> x = extreme_values(768, 768, 31, false);
  expect_tiles_match(x, 768, 768, 0, "aligned");
  expect_tiles_match(x, 768, 768, 1, "misaligned");
  std::vector<float> narrow(256 * 260);  // K % 8 == 4, cut from the same values
  for (int64_t r = 0; r < 256; ++r)
    for (int64_t k = 0; k < 260; ++k) narrow[r * 260 + k] = x[r * 768 + k];
  expect_tiles_match(narrow, 256, 260, 0, "K % 8 == 4");
  for (DType wt : {DType::kF32, DType::kBF16}) {
    const bool f32 = wt == DType::kF32;
    const std::vector<float> wf = extreme_values(768, 768, 32, f32);
    std::vector<BF16> wb(wf.size());
    for (size_t i = 0; i < wf.size(); ++i) wb[i] = float_to_bf16(wf[i]);
    expect_blocks_match(wf, wb, wt, 768, 768, "extreme blocks");
    std::vector<float> odd(264 * 130);  // N % 8 == 0, K % 4 == 2: tails both ways
    for (int64_t n = 0; n < 264; ++n)
      for (int64_t k = 0; k < 130; ++k) odd[n * 130 + k] = wf[n * 768 + k];
    std::vector<BF16> oddb(odd.size());
    for (size_t i = 0; i < odd.size(); ++i) oddb[i] = float_to_bf16(odd[i]);
    expect_blocks_match(odd, oddb, wt, 264, 130, "odd blocks");
  }
}

// fp8_quantize_rows_cols gives fp8_quantize_rows' and fp8_quantize_cols' codes and scales bit for
// bit, in one pass (mixed magnitudes, an all-zero tile, a NaN tile).
TEST(Fp8Cuda, RowsColsPassMatchesTheTwoQuantizers) {
  GTRON_REQUIRE_GPU();
  const int64_t R = 384, K = 256;
  std::vector<BF16> x = bf16_values(R * K, 21);
  x[5 * K + 130] = float_to_bf16(NAN);
  void* dx = to_device(x);
  DeviceCodes rows(R * K, fp8::row_scale_floats(R, K)), cols(R * K, fp8::row_scale_floats(K, R));
  DeviceCodes rows2(R * K, rows.scales), cols2(R * K, cols.scales);
  cuda::fp8_quantize_rows(dx, R, K, rows.q, rows.s, nullptr);
  cuda::fp8_quantize_cols(dx, R, K, cols.q, cols.s, nullptr);
  cuda::fp8_quantize_rows_cols(dx, R, K, rows2.q, rows2.s, cols2.q, cols2.s, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  expect_same(rows2, to_host(rows.q, rows.n), to_host(rows.s, rows.scales), "rows of rows_cols");
  expect_same(cols2, to_host(cols.q, cols.n), to_host(cols.s, cols.scales), "cols of rows_cols");
  cudaFree(dx);
}

double rel_normwise(const std::vector<double>& a, const std::vector<double>& r) {
  double num = 0, den = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    num += (a[i] - r[i]) * (a[i] - r[i]);
    den += r[i] * r[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

std::vector<float> to_floats(const std::vector<double>& v) { return {v.begin(), v.end()}; }

// Note [fp8 accumulation on Hopper]
// The codes of both sides are the same (the quantizers agree bit for bit) and each product of two
// e4m3 values times two powers of two is exact in fp32, so an fp32 output differs from the CPU
// emulation only by how the products are summed. The CPU sums in fp32 (~1e-6 normwise over 256
// terms). The H100's FP8 tensor cores do not: within a 128-long stretch of the reduction the MMA
// accumulator keeps 13 fraction bits and truncates (e8m13; DeepSeek-V3 §3.3.2 measures "around 14
// bits"); cuBLASLt's VEC128 modes promote each stretch's partial sum to fp32 when they apply its
// two scales. A stretch is 4 MMAs of k = 32, each truncating a running sum of about the partial's
// size by less than 2^-13 of it: a partial is off by up to ~4·2^-13 ≈ 4.9e-4 of itself, and so is
// the 256-token wgrad normwise (its two partials are independent: their norms and their errors
// add in quadrature). The expected value is smaller: a truncation removes half an ulp on average
// (≈ 0.72·2^-14 of the value, over a binade) of a sum grown to √(j/4) of the partial after MMA j,
// (0.5 + 0.71 + 0.87 + 1)·0.72·2^-14 ≈ 1.35e-4 in all; an H100 measured 1.26e-4. A wrong code or
// scale moves the result by e4m3's own step, 2^-4, or more.
constexpr double kFp8AccumulationTol = 4.0 / 8192.0;  // 4·2^-13

// Note [fp8 weights once a step]: under Bf16Weights an FP8 LinearLayer's weight is quantized once
// until the next refresh, however many forwards and backwards read it, and from the fp32 master:
// the products equal the CPU emulation over the master within the bf16 outputs and the tensor
// cores' accumulation (Note [fp8 accumulation on Hopper]).
TEST(Fp8Cuda, WeightCodesMadeOnceAStepFromTheMaster) {
  GTRON_REQUIRE_GPU();
  const Device dev = Device::cuda(0);
  const int64_t N = 256, Cin = 384, Cout = 256;
  ParamRegistry reg(DType::kF32, dev, 11);
  reg.set_fp8_linears(true);
  LinearLayer lin(reg, "lin", Cin, Cout, /*bias=*/false, 0.05);
  Parameter& wp = *lin.weight;
  Bf16Weights access;
  const Tensor xh = testing::randn_tensor({N, Cin}, 1, 1.0, DType::kF32).to(DType::kBF16);
  const Tensor dyh = testing::randn_tensor({N, Cout}, 2, 1.0, DType::kF32).to(DType::kBF16);
  std::vector<double> y_first, dx_first, dw_first;
  for (int pass = 0; pass < 3; ++pass) {
    if (pass == 2) access.refresh_after_step();
    wp.zero_grad();
    Var x = Var::leaf(xh.to(dev));
    Var y = lin.forward(x, access);
    backward_with(y, dyh.to(dev));
    const std::vector<double> yv = y.value().to_vector(), dxv = x.grad().to_vector(),
                              dwv = wp.main_grad.to_vector();
    if (pass == 0) {
      y_first = yv;
      dx_first = dxv;
      dw_first = dwv;
      EXPECT_EQ(access.fp8_quantizations(), 1);
    } else {  // the same codes: bit-identical products
      EXPECT_EQ(yv, y_first) << "pass " << pass;
      EXPECT_EQ(dxv, dx_first) << "pass " << pass;
      EXPECT_EQ(dwv, dw_first) << "pass " << pass;
    }
    if (pass == 1) EXPECT_EQ(access.fp8_quantizations(), 1) << "a second pass re-quantized";
  }
  EXPECT_EQ(access.fp8_quantizations(), 2) << "a refresh must make the codes again";
  EXPECT_GE(access.fp8_bytes(), 2 * N * Cin);
  EXPECT_EQ(access.shadow_bytes(), 0) << "an FP8 weight with codes needs no bf16 shadow";

  const std::vector<float> xf = to_floats(xh.to_vector()), dyf = to_floats(dyh.to_vector()),
                           wf = to_floats(wp.data.to_vector());
  std::vector<float> y(N * Cout), dx(N * Cin, 0.0f), dw(Cout * Cin, 0.0f);
  fp8::emulate_forward<float>(xf.data(), wf.data(), nullptr, y.data(), N, Cin, Cout);
  fp8::emulate_backward<float>(xf.data(), wf.data(), dyf.data(), dx.data(), dw.data(), nullptr, N,
                               Cin, Cout);
  auto d = [](const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); };
  EXPECT_LT(rel_normwise(y_first, d(y)), 8e-3);  // bf16 output rounding
  EXPECT_LT(rel_normwise(dx_first, d(dx)), 8e-3);
  EXPECT_LT(rel_normwise(dw_first, d(dw)), kFp8AccumulationTol);  // the same codes
}

// linear(..., fp8 = true), forward and backward, against the CPU emulation (the case helper rounds
// every value to bf16 first, so both sides quantize the same values to the same codes).
testing::OpCase fp8_linear_case(int64_t N, int64_t Cin, int64_t Cout, bool bias, bool residual) {
  testing::OpCase c;
  c.f = [bias, residual](const std::vector<Var>& in, const std::vector<Var>& p) {
    return linear(in[0], p[0], bias ? p[1] : Var(), residual ? in[1] : Var(), /*fp8=*/true);
  };
  c.inputs = {testing::randn_tensor({N, Cin}, 1)};
  if (residual) c.inputs.push_back(testing::randn_tensor({N, Cout}, 6));
  c.params = {testing::randn_tensor({Cout, Cin}, 2, 0.05)};
  if (bias) c.params.push_back(testing::randn_tensor({Cout}, 3));
  return c;
}

TEST(Fp8Cuda, LinearMatchesTheCpuEmulation) {
  GTRON_REQUIRE_GPU();
  testing::expect_cuda_matches_cpu(fp8_linear_case(256, 384, 128, false, false), DType::kBF16,
                                   testing::kBF16Tol);
  testing::expect_cuda_matches_cpu(fp8_linear_case(384, 256, 640, false, false), DType::kBF16,
                                   testing::kBF16Tol);
}

// Note [fp8 untiled sizes]: feature sizes with tail tiles (a multiple of 16, not of 128) through
// cuBLASLt's block-scaled products, against the CPU emulation of the same recipe; GPT-2 1.5B's
// attention projection (C = 1600 into 3C = 4800) among them. The counts show the FP8 products ran
// (not the bf16 fallback).
TEST(Fp8Cuda, LinearAtUntiledSizesMatchesTheCpuEmulation) {
  GTRON_REQUIRE_GPU();
  fp8::set_untiled_sizes_for_testing(true);
  const fp8::ForwardInputCounts before = fp8::forward_input_counts();
  testing::expect_cuda_matches_cpu(fp8_linear_case(256, 272, 400, true, true), DType::kBF16,
                                   testing::kBF16Tol);
  testing::expect_cuda_matches_cpu(fp8_linear_case(128, 1600, 4800, false, false), DType::kBF16,
                                   testing::kBF16Tol);
  const fp8::ForwardInputCounts after = fp8::forward_input_counts();
  fp8::set_untiled_sizes_for_testing(false);
  EXPECT_GE(after.quantized + after.handed_in, before.quantized + before.handed_in + 2)
      << "the untiled linears ran the bf16 products";
}

// t [R, K] with each tile of `tile_rows` rows by 128 columns scaled by its own power of two in
// [2^-6, 2^6]: a scale read from the wrong place (a transposed or mis-strided scale layout) then
// misplaces factors up to 2^12, where operands of one magnitude share nearly every scale and hide
// it.
Tensor tile_magnitudes(const Tensor& t, int64_t tile_rows, int salt) {
  const int64_t R = t.shape()[0], K = t.shape()[1];
  std::vector<double> v = t.to_vector();
  for (int64_t r = 0; r < R; ++r)
    for (int64_t k = 0; k < K; ++k)
      v[r * K + k] *=
          std::ldexp(1.0, static_cast<int>((r / tile_rows * 5 + k / 128 * 3 + salt) % 13) - 6);
  return Tensor::from_vector(v, t.shape(), t.dtype());
}

TEST(Fp8Cuda, LinearWithTilesOfMixedMagnitudesMatchesTheCpuEmulation) {
  GTRON_REQUIRE_GPU();
  testing::OpCase c = fp8_linear_case(384, 512, 256, false, false);
  c.inputs[0] = tile_magnitudes(c.inputs[0], 1, 0);    // x: 1x128 tiles
  c.params[0] = tile_magnitudes(c.params[0], 128, 7);  // w: 128x128 blocks
  testing::expect_cuda_matches_cpu(c, DType::kBF16, testing::kBF16Tol);
}

TEST(Fp8Cuda, LinearWithBiasAndResidualMatchesTheCpuEmulation) {
  GTRON_REQUIRE_GPU();
  testing::expect_cuda_matches_cpu(fp8_linear_case(256, 128, 256, true, false), DType::kBF16,
                                   testing::kBF16Tol);
  testing::expect_cuda_matches_cpu(fp8_linear_case(256, 128, 256, false, true), DType::kBF16,
                                   testing::kBF16Tol);
  // Both (GPT-2's attention projection): the bias in the epilogue beside the residual, or after.
  testing::expect_cuda_matches_cpu(fp8_linear_case(256, 128, 256, true, true), DType::kBF16,
                                   testing::kBF16Tol);
}

// Note [fp8 GEMM choice]: the linear on gtron's block-scaled kernel agrees with the linear on
// cuBLASLt's within the accumulation bound (both sum each 128-long stretch in the tensor cores and
// promote it with its two scales, in different instruction orders), a bias included: forward,
// data gradient (bf16, within its rounding) and weight gradient (fp32).
TEST(Fp8Cuda, LinearOnGtronsKernelAgreesWithCublasLt) {
  GTRON_REQUIRE_GPU();
  if (!cuda::fp8_block_gemm_usable())
    GTEST_SKIP() << "gtron's FP8 GEMM needs compute capability 9.0";
  const Device dev = Device::cuda(0);
  const int64_t N = 384, Cin = 512, Cout = 256;
  const Tensor xh = testing::randn_tensor({N, Cin}, 5, 1.0, DType::kF32).to(DType::kBF16);
  const Tensor dyh = testing::randn_tensor({N, Cout}, 6, 1.0, DType::kF32).to(DType::kBF16);
  struct Out {
    std::vector<double> y, dx, dw;
  };
  auto run = [&](fp8::GemmKernel k) {
    fp8::set_gemm_kernel(k);
    ParamRegistry reg(DType::kF32, dev, 13);
    reg.set_fp8_linears(true);
    LinearLayer lin(reg, "lin", Cin, Cout, /*bias=*/true, 0.05);
    Bf16Weights access;
    lin.weight->zero_grad();
    Var x = Var::leaf(xh.to(dev));
    Var y = lin.forward(x, access);
    backward_with(y, dyh.to(dev));
    Out o{y.value().to_vector(), x.grad().to_vector(), lin.weight->main_grad.to_vector()};
    fp8::set_gemm_kernel(fp8::GemmKernel::kCublasLt);
    return o;
  };
  const Out ref = run(fp8::GemmKernel::kCublasLt), got = run(fp8::GemmKernel::kGtron);
  EXPECT_LT(rel_normwise(got.y, ref.y), 8e-3);  // bf16 outputs: an ulp here and there
  EXPECT_LT(rel_normwise(got.dx, ref.dx), 8e-3);
  EXPECT_LT(rel_normwise(got.dw, ref.dw), 2 * kFp8AccumulationTol);
  EXPECT_GT(rel_normwise(got.dw, std::vector<double>(got.dw.size(), 0.0)), 0.5);  // not empty
  const Out again = run(fp8::GemmKernel::kGtron);
  EXPECT_EQ(again.y, got.y);  // deterministic
  EXPECT_EQ(again.dw, got.dw);
}

// The FP8 and bf16 products of the Llama-3.2-1B linears (B·T = 8192 rows), timed with CUDA events
// after a warm-up; asserts the FP8 output within the e4m3 bound of the bf16 one, prints
// {"gemm": ..., "bf16_us": ..., "fp8_us": ..., "tflops_fp8": ...} per shape.
TEST(Fp8Cuda, LlamaShapesTimedAgainstBf16) {
  GTRON_REQUIRE_GPU();
  const Device dev = Device::cuda(0);
  Stream& s = current_stream(dev);
  struct Shape3 {
    const char* name;
    int64_t N, Cin, Cout;
  };
  const Shape3 shapes[] = {{"qkv", 8192, 2048, 3072},
                           {"o", 8192, 2048, 2048},
                           {"gate_up", 8192, 2048, 16384},
                           {"down", 8192, 8192, 2048}};
  for (const Shape3& sh : shapes) {
    Tensor xb =
        testing::randn_tensor({sh.N, sh.Cin}, 1, 1.0, DType::kF32).to(DType::kBF16).to(dev, &s);
    Tensor wb =
        testing::randn_tensor({sh.Cout, sh.Cin}, 2, 0.02, DType::kF32).to(DType::kBF16).to(dev, &s);
    Var xv = Var::constant(xb), wv = Var::constant(wb);
    NoGradGuard ng;
    auto time_us = [&](bool fp8, Tensor* out) {
      Var y;
      for (int i = 0; i < 3; ++i) y = linear(xv, wv, Var(), Var(), fp8);
      cudaEvent_t a, b;
      cudaEventCreate(&a);
      cudaEventCreate(&b);
      constexpr int kReps = 20;
      cudaEventRecord(a, static_cast<cudaStream_t>(s.native()));
      for (int i = 0; i < kReps; ++i) y = linear(xv, wv, Var(), Var(), fp8);
      cudaEventRecord(b, static_cast<cudaStream_t>(s.native()));
      cudaEventSynchronize(b);
      float ms = 0;
      cudaEventElapsedTime(&ms, a, b);
      cudaEventDestroy(a);
      cudaEventDestroy(b);
      *out = y.value();
      return 1e3 * ms / kReps;
    };
    Tensor y8, y16;
    const double us8 = time_us(true, &y8), us16 = time_us(false, &y16);
    const std::vector<double> a = y8.to_vector(), r = y16.to_vector();
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      num += (a[i] - r[i]) * (a[i] - r[i]);
      den += r[i] * r[i];
    }
    const double rel = std::sqrt(num / den);
    EXPECT_LT(rel, 0.08) << sh.name;  // e4m3 keeps 3 mantissa bits: ~2-4% normwise
    const double flops = 2.0 * sh.N * sh.Cin * sh.Cout;
    std::printf(
        "{\"gemm\": \"%s\", \"rows\": %ld, \"cin\": %ld, \"cout\": %ld, \"bf16_us\": %.1f, "
        "\"fp8_us\": %.1f, \"tflops_bf16\": %.1f, \"tflops_fp8\": %.1f, \"rel_diff\": %.4f}\n",
        sh.name, static_cast<long>(sh.N), static_cast<long>(sh.Cin), static_cast<long>(sh.Cout),
        us16, us8, flops / us16 * 1e-6, flops / us8 * 1e-6, rel);
  }
}

}  // namespace
}  // namespace gtron

// gtron's block-scaled FP8 GEMM (model/ops/fp8_gemm.h, Note [fp8 block GEMM]; GPU test, skipped
// without a compute-capability 9.0 GPU): on operands made by gtron's own quantizers exactly as the
// FP8 linear makes them (forward: x in tiles, w in blocks; dgrad: dy in tiles, w's transposed
// blocks; wgrad: dyᵀ and xᵀ in tiles along the tokens), D agrees with cuBLASLt's FP8 product
// (cuda::gemm with GemmArgs::fp8, as fp8.cc calls it) and with an fp64 product of the dequantized
// operands within the Hopper accumulation bound (Note [fp8 accumulation on Hopper] in
// fp8_cuda_test.cc), plus bf16's rounding for a bf16 D: over the whole output, and in its worst
// row and worst column. Shapes: 128³, 256 x 384 x 640 and the Llama-3.2-1B linears' products at
// 8192 tokens; D in bf16 and fp32; beta 0 (D poisoned with NaN first, so an unwritten element
// fails) and 1 (C read from D itself, and a separate residual); reruns and both tile widths
// (BN = 128, 256) bit-identical. The fp64 reference covers every row of the small shapes and 48
// rows (every column) of the large ones, at varied offsets within their tiles.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "model/cuda/device_buffer.h"
#include "model/cuda/gemm.h"
#include "model/device.h"
#include "model/dtype.h"
#include "model/ops/fp8.h"
#include "model/ops/fp8_gemm.h"
#include "model/stream.h"
#include "tests/model/cuda_op_check.h"

#define GTRON_REQUIRE_FP8_GEMM()                                                  \
  GTRON_REQUIRE_GPU();                                                            \
  if (!::gtron::cuda::fp8_block_gemm_usable()) {                                  \
    GTEST_SKIP() << "fp8_block_gemm needs a compute-capability 9.0 GPU: skipped"; \
  }

namespace gtron {
namespace {

constexpr double kAccTol = 4.0 / 8192.0;            // 4·2^-13: Note [fp8 accumulation on Hopper]
constexpr double kBf16Tol = kAccTol + 1.0 / 256.0;  // + a bf16 D's rounding (at most 2^-8)

void* stream() { return default_stream(Device::cuda(0)).native(); }

// fn(i) for i in [0, n), spread over the host's cores.
template <typename Fn>
void parallel_for(int64_t n, Fn fn) {
  const int64_t threads =
      std::clamp<int64_t>(static_cast<int64_t>(std::thread::hardware_concurrency()), 1, 16);
  std::vector<std::thread> pool;
  for (int64_t t = 0; t < threads; ++t) {
    pool.emplace_back([&fn, n, t, threads] {
      for (int64_t i = t; i < n; i += threads) fn(i);
    });
  }
  for (std::thread& th : pool) th.join();
}

uint64_t mix(uint64_t x) {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// [R, C] bf16 values, uniform in (-1, 1) times a power of two in [2^-6, 2^6] that is constant over
// each tr x tc tile (the quantizer's tiles) and varies between tiles, so a scale read from the
// wrong place misplaces factors up to 2^12; one tile in 29 is all zeros.
std::vector<BF16> tiled_values(int64_t R, int64_t C, int64_t tr, int64_t tc, uint64_t seed) {
  std::vector<BF16> v(R * C);
  const int64_t tiles_c = (C + tc - 1) / tc;
  parallel_for(R, [&](int64_t r) {
    for (int64_t c = 0; c < C; ++c) {
      const uint64_t tile = mix(seed * 1000003u + (r / tr) * tiles_c + c / tc);
      const int e = static_cast<int>((tile >> 8) % 13) - 6;
      const float mag = tile % 29 == 7 ? 0.0f : std::ldexp(1.0f, e);
      const float u = static_cast<float>(mix(seed ^ (r * C + c) * 7919u) >> 40) / 16777216.0f;
      v[r * C + c] = float_to_bf16((2.0f * u - 1.0f) * mag);
    }
  });
  return v;
}

using Buffer = std::unique_ptr<cuda::DeviceBuffer>;

Buffer device_bytes(size_t bytes) { return std::make_unique<cuda::DeviceBuffer>(bytes); }

// On the stream the kernels run on, and finished before it returns. A plain cudaMemcpy from
// pageable memory may return before its last DMA lands, and it runs on the legacy default stream,
// which gtron's streams (cudaStreamNonBlocking) do not wait for: a kernel reading the buffer
// (the quantizers' inputs, D as C with beta 1) could see part of the old bytes.
template <typename T>
Buffer to_device(const std::vector<T>& v) {
  Buffer b = device_bytes(v.size() * sizeof(T));
  const auto st = static_cast<cudaStream_t>(stream());
  EXPECT_EQ(cudaMemcpyAsync(b->get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice, st),
            cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(st), cudaSuccess);
  return b;
}

template <typename T>
std::vector<T> to_host(const Buffer& b, size_t n) {
  std::vector<T> v(n);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(v.data(), b->get(), n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

// Which product of a linear the operands are (Note [fp8 recipe]).
enum class Kind { kForward, kDgrad, kWgrad };

struct Shape {
  const char* name;
  int64_t M, N, K;
  Kind kind;
};

// The codes and scales of A [M, K] (rows layout) and B [N, K] (blocks layout, or rows for the
// wgrad), on the device and copied back for the reference.
struct Operands {
  int64_t M = 0, N = 0, K = 0;
  bool b_blocks = true;
  Buffer qa, sa, qb, sb;
  std::vector<uint8_t> qa_h, qb_h;
  std::vector<float> sa_h, sb_h;
};

// Quantizes random values through the CUDA quantizers the FP8 linear uses, in its layouts.
Operands make_operands(const Shape& s, uint64_t seed) {
  Operands o;
  o.M = s.M;
  o.N = s.N;
  o.K = s.K;
  o.b_blocks = s.kind != Kind::kWgrad;
  const size_t sa_n = fp8::row_scale_floats(s.M, s.K);
  const size_t sb_n =
      o.b_blocks ? fp8::block_scale_floats(s.N, s.K) : fp8::row_scale_floats(s.N, s.K);
  o.qa = device_bytes(s.M * s.K);
  o.sa = device_bytes(sa_n * sizeof(float));
  o.qb = device_bytes(s.N * s.K);
  o.sb = device_bytes(sb_n * sizeof(float));
  auto* qa = static_cast<uint8_t*>(o.qa->get());
  auto* qb = static_cast<uint8_t*>(o.qb->get());
  auto* sa = static_cast<float*>(o.sa->get());
  auto* sb = static_cast<float*>(o.sb->get());
  if (s.kind == Kind::kWgrad) {  // dyᵀ [Cout, tokens] and xᵀ [Cin, tokens], tiles along tokens
    const Buffer dy = to_device(tiled_values(s.K, s.M, 128, 1, seed));
    const Buffer x = to_device(tiled_values(s.K, s.N, 128, 1, seed + 1));
    cuda::fp8_quantize_cols(dy->get(), s.K, s.M, qa, sa, stream());
    cuda::fp8_quantize_cols(x->get(), s.K, s.N, qb, sb, stream());
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  } else {
    const Buffer a = to_device(tiled_values(s.M, s.K, 1, 128, seed));
    cuda::fp8_quantize_rows(a->get(), s.M, s.K, qa, sa, stream());
    if (s.kind == Kind::kForward) {  // w [N = Cout, K = Cin]
      const Buffer w = to_device(tiled_values(s.N, s.K, 128, 128, seed + 1));
      cuda::fp8_quantize_blocks(w->get(), DType::kBF16, s.N, s.K, qb, sb, nullptr, nullptr,
                                stream());
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    } else {  // w [K = Cout, N = Cin], read as its transposed blocks
      const Buffer w = to_device(tiled_values(s.K, s.N, 128, 128, seed + 1));
      cuda::fp8_quantize_blocks(w->get(), DType::kBF16, s.K, s.N, nullptr, nullptr, qb, sb,
                                stream());
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    }
  }
  o.qa_h = to_host<uint8_t>(o.qa, s.M * s.K);
  o.qb_h = to_host<uint8_t>(o.qb, s.N * s.K);
  o.sa_h = to_host<float>(o.sa, sa_n);
  o.sb_h = to_host<float>(o.sb, sb_n);
  return o;
}

// The fp64 product of the dequantized operands at the given rows of D (every column), plus
// beta·C (c_h: C's values as floats, [M, N]; empty when beta = 0).
std::vector<double> reference_rows(const Operands& o, const std::vector<int64_t>& rows, float beta,
                                   const std::vector<float>& c_h) {
  std::array<double, 256> decode;
  for (int i = 0; i < 256; ++i) decode[i] = fp8::decode_e4m3(static_cast<uint8_t>(i));
  const int64_t M = o.M, N = o.N, K = o.K, ld = fp8::block_scale_ld(K);
  std::vector<double> b(N * K);
  parallel_for(N, [&](int64_t n) {
    for (int64_t k = 0; k < K; ++k) {
      const float s = o.b_blocks ? o.sb_h[(n / 128) * ld + k / 128] : o.sb_h[(k / 128) * N + n];
      b[n * K + k] = decode[o.qb_h[n * K + k]] * s;
    }
  });
  std::vector<double> out(rows.size() * N);
  parallel_for(static_cast<int64_t>(rows.size()), [&](int64_t i) {
    const int64_t m = rows[i];
    std::vector<double> a(K);
    for (int64_t k = 0; k < K; ++k) a[k] = decode[o.qa_h[m * K + k]] * o.sa_h[(k / 128) * M + m];
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0;
      const double* bn = b.data() + n * K;
      for (int64_t k = 0; k < K; ++k) acc += a[k] * bn[k];
      out[i * N + n] = acc + (beta != 0.0f ? beta * static_cast<double>(c_h[m * N + n]) : 0.0);
    }
  });
  return out;
}

// Every row of a small D; 48 rows of a large one, spread over its row tiles and at 48 different
// offsets within a tile (both consumer warpgroups, every warp, both halves of a lane's rows).
std::vector<int64_t> sample_rows(int64_t M) {
  std::vector<int64_t> rows;
  if (M <= 512) {
    for (int64_t m = 0; m < M; ++m) rows.push_back(m);
    return rows;
  }
  for (int64_t i = 0; i < 48; ++i)
    rows.push_back((i * 977 + 5) % (M / 128) * 128 + (i * 41 + 3) % 128);
  return rows;
}

// Normwise relative difference of got against want ([rows, cols]) over the whole matrix and in
// its worst row and worst column; non-finite values of got counted.
struct Diff {
  double all = 0, worst_row = 0, worst_col = 0;
  int64_t nonfinite = 0;
};

template <typename W>
Diff compare(const std::vector<float>& got, const std::vector<W>& want, int64_t rows,
             int64_t cols) {
  Diff d;
  std::vector<double> row_num(rows, 0), row_den(rows, 0), col_num(cols, 0), col_den(cols, 0);
  double num = 0, den = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const double g = got[r * cols + c], w = want[r * cols + c];
      if (!std::isfinite(g)) ++d.nonfinite;
      const double e = (g - w) * (g - w), v = w * w;
      row_num[r] += e;
      row_den[r] += v;
      col_num[c] += e;
      col_den[c] += v;
    }
    num += row_num[r];
    den += row_den[r];
  }
  auto rel = [](double a, double b) { return std::sqrt(a / std::max(b, 1e-300)); };
  d.all = rel(num, den);
  for (int64_t r = 0; r < rows; ++r)
    d.worst_row = std::max(d.worst_row, rel(row_num[r], row_den[r]));
  for (int64_t c = 0; c < cols; ++c)
    d.worst_col = std::max(d.worst_col, rel(col_num[c], col_den[c]));
  return d;
}

void expect_within(const Diff& d, double tol, const std::string& what) {
  EXPECT_EQ(d.nonfinite, 0) << what << ": non-finite outputs (an element left unwritten?)";
  EXPECT_LT(d.all, tol) << what << ": normwise";
  EXPECT_LT(d.worst_row, 2 * tol) << what << ": worst row";
  EXPECT_LT(d.worst_col, 2 * tol) << what << ": worst column";
}

constexpr int64_t kChunk = 1 << 20;  // elements a host thread converts at a time

// D [M, N] (d_type) as floats.
std::vector<float> read_d(const Buffer& d, DType t, int64_t n) {
  if (t == DType::kF32) return to_host<float>(d, n);
  const std::vector<BF16> v = to_host<BF16>(d, n);
  std::vector<float> f(n);
  parallel_for((n + kChunk - 1) / kChunk, [&](int64_t c) {
    for (int64_t i = c * kChunk; i < std::min(n, (c + 1) * kChunk); ++i) f[i] = bf16_to_float(v[i]);
  });
  return f;
}

// v (floats of d_type's values) as d_type bytes on the device.
Buffer upload_as(const std::vector<float>& v, DType t) {
  if (t == DType::kF32) return to_device(v);
  const int64_t n = static_cast<int64_t>(v.size());
  std::vector<BF16> b(n);
  parallel_for((n + kChunk - 1) / kChunk, [&](int64_t c) {
    for (int64_t i = c * kChunk; i < std::min(n, (c + 1) * kChunk); ++i) b[i] = float_to_bf16(v[i]);
  });
  return to_device(b);
}

// How C enters: not at all (beta = 0, D poisoned with NaN), D's own values (beta = 1, c null) or a
// separate residual R (beta = 1, c = R, D poisoned).
enum class Accumulate { kNone, kInPlace, kResidual };

struct Case {
  Accumulate acc = Accumulate::kNone;
  DType d_type = DType::kBF16;
};

// The initial D and C of a run, as floats of d_type's values (C empty without accumulation).
struct Start {
  std::vector<float> d, c;
};

Start start_values(const Operands& o, const Case& run, uint64_t seed) {
  Start s;
  const int64_t n = o.M * o.N;
  s.d.assign(n, std::numeric_limits<float>::quiet_NaN());
  if (run.acc != Accumulate::kNone) {
    const std::vector<BF16> c = tiled_values(o.M, o.N, 1, 128, seed);
    s.c.resize(n);
    for (int64_t i = 0; i < n; ++i) s.c[i] = bf16_to_float(c[i]);
    if (run.acc == Accumulate::kInPlace) s.d = s.c;
  }
  return s;
}

// One product by gtron's kernel (block_n as given) or by cuBLASLt, from `start`: D as floats,
// or nothing where cuBLASLt has no algorithm for the problem (try_gemm).
std::vector<float> product(const Operands& o, const Case& run, const Start& start, bool gtron,
                           int block_n = 0) {
  const Buffer d = upload_as(start.d, run.d_type);
  const Buffer r = run.acc == Accumulate::kResidual ? upload_as(start.c, run.d_type) : nullptr;
  const float beta = run.acc == Accumulate::kNone ? 0.0f : 1.0f;
  if (gtron) {
    cuda::Fp8GemmArgs g;
    g.a = static_cast<const uint8_t*>(o.qa->get());
    g.scale_a = static_cast<const float*>(o.sa->get());
    g.b = static_cast<const uint8_t*>(o.qb->get());
    g.scale_b = static_cast<const float*>(o.sb->get());
    g.b_blocks = o.b_blocks;
    g.d = d->get();
    g.d_type = run.d_type;
    g.c = r != nullptr ? r->get() : nullptr;
    g.beta = beta;
    g.m = o.M;
    g.n = o.N;
    g.k = o.K;
    g.block_n = block_n;
    cuda::fp8_block_gemm(g, stream());
  } else {  // as fp8.cc's fp8_product
    cuda::GemmArgs g;
    g.fp8 = true;
    g.a = o.qa->get();
    g.scale_a = static_cast<const float*>(o.sa->get());
    g.b = o.qb->get();
    g.trans_b = true;
    g.scale_b = static_cast<const float*>(o.sb->get());
    g.b_scales = o.b_blocks ? cuda::Fp8Scales::kBlocks : cuda::Fp8Scales::kRows;
    g.c = d->get();
    g.c_type = run.d_type;
    g.m = o.M;
    g.n = o.N;
    g.k = o.K;
    g.beta = beta;
    if (r != nullptr) {
      g.c = r->get();
      g.d = d->get();
    }
    if (!cuda::try_gemm(g, stream())) return {};
  }
  return read_d(d, run.d_type, o.M * o.N);
}

std::string describe(const Shape& s, const Case& run) {
  const char* acc[] = {"beta 0", "beta 1 in place", "residual"};
  return std::string(s.name) + " " + std::to_string(s.M) + "x" + std::to_string(s.N) + "x" +
         std::to_string(s.K) + " " + dtype_name(run.d_type) + " " + acc[static_cast<int>(run.acc)];
}

// gtron against cuBLASLt (every element) and the fp64 reference (sampled rows); then reruns at
// each tile width N allows, every one bit-identical to the first run (which took the launcher's
// width, so one of them is a plain rerun).
void check(const Shape& s, const Operands& o, const Case& run, uint64_t seed) {
  const std::string what = describe(s, run);
  const double tol = run.d_type == DType::kF32 ? kAccTol : kBf16Tol;
  const Start start = start_values(o, run, seed);
  const std::vector<float> ours = product(o, run, start, true);
  const std::vector<float> theirs = product(o, run, start, false);
  if (theirs.empty()) {
    std::printf("%s: cuBLASLt has no algorithm; checked against fp64 alone\n", what.c_str());
  } else {
    expect_within(compare(ours, theirs, o.M, o.N), tol, what + " vs cuBLASLt");
  }
  const std::vector<int64_t> rows = sample_rows(o.M);
  const std::vector<double> ref =
      reference_rows(o, rows, run.acc == Accumulate::kNone ? 0.0f : 1.0f, start.c);
  std::vector<float> ours_rows(rows.size() * o.N);
  for (size_t i = 0; i < rows.size(); ++i)
    std::copy_n(ours.begin() + rows[i] * o.N, o.N, ours_rows.begin() + i * o.N);
  expect_within(compare(ours_rows, ref, static_cast<int64_t>(rows.size()), o.N), tol,
                what + " vs fp64");
  for (int bn : {128, 256}) {
    if (o.N % bn != 0) continue;
    const std::vector<float> again = product(o, run, start, true, bn);
    EXPECT_EQ(std::memcmp(again.data(), ours.data(), ours.size() * sizeof(float)), 0)
        << what << ": block_n " << bn << " differs from the first run";
  }
}

TEST(Fp8GemmCuda, SmallShapesMatchCublasLtAndTheFp64Reference) {
  GTRON_REQUIRE_FP8_GEMM();
  const Shape shapes[] = {{"fwd", 128, 128, 128, Kind::kForward},
                          {"fwd", 256, 384, 640, Kind::kForward},
                          {"dgrad", 256, 384, 640, Kind::kDgrad},
                          {"wgrad", 256, 384, 640, Kind::kWgrad},
                          {"fwd", 384, 512, 256, Kind::kForward}};
  uint64_t seed = 1;
  for (const Shape& s : shapes) {
    const Operands o = make_operands(s, seed);
    for (DType t : {DType::kBF16, DType::kF32}) {
      for (Accumulate acc : {Accumulate::kNone, Accumulate::kInPlace, Accumulate::kResidual}) {
        check(s, o, Case{acc, t}, seed + 7);
      }
    }
    seed += 10;
  }
}

// More tiles than SMs (several a CTA, the ring's slots and parities carried from tile to tile)
// with fewer k-blocks than slots, in both scale layouts; and the rows layout over many k-blocks
// (each slot refilled many times a tile) into bf16 with beta 0, so a wrong column scale shows
// apart from the in-place epilogue (Note [fp8 scale reads] in model/ops/fp8_gemm_cuda.cu).
TEST(Fp8GemmCuda, PersistentWalkOverManyTilesMatches) {
  GTRON_REQUIRE_FP8_GEMM();
  const Shape shapes[] = {{"fwd", 4096, 2048, 512, Kind::kForward},
                          {"wgrad", 2048, 4096, 384, Kind::kWgrad},
                          {"wgrad", 2048, 2048, 4096, Kind::kWgrad}};
  for (const Shape& s : shapes) {
    const Operands o = make_operands(s, 31);
    check(s, o, Case{Accumulate::kNone, DType::kBF16}, 37);
    check(s, o, Case{Accumulate::kInPlace, DType::kF32}, 41);
  }
}

// The Llama-3.2-1B linears (hidden 2048, qkv 3072, MLP 8192 with gate and up fused to 16384) at
// 8192 tokens, each product as the linear runs it: forward and dgrad into bf16, the wgrad
// accumulated into an fp32 main_grad.
TEST(Fp8GemmCuda, LlamaShapesMatchCublasLtAndTheFp64Reference) {
  GTRON_REQUIRE_FP8_GEMM();
  struct Linear {
    const char* name;
    int64_t out, in;
  };
  const Linear linears[] = {
      {"qkv", 3072, 2048}, {"o", 2048, 2048}, {"gate_up", 16384, 2048}, {"down", 2048, 8192}};
  const int64_t T = 8192;
  uint64_t seed = 100;
  for (const Linear& l : linears) {
    const std::string fwd = std::string(l.name) + " fwd", dgrad = std::string(l.name) + " dgrad",
                      wgrad = std::string(l.name) + " wgrad";
    const Shape shapes[] = {{fwd.c_str(), T, l.out, l.in, Kind::kForward},
                            {dgrad.c_str(), T, l.in, l.out, Kind::kDgrad},
                            {wgrad.c_str(), l.out, l.in, T, Kind::kWgrad}};
    for (const Shape& s : shapes) {
      const Operands o = make_operands(s, seed++);
      const Case run = s.kind == Kind::kWgrad ? Case{Accumulate::kInPlace, DType::kF32}
                                              : Case{Accumulate::kNone, DType::kBF16};
      check(s, o, run, seed++);
    }
  }
}

}  // namespace
}  // namespace gtron

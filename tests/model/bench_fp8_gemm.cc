// Not a test: what cuBLASLt's FP8 matrix products cost on this GPU, per scaling mode, at the linear
// shapes of the models issue 48 measures (Llama-3.2-1B, Qwen3-0.6B, GPT-2 1.5B; 8192 tokens), for
// the three products of a linear (forward, data gradient, weight gradient), and what gtron's own
// block-scaled kernel (model/ops/fp8_gemm.h) costs on the same products. One JSON line per
// (model, linear, product, mode): the heuristic's first algorithm and the fastest of its first
// --algos, in microseconds and TFLOP/s, beside bf16 at the same shape.
//
// Modes: bf16; fp8 "tensor" (one fp32 scale per operand), "rowwise" (OUTER_VEC_32F: a scale per
// row of each operand), "block" (the weight in 128x128 blocks, the activation in 1x128 tiles:
// DeepSeek-V3's recipe, Note [fp8 recipe]) and "vec128" (1x128 tiles on both operands, the weight
// gradient's case; the weight gradient also in "block" and "block_b", cuBLASLt's A or B operand
// in 128x128 blocks, a recipe gtron does not use, to know its price); each fp8 mode also with
// CUBLASLT_MATMUL_DESC_FAST_ACCUM (no periodic promotion of the tensor cores' partial sums;
// "algos": 0 where cuBLASLt offers no algorithm for it, as it may for the block modes, whose scales
// apply per 128 along K). "gtron" is gtron's kernel (Note [fp8 block GEMM] in
// model/ops/fp8_gemm_cuda.cu) on the "block" / "vec128" case of each product (the forward and dgrad
// with the weight in blocks, the wgrad with both operands in tiles), with the tile width its
// launcher picks; "gtron_n128" and "gtron_n256" force 128 or 256 output columns a tile (where N
// allows). Its lines have one "algorithm" (algos 1, first = best) and appear on compute
// capability 9.0 only, for the shapes it takes (every dimension a multiple of 128; algos 0
// otherwise). Operands are random codes and unit scales: the products' values do not matter here,
// only their time (gtron's fp8 tests, fp8_gemm_cuda_test among them, check values).
//
// First, the FP8 quantizers (model/ops/fp8.h's cuda::fp8_quantize_*) at the Llama-3.2-1B shapes:
// one JSON line each, {"quantizer", "shape", "us", "gbps"}, gbps being the bytes the quantizer must
// move (its input once, its codes and scales once: Note [fp8 quantizer bandwidth] in
// model/ops/fp8_cuda.cu) over its time; an H100 streams ~3000 GB/s.
//
// Usage: bench_fp8_gemm [--tokens N] [--algos K] [--reps R] [--quantizers-only]
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "model/dtype.h"
#include "model/ops/fp8.h"
#include "model/ops/fp8_gemm.h"

namespace {

#define CK(x)                                                                 \
  do {                                                                        \
    auto e_ = (x);                                                            \
    if (static_cast<int>(e_) != 0) {                                          \
      std::fprintf(stderr, "%s:%d: %s failed (%d)\n", __FILE__, __LINE__, #x, \
                   static_cast<int>(e_));                                     \
      std::exit(1);                                                           \
    }                                                                         \
  } while (0)

struct Linear {
  const char* model;
  const char* name;
  long out, in;
};

const Linear kLinears[] = {
    {"llama1b", "qkv", 3072, 2048},      {"llama1b", "o", 2048, 2048},
    {"llama1b", "gate_up", 16384, 2048}, {"llama1b", "down", 2048, 8192},
    {"qwen06b", "qkv", 4096, 1024},      {"qwen06b", "o", 1024, 2048},
    {"qwen06b", "gate_up", 6144, 1024},  {"qwen06b", "down", 1024, 3072},
    {"gpt2_1.5b", "qkv", 4800, 1600},    {"gpt2_1.5b", "proj", 1600, 1600},
    {"gpt2_1.5b", "fc", 6400, 1600},     {"gpt2_1.5b", "fc2", 1600, 6400},
};

enum class Mode { kBf16, kTensor, kRowwise, kBlock, kBlockB, kVec128 };
const char* mode_name(Mode m) {
  switch (m) {
    case Mode::kBf16:
      return "bf16";
    case Mode::kTensor:
      return "tensor";
    case Mode::kRowwise:
      return "rowwise";
    case Mode::kBlock:
      return "block";
    case Mode::kBlockB:
      return "block_b";
    case Mode::kVec128:
      return "vec128";
  }
  return "?";
}

struct Buffers {
  void* a = nullptr;  // the largest operand, reused for both: values do not matter
  void* b = nullptr;
  void* d = nullptr;
  float* scales_a = nullptr;
  float* scales_b = nullptr;
  void* ws = nullptr;
  size_t ws_bytes = 64 << 20;
};

// Times D(m x n, bf16) = op(A)(m x k) op(B)(k x n), both operands k-major ("TN", which FP8 needs on
// Hopper), over the first `algos` heuristic results. Returns {first_us, best_us, count}.
struct Timing {
  double first_us = -1, best_us = -1;
  int count = 0;
};

Timing time_gemm(cublasLtHandle_t h, const Buffers& buf, Mode mode, bool fast, long m, long n,
                 long k, int algos, int reps) {
  const bool fp8 = mode != Mode::kBf16;
  const cudaDataType_t ab = fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
  cublasLtMatmulDesc_t desc;
  CK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const int32_t tA = CUBLAS_OP_T, tB = CUBLAS_OP_N;
  CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &tA, sizeof(tA)));
  CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tB, sizeof(tB)));
  if (fp8) {
    int32_t ma = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, mb = ma;
    if (mode == Mode::kRowwise) ma = mb = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    if (mode == Mode::kBlock) {
      ma = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
      mb = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    }
    if (mode == Mode::kBlockB) {  // the blocks on the other operand
      ma = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
      mb = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    }
    if (mode == Mode::kVec128) ma = mb = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma, sizeof(ma)));
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mb, sizeof(mb)));
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &buf.scales_a,
                                      sizeof(void*)));
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &buf.scales_b,
                                      sizeof(void*)));
    const int8_t f = fast ? 1 : 0;
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &f, sizeof(f)));
  }
  cublasLtMatrixLayout_t la, lb, ld;
  CK(cublasLtMatrixLayoutCreate(&la, ab, k, m, k));
  CK(cublasLtMatrixLayoutCreate(&lb, ab, k, n, k));
  CK(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, m, n, m));
  cublasLtMatmulPreference_t pref;
  CK(cublasLtMatmulPreferenceCreate(&pref));
  CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                          &buf.ws_bytes, sizeof(buf.ws_bytes)));
  std::vector<cublasLtMatmulHeuristicResult_t> res(algos);
  int found = 0;
  Timing t;
  if (cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, ld, ld, pref, algos, res.data(), &found) ==
          CUBLAS_STATUS_SUCCESS &&
      found > 0) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    const float alpha = 1, beta = 0;
    for (int i = 0; i < found; ++i) {
      auto call = [&] {
        return cublasLtMatmul(h, desc, &alpha, buf.a, la, buf.b, lb, &beta, buf.d, ld, buf.d, ld,
                              &res[i].algo, buf.ws, buf.ws_bytes, nullptr);
      };
      if (call() != CUBLAS_STATUS_SUCCESS) continue;
      for (int w = 0; w < 2; ++w) call();
      CK(cudaEventRecord(e0));
      for (int r = 0; r < reps; ++r) call();
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      const double us = 1e3 * ms / reps;
      if (t.count == 0) t.first_us = us;
      if (t.best_us < 0 || us < t.best_us) t.best_us = us;
      ++t.count;
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
  }
  CK(cudaGetLastError());
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatmulDescDestroy(desc);
  return t;
}

// Times gtron's kernel on the product time_gemm times as (m, n, k): D [n, m] (row-major, bf16) =
// A [n, k] (tiles along k) · B [m, k]ᵀ (blocks, or tiles along k with `blocks` false), the output
// tiles block_n wide (0: the launcher's choice). count 0 where the kernel does not take the shape.
Timing time_gtron(const Buffers& buf, bool blocks, long m, long n, long k, int block_n, int reps) {
  Timing t;
  if (!gtron::cuda::fp8_block_gemm_ok(n, m, k) || (block_n != 0 && m % block_n != 0)) return t;
  gtron::cuda::Fp8GemmArgs g;
  g.a = static_cast<const uint8_t*>(buf.a);
  g.scale_a = buf.scales_a;
  g.b = static_cast<const uint8_t*>(buf.b);
  g.scale_b = buf.scales_b;
  g.b_blocks = blocks;
  g.d = buf.d;
  g.d_type = gtron::DType::kBF16;
  g.m = n;
  g.n = m;
  g.k = k;
  g.block_n = block_n;
  for (int w = 0; w < 3; ++w) gtron::cuda::fp8_block_gemm(g, nullptr);
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaEventRecord(e0));
  for (int r = 0; r < reps; ++r) gtron::cuda::fp8_block_gemm(g, nullptr);
  CK(cudaEventRecord(e1));
  CK(cudaEventSynchronize(e1));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  CK(cudaGetLastError());
  t.first_us = t.best_us = 1e3 * ms / reps;
  t.count = 1;
  return t;
}

// Times fn (one quantizer call on the default stream) over reps after a warm-up: microseconds.
template <typename Fn>
double time_us(Fn&& fn, int reps) {
  for (int w = 0; w < 3; ++w) fn();
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaEventRecord(e0));
  for (int r = 0; r < reps; ++r) fn();
  CK(cudaEventRecord(e1));
  CK(cudaEventSynchronize(e1));
  CK(cudaGetLastError());
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return 1e3 * ms / reps;
}

// The quantizers of the FP8 linears of Llama-3.2-1B: x (rows for the forward, cols for the
// weight gradient), dy (rows and cols in one pass) and the fp32 masters (blocks, both
// orientations). The input is buf.a's random bytes (finite as bf16 and as fp32), the codes go to
// the two halves of buf.b, the scales to the scale buffers.
void time_quantizers(const Buffers& buf, long tokens, long most, int reps) {
  using namespace gtron;
  struct Case {
    const char* quantizer;
    long rows, cols;
  };
  const Case cases[] = {{"rows", tokens, 2048},       {"rows", tokens, 8192},
                        {"cols", tokens, 2048},       {"cols", tokens, 8192},
                        {"rows_cols", tokens, 2048},  {"rows_cols", tokens, 3072},
                        {"rows_cols", tokens, 16384}, {"blocks_f32", 3072, 2048},
                        {"blocks_f32", 16384, 2048},  {"blocks_f32", 2048, 8192}};
  uint8_t* q = static_cast<uint8_t*>(buf.b);
  for (const Case& c : cases) {
    const long R = c.rows, K = c.cols, n = R * K;
    if (n > most) continue;  // the buffers hold `most` elements (2 bytes each) and codes twice
    uint8_t* qt = q + most;
    const std::string name = c.quantizer;
    double bytes = 0;  // input once, each code once, each scale once
    std::function<void()> call;
    if (name == "rows") {
      bytes = 3.0 * n + 4.0 * n / 128;
      call = [&] { cuda::fp8_quantize_rows(buf.a, R, K, q, buf.scales_a, nullptr); };
    } else if (name == "cols") {
      bytes = 3.0 * n + 4.0 * n / 128;
      call = [&] { cuda::fp8_quantize_cols(buf.a, R, K, qt, buf.scales_b, nullptr); };
    } else if (name == "rows_cols") {
      bytes = 4.0 * n + 8.0 * n / 128;
      call = [&] {
        cuda::fp8_quantize_rows_cols(buf.a, R, K, q, buf.scales_a, qt, buf.scales_b, nullptr);
      };
    } else {
      if (4 * n > 2 * most) continue;
      bytes = 6.0 * n + 8.0 * n / (128 * 128);
      call = [&] {
        cuda::fp8_quantize_blocks(buf.a, DType::kF32, R, K, q, buf.scales_a, qt, buf.scales_b,
                                  nullptr);
      };
    }
    const double us = time_us(call, reps);
    std::printf("{\"quantizer\": \"%s\", \"shape\": [%ld, %ld], \"us\": %.1f, \"gbps\": %.0f}\n",
                c.quantizer, R, K, us, bytes / us * 1e-3);
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  long tokens = 8192;
  int algos = 8, reps = 20;
  bool quantizers_only = false;
  for (int i = 1; i < argc; ++i) {
    auto val = [&](const char* flag) {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_fp8_gemm: %s needs a value\n", flag);
        std::exit(2);
      }
      return std::atol(argv[++i]);
    };
    if (!std::strcmp(argv[i], "--tokens")) {
      tokens = val("--tokens");
    } else if (!std::strcmp(argv[i], "--algos")) {
      algos = static_cast<int>(val("--algos"));
    } else if (!std::strcmp(argv[i], "--reps")) {
      reps = static_cast<int>(val("--reps"));
    } else if (!std::strcmp(argv[i], "--quantizers-only")) {
      quantizers_only = true;
    } else {
      std::fprintf(stderr,
                   "usage: bench_fp8_gemm [--tokens N] [--algos K] [--reps R] "
                   "[--quantizers-only]\n");
      return 2;
    }
  }
  if (tokens <= 0 || algos <= 0 || reps <= 0) {
    std::fprintf(stderr, "bench_fp8_gemm: --tokens, --algos and --reps must be positive\n");
    return 2;
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::fprintf(stderr, "bench_fp8_gemm: no CUDA GPU\n");
    return 1;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  long most = 0;
  for (const Linear& l : kLinears)
    most = std::max({most, l.out * l.in, tokens * l.in, tokens * l.out});
  Buffers buf;
  CK(cudaMalloc(&buf.a, most * 2));
  CK(cudaMalloc(&buf.b, most * 2));
  CK(cudaMalloc(&buf.d, most * 2));
  CK(cudaMalloc(&buf.ws, buf.ws_bytes));
  {
    // Random bytes whose e4m3 reading is finite (exponent field below 15) and small; also fine as
    // bf16 (small finite values).
    std::vector<unsigned char> host(most * 2);
    unsigned s = 12345;
    for (auto& c : host) {
      s = s * 1103515245u + 12345u;
      c = static_cast<unsigned char>(((s >> 16) & 0x87) | 0x30);
    }
    CK(cudaMemcpy(buf.a, host.data(), host.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(buf.b, host.data(), host.size(), cudaMemcpyHostToDevice));
  }
  const long nscale = most / 16 + (1 << 16);  // >= rows x ceil(k / 128) with padding
  std::vector<float> ones(nscale, 1.0f);
  CK(cudaMalloc(&buf.scales_a, nscale * 4));
  CK(cudaMalloc(&buf.scales_b, nscale * 4));
  CK(cudaMemcpy(buf.scales_a, ones.data(), nscale * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(buf.scales_b, ones.data(), nscale * 4, cudaMemcpyHostToDevice));
  cublasLtHandle_t h;
  CK(cublasLtCreate(&h));
  const bool gtron_kernel = gtron::cuda::fp8_block_gemm_usable();
  std::printf(
      "{\"bench\": \"bench_fp8_gemm\", \"card\": \"%s\", \"tokens\": %ld, \"algos\": %d, "
      "\"reps\": %d}\n",
      prop.name, tokens, algos, reps);
  time_quantizers(buf, tokens, most, reps);
  if (quantizers_only) {
    cublasLtDestroy(h);
    return 0;
  }
  // The quantizers wrote over b and the scales: the products' operands again.
  CK(cudaMemcpy(buf.b, buf.a, most * 2, cudaMemcpyDeviceToDevice));
  CK(cudaMemcpy(buf.scales_a, ones.data(), nscale * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(buf.scales_b, ones.data(), nscale * 4, cudaMemcpyHostToDevice));
  struct Product {
    const char* name;
    long m, n, k;
  };
  for (const Linear& l : kLinears) {
    // The weight is operand A (m rows) in the forward and data gradient; the weight gradient
    // reduces over tokens, both operands in 1x128 tiles.
    const Product prods[] = {{"fwd", l.out, tokens, l.in},
                             {"dgrad", l.in, tokens, l.out},
                             {"wgrad", l.in, l.out, tokens}};
    for (const Product& p : prods) {
      const double flops = 2.0 * p.m * p.n * p.k;
      double bf16_best = 0;
      struct Case {
        Mode mode;
        bool fast;
      };
      const bool wgrad = !std::strcmp(p.name, "wgrad");
      std::vector<Case> cases = {{Mode::kBf16, false},
                                 {Mode::kTensor, false},
                                 {Mode::kTensor, true},
                                 {Mode::kRowwise, false},
                                 {Mode::kRowwise, true},
                                 {wgrad ? Mode::kVec128 : Mode::kBlock, false},
                                 {wgrad ? Mode::kVec128 : Mode::kBlock, true}};
      // What the weight gradient would cost with one operand in 128x128 blocks (a recipe that
      // quantizes dyᵀ by blocks for it; not gtron's today).
      if (wgrad) {
        cases.push_back({Mode::kBlock, false});
        cases.push_back({Mode::kBlockB, false});
      }
      auto print = [&](const char* mode, bool fast, const Timing& t) {
        std::printf(
            "{\"model\": \"%s\", \"linear\": \"%s\", \"product\": \"%s\", \"m\": %ld, \"n\": %ld, "
            "\"k\": %ld, \"mode\": \"%s\", \"fast_accum\": %d, \"algos\": %d, \"first_us\": %.1f, "
            "\"best_us\": %.1f, \"tflops_first\": %.1f, \"tflops_best\": %.1f, "
            "\"speedup_vs_bf16\": %.3f}\n",
            l.model, l.name, p.name, p.m, p.n, p.k, mode, fast ? 1 : 0, t.count, t.first_us,
            t.best_us, t.count ? flops / t.first_us * 1e-6 : 0.0,
            t.count ? flops / t.best_us * 1e-6 : 0.0,
            t.count && bf16_best > 0 ? bf16_best / t.best_us : 0.0);
        std::fflush(stdout);
      };
      for (const Case& c : cases) {
        const Timing t = time_gemm(h, buf, c.mode, c.fast, p.m, p.n, p.k, algos, reps);
        if (c.mode == Mode::kBf16) bf16_best = t.best_us;
        print(mode_name(c.mode), c.fast, t);
      }
      if (gtron_kernel) {
        const struct {
          const char* mode;
          int block_n;
        } widths[] = {{"gtron", 0}, {"gtron_n128", 128}, {"gtron_n256", 256}};
        for (const auto& w : widths) {
          if (w.block_n != 0 && p.m % w.block_n != 0) continue;
          print(w.mode, false, time_gtron(buf, !wgrad, p.m, p.n, p.k, w.block_n, reps));
        }
      }
    }
  }
  cublasLtDestroy(h);
  return 0;
}

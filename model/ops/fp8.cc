// The CUDA FP8 linear's glue (Note [fp8 recipe] in fp8.h): quantize the operands into scratch from
// the caching allocator, then the cuBLASLt FP8 products (model/cuda/gemm.h).
//
// Note [fp8 scratch]
// Codes and scales live only from their quantizer to the GEMM that reads them: scratch tensors on
// the op's stream, released as soon as the GEMM is queued (the allocator orders their reuse after
// it); the input codes a producer wrote (Note [fp8 fused producers] in fp8.h) live the same way,
// from the producer to the forward product. Nothing else is kept from the forward for the
// backward: the backward quantizes x along the tokens again, and the weight's transposed codes
// come from its QuantizedWeight (Note [fp8 weights once a step] in fp8.h) or are made again, so
// the FP8 path holds no more activation memory between the passes than the bf16 one. The one
// exception holds less: swiglu_linear_fp8 keeps its input's column codes (N·F bytes) instead of
// the bf16 input (2·N·F; Note [SwiGLU into an FP8 down projection] in fused_mlp.h).
#include "model/ops/fp8.h"

#include <atomic>
#include <cstdlib>
#include <string>

#include "model/autograd.h"
#include "model/check.h"
#include "model/cuda/gemm.h"
#include "model/env.h"
#include "model/ops/device_util.h"
#include "model/ops/fp8_gemm.h"

namespace gtron {

namespace cuda {

bool fp8_gemm_ok(int64_t rows, int64_t Cin, int64_t Cout) {
  auto tiled = [](int64_t n) { return n > 0 && n % fp8::kTile == 0; };
  if (tiled(rows) && tiled(Cin) && tiled(Cout)) return true;
  // Note [fp8 untiled sizes]: feature sizes with tail tiles.
  auto packed = [](int64_t n) { return n > 0 && n % 16 == 0; };
  return fp8::untiled_sizes() && tiled(rows) && packed(Cin) && packed(Cout);
}

}  // namespace cuda

namespace fp8 {

namespace {

// e4m3 codes and fp32 scales of one operand, in scratch on `s`.
struct Quantized {
  Tensor codes, scales;
  uint8_t* q() const { return static_cast<uint8_t*>(codes.raw()); }
  float* sc() const { return scales.data<float>(); }
};

Quantized scratch(int64_t elements, int64_t scale_floats, Stream& s) {
  return Quantized{scratch_bytes(elements, s), scratch_floats(scale_floats, s)};
}

// w[N, K] in 128x128 blocks, as stored (q) or transposed (qt, [K, N]).
Quantized quantize_weight(const Tensor& w, int64_t N, int64_t K, bool transposed, Stream& s) {
  Quantized out =
      scratch(N * K, transposed ? block_scale_floats(K, N) : block_scale_floats(N, K), s);
  cuda::fp8_quantize_blocks(w.raw(), w.dtype(), N, K, transposed ? nullptr : out.q(),
                            transposed ? nullptr : out.sc(), transposed ? out.q() : nullptr,
                            transposed ? out.sc() : nullptr, s.native());
  return out;
}

// set_gemm_kernel. cuBLASLt until gtron's kernel has passed its tests on a GPU (Note [fp8 GEMM
// choice]).
std::atomic<GemmKernel> g_gemm_kernel{GemmKernel::kCublasLt};

// Whether gtron's kernel runs this product (Note [fp8 GEMM choice]).
bool use_gtron_gemm(DType c_type, int64_t M, int64_t N, int64_t K) {
  const GemmKernel k = g_gemm_kernel.load(std::memory_order_relaxed);
  if (k == GemmKernel::kCublasLt) return false;
  const bool ok = (c_type == DType::kBF16 || c_type == DType::kF32) &&
                  cuda::fp8_block_gemm_ok(M, N, K) && cuda::fp8_block_gemm_usable();
  GTRON_CHECK(ok || k == GemmKernel::kAuto, "fp8 linear: gtron's FP8 GEMM was asked for, but it ",
              "takes neither ", M, " x ", N, " x ", K, " (", dtype_name(c_type),
              " out) nor this device (it needs compute capability 9.0)");
  return ok;
}

// C[M, N] (+)= A[M, K]·B[N, K]ᵀ from codes and scales (A in tiles along K).
void fp8_product(const Quantized& a, const Quantized& b, cuda::Fp8Scales b_scales, void* c,
                 DType c_type, float beta, int64_t M, int64_t N, int64_t K, Stream& s,
                 const void* bias = nullptr, DType bias_type = DType::kF32,
                 const void* residual = nullptr) {
  if (use_gtron_gemm(c_type, M, N, K)) {
    cuda::Fp8GemmArgs f;
    f.a = a.q();
    f.scale_a = a.sc();
    f.b = b.q();
    f.scale_b = b.sc();
    f.b_blocks = b_scales == cuda::Fp8Scales::kBlocks;
    f.d = c;
    f.d_type = c_type;
    f.beta = beta;
    f.m = M;
    f.n = N;
    f.k = K;
    if (residual != nullptr) {
      f.c = residual;
      f.beta = 1.0f;
    }
    cuda::fp8_block_gemm(f, s.native());
    if (bias != nullptr) {
      GTRON_CHECK(c_type == DType::kBF16, "fp8 linear: a bias on a ", dtype_name(c_type),
                  " output");
      cuda::fp8_add_bias(c, bias, bias_type, M, N, s.native());
    }
    return;
  }
  cuda::GemmArgs g;
  g.fp8 = true;
  g.a = a.codes.raw();
  g.scale_a = a.sc();
  g.b = b.codes.raw();
  g.trans_b = true;
  g.scale_b = b.sc();
  g.b_scales = b_scales;
  g.c = c;
  g.c_type = c_type;
  g.m = M;
  g.n = N;
  g.k = K;
  g.beta = beta;
  g.bias = bias;
  g.bias_type = bias_type;
  if (residual != nullptr) {
    g.c = const_cast<void*>(residual);  // read only
    g.d = c;
    g.beta = 1.0f;
  }
  if (bias == nullptr) {
    cuda::gemm(g, s.native());
    return;
  }
  // The bias rides in the epilogue where cuBLASLt offers it with block scales (beside a residual
  // too); else the product without it, then a pass over the bf16 output adds it.
  if (cuda::try_gemm(g, s.native())) return;
  g.bias = nullptr;
  cuda::gemm(g, s.native());
  GTRON_CHECK(c_type == DType::kBF16, "fp8 linear: a bias on a ", dtype_name(c_type), " output");
  cuda::fp8_add_bias(c, bias, bias_type, M, N, s.native());
}

std::atomic<bool> g_fused_producers{true};  // false: set_fused_producers_for_testing
std::atomic<int> g_untiled{-1};             // untiled_sizes(); -1: GTRON_FP8_UNTILED not read yet
std::atomic<int64_t> g_inputs_handed_in{0}, g_inputs_quantized{0};  // forward_input_counts()
std::atomic<int64_t> g_grads_handed_in{0}, g_grads_quantized{0};    // backward_grad_counts()

}  // namespace

void set_gemm_kernel(GemmKernel k) { g_gemm_kernel.store(k, std::memory_order_relaxed); }

GemmKernel gemm_kernel() { return g_gemm_kernel.load(std::memory_order_relaxed); }

bool parse_gemm_kernel(const char* name, GemmKernel* out) {
  const std::string n = name;
  if (n == "auto")
    *out = GemmKernel::kAuto;
  else if (n == "gtron")
    *out = GemmKernel::kGtron;
  else if (n == "cublaslt")
    *out = GemmKernel::kCublasLt;
  else
    return false;
  return true;
}

void set_fused_producers_for_testing(bool on) {
  g_fused_producers.store(on, std::memory_order_relaxed);
}

bool fused_producers() { return g_fused_producers.load(std::memory_order_relaxed); }

void set_untiled_sizes_for_testing(bool on) { g_untiled.store(on ? 1 : 0); }

bool untiled_sizes() {
  return env_once(g_untiled, [] { return env_flag("GTRON_FP8_UNTILED", true) ? 1 : 0; }) == 1;
}

ForwardInputCounts forward_input_counts() {
  return ForwardInputCounts{g_inputs_handed_in.load(std::memory_order_relaxed),
                            g_inputs_quantized.load(std::memory_order_relaxed)};
}

ForwardInputCounts backward_grad_counts() {
  return ForwardInputCounts{g_grads_handed_in.load(std::memory_order_relaxed),
                            g_grads_quantized.load(std::memory_order_relaxed)};
}

QuantizedWeight cuda_quantize_weight(const Tensor& w, Stream& s) {
  GTRON_CHECK(w.shape().rank() == 2, "fp8 weight: rank ", w.shape().rank(), "; expected [N, K]");
  const int64_t N = w.shape()[0], K = w.shape()[1];
  QuantizedWeight out;
  out.q = scratch_bytes(N * K, s);
  out.s = scratch_floats(block_scale_floats(N, K), s);
  out.qt = scratch_bytes(N * K, s);
  out.st = scratch_floats(block_scale_floats(K, N), s);
  cuda_requantize_weight(w, out, s);
  return out;
}

void cuda_requantize_weight(const Tensor& w, QuantizedWeight& out, Stream& s) {
  const int64_t N = w.shape()[0], K = w.shape()[1];
  cuda::fp8_quantize_blocks(w.raw(), w.dtype(), N, K, static_cast<uint8_t*>(out.q.raw()),
                            out.s.data<float>(), static_cast<uint8_t*>(out.qt.raw()),
                            out.st.data<float>(), s.native());
}

GradCodes scratch_grad_codes(int64_t R, int64_t C, Stream& s) {
  GradCodes c;
  c.q = scratch_bytes(R * C, s);
  c.s = scratch_floats(row_scale_floats(R, C), s);
  c.qt = scratch_bytes(R * C, s);
  c.st = scratch_floats(row_scale_floats(C, R), s);
  return c;
}

QuantizedRows scratch_rows(int64_t R, int64_t K, Stream& s) {
  return QuantizedRows{scratch_bytes(R * K, s), scratch_floats(row_scale_floats(R, K), s)};
}

void cuda_forward(const Tensor& x, const Tensor& w, const void* bias, DType bias_dtype, Tensor& y,
                  const void* residual, int64_t N, int64_t Cin, int64_t Cout, Stream& s,
                  const QuantizedWeight* wq, const QuantizedRows* xq) {
  GTRON_CHECK(cuda::fp8_gemm_ok(N, Cin, Cout) && (xq != nullptr || x.dtype() == DType::kBF16),
              "fp8 linear: ", N, " rows, Cin ", Cin, ", Cout ", Cout, ", x ",
              x.defined() ? dtype_name(x.dtype()) : "absent");
  Quantized xc;
  if (xq != nullptr) {  // Note [fp8 fused producers]: x's producer wrote them
    GTRON_CHECK(xq->q.nbytes() >= static_cast<size_t>(N * Cin) &&
                    xq->s.numel() >= row_scale_floats(N, Cin) && xq->s.dtype() == DType::kF32,
                "fp8 linear: the input codes handed in are smaller than the [", N, ", ", Cin,
                "] input");
    xc = Quantized{xq->q, xq->s};
    g_inputs_handed_in.fetch_add(1, std::memory_order_relaxed);
  } else {
    xc = scratch(N * Cin, row_scale_floats(N, Cin), s);
    cuda::fp8_quantize_rows(x.raw(), N, Cin, xc.q(), xc.sc(), s.native());
    g_inputs_quantized.fetch_add(1, std::memory_order_relaxed);
  }
  const Quantized wb = wq != nullptr ? Quantized{wq->q, wq->s}
                                     : quantize_weight(w, Cout, Cin, /*transposed=*/false, s);
  fp8_product(xc, wb, cuda::Fp8Scales::kBlocks, y.raw(), DType::kBF16, 0.0f, N, Cout, Cin, s, bias,
              bias_dtype, residual);
}

void cuda_backward(const Tensor& x, const Tensor& w, const Tensor& dy, void* dx, bool dx_overwrite,
                   Tensor* dw, bool dw_overwrite, int64_t N, int64_t Cin, int64_t Cout, Stream& s,
                   const QuantizedWeight* wq, const GradCodes* given, const QuantizedRows* xtq) {
  // dy in tiles along its rows (dgrad) and along its columns, transposed (wgrad): one pass over dy
  // when both are wanted, none when dy's producer made them.
  Quantized dyq, dyt;
  if (given != nullptr) {
    dyq = Quantized{given->q, given->s};
    dyt = Quantized{given->qt, given->st};
  } else if (dx != nullptr) {
    dyq = scratch(N * Cout, row_scale_floats(N, Cout), s);
  }
  if (given == nullptr && dw != nullptr) dyt = scratch(N * Cout, row_scale_floats(Cout, N), s);
  (given != nullptr ? g_grads_handed_in : g_grads_quantized)
      .fetch_add(1, std::memory_order_relaxed);
  if (given != nullptr) {  // made by dy's producer: nothing to quantize
  } else if (dx != nullptr && dw != nullptr && Cout % kTile == 0) {
    cuda::fp8_quantize_rows_cols(dy.raw(), N, Cout, dyq.q(), dyq.sc(), dyt.q(), dyt.sc(),
                                 s.native());
  } else {  // one of the two, or both in two passes (a tail tile along Cout)
    if (dx != nullptr) cuda::fp8_quantize_rows(dy.raw(), N, Cout, dyq.q(), dyq.sc(), s.native());
    if (dw != nullptr) cuda::fp8_quantize_cols(dy.raw(), N, Cout, dyt.q(), dyt.sc(), s.native());
  }
  if (dx != nullptr) {  // dx[N, Cin] = dy[N, Cout]·wᵀᵀ: w's blocks transposed, [Cin, Cout]
    const Quantized wt = wq != nullptr ? Quantized{wq->qt, wq->st}
                                       : quantize_weight(w, Cout, Cin, /*transposed=*/true, s);
    fp8_product(dyq, wt, cuda::Fp8Scales::kBlocks, dx, DType::kBF16, dx_overwrite ? 0.0f : 1.0f, N,
                Cin, Cout, s);
  }
  if (dw != nullptr) {  // dw[Cout, Cin] = dyᵀ[Cout, N]·(xᵀ[Cin, N])ᵀ, both in tiles along N
    Quantized xt;
    if (xtq != nullptr) {  // kept from the forward
      GTRON_CHECK(xtq->q.nbytes() >= static_cast<size_t>(N * Cin) &&
                      xtq->s.numel() >= row_scale_floats(Cin, N) && xtq->s.dtype() == DType::kF32,
                  "fp8 linear: the transposed input codes handed in are smaller than the [", Cin,
                  ", ", N, "] matrix");
      xt = Quantized{xtq->q, xtq->s};
    } else {
      xt = scratch(N * Cin, row_scale_floats(Cin, N), s);
      cuda::fp8_quantize_cols(x.raw(), N, Cin, xt.q(), xt.sc(), s.native());
    }
    fp8_product(dyt, xt, cuda::Fp8Scales::kRows, dw->raw(), dw->dtype(), dw_overwrite ? 0.0f : 1.0f,
                Cout, Cin, N, s);
  }
}

}  // namespace fp8

}  // namespace gtron

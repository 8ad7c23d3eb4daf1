// FP8 (e4m3) block-scaled quantization and the FP8 linear (train.precision = "fp8").
//
// Note [fp8 recipe]
// The recipe DeepSeek-V3 reports for its FP8 training, as cuBLASLt runs it on Hopper:
// - Activations and output gradients are cut into 1x128 tiles along the reduction dimension of the
//   GEMM that reads them; weights into 128x128 blocks. Each tile/block has one fp32 scale s, and
//   holds e4m3 codes q with value = decode(q) · s.
// - s is a power of two: the smallest 2^e with amax / 2^e <= 448 (e4m3's largest finite value),
//   e clamped to [-126, 127] (1 for a block of zeros). Dividing by a power of two is exact, so
//   the only rounding is e4m3's own (to nearest even, saturating at ±448), the CPU and CUDA
//   quantizers agree bit for bit, and dequantization is exact. It costs at most one bit of the
//   e4m3 range against amax / 448 scales (the largest code is in (224, 448]).
// - A GEMM multiplies e4m3 codes on the tensor cores and applies the two scales of each 128-long
//   stretch of the reduction to its fp32 partial sum (cuBLASLt's VEC128_32F / BLK128x128_32F
//   modes; 1x128 by 1x128 or 1x128 by 128x128, never 128x128 by 128x128).
// - The three GEMMs of a linear y = x·wᵀ (x: [M, K], w: [N, K], dy: [M, N]):
//     forward  y  = x·wᵀ      x in 1x128 tiles along K, w in 128x128 blocks
//     dgrad    dx = dy·w      dy in 1x128 tiles along N, w's blocks transposed (the same blocks
//                             and scales: a 128x128 block quantizes the same either way round)
//     wgrad    dw = dyᵀ·x     dyᵀ and xᵀ in 1x128 tiles along M (the tokens)
//   The backward is straight-through: gradients flow as if quantization were the identity; only
//   the products' operands are quantized. Bias gradients and residuals read dy unquantized.
//
// Note [fp8 layouts]
// Codes are row-major like the matrix they encode. Scales, as cuBLASLt wants them:
// - rows (1x128 along the row, for a [R, K] matrix): s[(k / 128) · R + r], i.e. [ceil(K/128), R]
//   with the rows innermost. R % 4 == 0 on CUDA (cuBLASLt's 16-byte scale rows).
// - blocks (128x128, for a [N, K] matrix): s[(n / 128) · ld + k / 128] with
//   ld = block_scale_ld(K) = ceil(K/128) rounded up to a multiple of 4 (the padding is unread).
// A tail tile or block shorter than 128 takes the scale of its own elements.
#pragma once

#include <cstdint>

#include "model/stream.h"
#include "model/tensor.h"

namespace gtron {

struct GradCodes;  // model/autograd.h

namespace fp8 {

constexpr int64_t kTile = 128;
constexpr float kE4M3Max = 448.0f;

// e4m3 code of x (OCP E4M3FN: no infinities, S.1111.111 is NaN): rounds to nearest even,
// saturates finite and infinite values beyond ±448 to ±448; NaN gives 0x7f (with x's sign).
uint8_t encode_e4m3(float x);
float decode_e4m3(uint8_t q);
// The power-of-two exponent of the scale of a tile whose largest magnitude is amax
// (Note [fp8 recipe]); 0 for amax = 0. REQUIRES: amax >= 0 and finite.
int scale_exponent(float amax);

inline int64_t tiles(int64_t n) { return (n + kTile - 1) / kTile; }
// Leading dimension of a [N, K] matrix's 128x128 block scales.
inline int64_t block_scale_ld(int64_t K) { return (tiles(K) + 3) / 4 * 4; }
// Floats of scales for a [R, K] matrix in rows / blocks layout.
inline int64_t row_scale_floats(int64_t R, int64_t K) { return tiles(K) * R; }
inline int64_t block_scale_floats(int64_t N, int64_t K) { return tiles(N) * block_scale_ld(K); }

// The CPU reference quantizers (Note [fp8 layouts]). A non-finite input makes its tile's scale
// NaN (so are its dequantized values): a NaN or inf never hides behind saturation.
void quantize_rows(const float* x, int64_t R, int64_t K, uint8_t* q, float* s);
void quantize_blocks(const float* w, int64_t N, int64_t K, uint8_t* q, float* s);
void dequantize_rows(const uint8_t* q, const float* s, int64_t R, int64_t K, float* x);
void dequantize_blocks(const uint8_t* q, const float* s, int64_t N, int64_t K, float* w);
// x replaced by dequantize(quantize(x)), rows or blocks (the CPU emulation's operands).
void round_trip_rows(float* x, int64_t R, int64_t K);
void round_trip_blocks(float* w, int64_t N, int64_t K);

// Test hook: with false, the FP8 linear's quantizers are the identity on the CPU (an f64
// gradcheck of its straight-through backward). Process-wide; true unless a test says otherwise.
void set_quantize_for_testing(bool on);
bool quantize_enabled();

// The CPU emulation of linear(..., fp8 = true) (model/ops/linear.h): the products of
// Note [fp8 recipe] on quantized-then-dequantized copies of their operands, computed in T (f32 or
// f64). Same contracts as cpu::linear_forward / cpu::linear_backward (the backward accumulates;
// db, the bias gradient, reads dy unquantized).
template <typename T>
void emulate_forward(const T* x, const T* w, const T* b, T* y, int64_t N, int64_t Cin,
                     int64_t Cout);
template <typename T>
void emulate_backward(const T* x, const T* w, const T* dy, T* dx, T* dw, T* db, int64_t N,
                      int64_t Cin, int64_t Cout);

// Note [fp8 weights once a step]
// A weight's codes depend on its master alone, so they change only when the optimizer steps: yet
// a linear that quantized its weight at every use would do it twice a micro-batch (the forward's
// w, the backward's wᵀ), and again in a full-recompute forward. Bf16Weights (model/
// mixed_precision.h) keeps a QuantizedWeight beside the bf16 shadow of each FP8 weight it is asked
// for (WeightAccess::fp8_weight), quantized from the fp32 master in one pass that writes both
// orientations, at its first use after a step (or prepare(), before a graph replays over it), and
// the linear reads it. The codes then come from the fp32 master, as on the CPU (no bf16 rounding
// first). A linear with no QuantizedWeight (GTP's gathered weights, tensor-parallel parts, tests)
// quantizes w itself, from its bf16 value.
// Note [fp8 weights without shadows]
// Where a linear's products run in FP8 with its weight's codes, nothing reads a bf16 copy of the
// weight: the forward and the data gradient read the codes, the weight gradient goes to the fp32
// main_grad. So Bf16Weights::use_fp8 hands the linear the fp32 master as the use's value and makes
// no shadow for it: 2 bytes a parameter less than the bf16 path's shadows, beside the codes' 2
// (both orientations), and no cast kernel and no optimizer store of a shadow for these weights.
// linear() accepts such a weight (any dtype) only together with its codes.
struct QuantizedWeight {
  Tensor q, s;    // codes [N, K] (as the u8 bytes of a tensor), blocks-layout scales
  Tensor qt, st;  // the transposed codes [K, N], blocks-layout scales of the [K, N] matrix
};

// Note [fp8 fused producers]
// The forward product reads its input x as 1x128 tiles along K. Quantized by the linear, that is
// one more pass over x: read N·K bf16, write N·K codes and their scales, after the kernel that
// wrote x. Where x comes straight from a row-wise kernel (llama's attn_norm and mlp_norm, GPT-2's
// ln_1 and ln_2, SwiGLU, GELU, the concatenation of an MTP depth's two norms), that kernel already
// holds each value as it stores it, so it writes the codes and scales too, in the same pass: the
// linear's read of x (2·N·K bytes) and its launch are gone. The producer quantizes the value it
// stores (rounded to bf16), through the same tile arithmetic (fp8_tile.cuh), so its codes and
// scales equal fp8_quantize_rows of its output bit for bit, and the losses and gradients do not
// depend on which path made them (tests/model/fp8_fused_cuda_test.cc). The codes (QuantizedRows)
// are scratch on the stream that lives from the producer to the linear's forward product (Note [fp8
// scratch] in fp8.cc); the bf16 output is still written and kept, for the backward (the wgrad
// quantizes x along the tokens from it, and recomputation re-forms it: the recomputed producer
// writes the same codes). The blocks ask for the codes (LinearLayer::wants_fp8_codes) only where
// the linear will read them: FP8 on CUDA, not split over TP (a split's seams sit between the two),
// sizes for which cuda::fp8_gemm_ok holds; set_fused_producers_for_testing(false) turns the fusion
// off for the process, for tests that compare the two paths. A producer kernel tiles its rows when
// each lane holds 16-byte packs (bf16, K % 128 == 0, aligned); otherwise it writes bf16 and then
// runs fp8_quantize_rows, the same codes.
struct QuantizedRows {
  Tensor q;  // codes of x [R, K] (as the u8 bytes of a tensor)
  Tensor s;  // rows-layout scales [ceil(K/128), R] (Note [fp8 layouts])
};
// Codes and scales of an [R, K] matrix in rows layout, scratch on `s`.
QuantizedRows scratch_rows(int64_t R, int64_t K, Stream& s);

// Whether the blocks hand producer-made codes to their FP8 linears (Note [fp8 fused producers]).
// Process-wide, read when a block's forward is recorded; true unless a test says otherwise.
void set_fused_producers_for_testing(bool on);
bool fused_producers();

// Note [fp8 untiled sizes]
// The recipe is defined for any size: a tail tile (or block) shorter than 128 takes the scale of
// its own elements, and the quantizers and the CPU emulation implement that (Note [fp8 layouts]).
// cuBLASLt's block-scaled products take a reduction or feature size that is not a whole number of
// 128-tiles (GPT-2 1.5B: C = 1600, 3C = 4800): fp8_cuda_test's untiled case matched the CPU
// emulation on an H100 (2026-12-07), and GPT-2 1.5B trained in FP8 at 1.24x torch.compile bf16.
// So cuda::fp8_gemm_ok also holds for rows a multiple of 128 and Cin, Cout multiples of 16 (the
// codes' 16-byte rows), unless GTRON_FP8_UNTILED=0 (an A/B switch: such linears then run the
// bf16 products). Read once, at the first question; set_untiled_sizes_for_testing overrides it.
void set_untiled_sizes_for_testing(bool on);
bool untiled_sizes();
// The forward products cuda_forward has queued since the process started (a graph's products
// count once, at capture): those that read codes handed in by x's producer, and those that
// quantized x themselves. Process-wide, for tests.
struct ForwardInputCounts {
  int64_t handed_in = 0;
  int64_t quantized = 0;
};
ForwardInputCounts forward_input_counts();
// The same for the backward's output gradients (cuda_backward): codes handed in by dy's producer
// (Note [gradient fp8 codes] in model/autograd.h) and dy quantized by the linear.
ForwardInputCounts backward_grad_counts();

// Note [fp8 GEMM choice]
// Which kernel runs the FP8 linear's products on CUDA: gtron's own block-scaled GEMM
// (model/ops/fp8_gemm.h, Note [fp8 block GEMM]) or cuBLASLt's VEC128 / BLK128x128 modes. Both read
// the same codes and scales and sum each 128-long stretch's product into fp32 with its two scales,
// so they agree within the accumulation bound of Note [fp8 accumulation on Hopper]
// (tests/model/fp8_gemm_cuda_test.cc), not bit for bit. The default stays kCublasLt until gtron's
// kernel has passed its GPU tests and been timed (bench_gpu --fp8-gemm picks). kAuto takes gtron's
// kernel where the device runs it (compute capability 9.0) and the sizes are whole 128-tiles, else
// cuBLASLt. The first H100 measurement of cuBLASLt's block-scaled products (500-820 TFLOP/s at the
// Llama-3.2-1B shapes, no faster than bf16; docs/measurements.md) is why gtron has its own.
enum class GemmKernel { kAuto, kGtron, kCublasLt };
// Process-wide, read at each product (so a graph captures the kernel chosen when it is recorded).
void set_gemm_kernel(GemmKernel k);
GemmKernel gemm_kernel();
// "auto", "gtron" or "cublaslt" (bench_gpu --fp8-gemm); false for anything else.
bool parse_gemm_kernel(const char* name, GemmKernel* out);

// The CUDA FP8 linear over bf16 activations, scratch from the caching allocator on `s`; the
// contracts of cuda::linear_forward / cuda::linear_backward (model/ops/linear.h) with act = bf16
// and no bias gradient (the caller sums dy's columns). REQUIRES: cuda::fp8_gemm_ok(N, Cin, Cout);
// w (the bf16 shadow) [Cout, Cin]. `wq`: w's codes made beforehand (Note [fp8 weights once a
// step]), or null to quantize w here. `xq`: x's codes made by its producer (Note [fp8 fused
// producers]; at least N·Cin codes and row_scale_floats(N, Cin) scales), or null to quantize x;
// with xq, x is not read and may be undefined.
void cuda_forward(const Tensor& x, const Tensor& w, const void* bias, DType bias_dtype, Tensor& y,
                  const void* residual, int64_t N, int64_t Cin, int64_t Cout, Stream& s,
                  const QuantizedWeight* wq = nullptr, const QuantizedRows* xq = nullptr);
// `dyq`: dy's codes made by its producer (Note [gradient fp8 codes] in model/autograd.h), or null
// to quantize dy here. `xtq`: xᵀ's codes [Cin, N] (rows layout of the [Cin, N] matrix: 1x128 tiles
// along the tokens) kept from the forward (swiglu_linear_fp8), or null to quantize x here; with
// them x is not read.
void cuda_backward(const Tensor& x, const Tensor& w, const Tensor& dy, void* dx, bool dx_overwrite,
                   Tensor* dw, bool dw_overwrite, int64_t N, int64_t Cin, int64_t Cout, Stream& s,
                   const QuantizedWeight* wq = nullptr, const GradCodes* dyq = nullptr,
                   const QuantizedRows* xtq = nullptr);
// Scratch on `s` for the codes of a gradient dy [R, C] (both orientations; R, C multiples of 128).
GradCodes scratch_grad_codes(int64_t R, int64_t C, Stream& s);
// w[N, K] (fp32 or bf16) quantized into a QuantizedWeight allocated on `s` (both orientations).
QuantizedWeight cuda_quantize_weight(const Tensor& w, Stream& s);
// Re-quantizes w into the buffers of `out` (made by cuda_quantize_weight for w's shape).
void cuda_requantize_weight(const Tensor& w, QuantizedWeight& out, Stream& s);

}  // namespace fp8

namespace cuda {
// Whether a linear with these sizes runs its three GEMMs in FP8 on CUDA: every one of rows, Cin,
// Cout a multiple of 128 (the reduction of each GEMM is a whole number of tiles, and every scale
// row is 16-byte aligned), or, under fp8::untiled_sizes() (Note [fp8 untiled sizes]), rows a
// multiple of 128 and Cin, Cout multiples of 16.
bool fp8_gemm_ok(int64_t rows, int64_t Cin, int64_t Cout);

// The CUDA quantizers, from bf16 (the same codes and scales as the CPU reference given the bf16
// values as floats), on `stream` (a cudaStream_t). q: uint8 codes, s: fp32 scales.
// x[R, K] in 1x128 tiles along K (rows layout).
void fp8_quantize_rows(const void* x, int64_t R, int64_t K, uint8_t* q, float* s, void* stream);
// x[R, K] in 1x128 tiles along R, written transposed: qt[K, R] and its rows-layout scales
// st[ceil(R/128), K] (xᵀ quantized as rows). REQUIRES: R % 128 == 0, K % 4 == 0.
void fp8_quantize_cols(const void* x, int64_t R, int64_t K, uint8_t* qt, float* st, void* stream);
// fp8_quantize_rows and fp8_quantize_cols of the same x in one pass over it (an output gradient
// feeds both the dgrad and the wgrad product): the same codes and scales as the two.
// REQUIRES: R % 128 == 0, K % 128 == 0.
void fp8_quantize_rows_cols(const void* x, int64_t R, int64_t K, uint8_t* q, float* s, uint8_t* qt,
                            float* st, void* stream);
// w[N, K] (fp32 or bf16: w_dtype) in 128x128 blocks: q[N, K] with blocks-layout scales s, and the
// transposed codes qt[K, N] with their scales st (blocks layout of the [K, N] matrix).
void fp8_quantize_blocks(const void* w, DType w_dtype, int64_t N, int64_t K, uint8_t* q, float* s,
                         uint8_t* qt, float* st, void* stream);
// y[r, c] += bias[c] for bf16 y[N, C] and a bias [C] in bf16 or f32 (bias_dtype): the FP8
// linear's bias where cuBLASLt offers no block-scaled product with the bias epilogue.
void fp8_add_bias(void* y, const void* bias, DType bias_dtype, int64_t N, int64_t C, void* stream);
// out[N, K] (f32 or bf16: out_dtype) = the values of codes q[N, K] with blocks-layout scales s
// (exact: a code times a power of two; bf16 holds it unless it falls below bf16's subnormals).
void fp8_dequantize_blocks(const uint8_t* q, const float* s, int64_t N, int64_t K, void* out,
                           DType out_dtype, void* stream);
}  // namespace cuda

}  // namespace gtron

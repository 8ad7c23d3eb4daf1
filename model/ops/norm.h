// layernorm (GPT-2, with bias) and rmsnorm (MTP input norms), over the last dim C.
// Statistics are kept in the tensor's own float type on CPU (f32 or f64) and fp32 on GPU.
#pragma once

#include <cstdint>

#include "model/autograd.h"
#include "model/stream.h"

namespace gtron {

namespace fp8 {
struct QuantizedRows;
}  // namespace fp8

constexpr double kLayerNormEps = 1e-5;
constexpr double kRMSNormEps = 1e-6;

// x: [..., C], gamma, beta: [C]. y = (x − mean) / sqrt(var + eps) · gamma + beta (biased var).
// Backward accumulates into dx, dgamma, dbeta.
// With `codes`: y's FP8 codes as well (Note [fp8 fused producers] in model/ops/fp8.h), the rows
// layout fp8_quantize_rows makes of y, written into new scratch on the stream in the same pass
// as y. REQUIRES (codes): x on CUDA in bf16.
Var layernorm(const Var& x, const Var& gamma, const Var& beta, double eps = kLayerNormEps,
              fp8::QuantizedRows* codes = nullptr);

// The CUDA LayerNorm backward of layernorm (and of the ops that contain one) for the output
// gradient dy: accumulates into the gradients of x, gamma and beta (those that want one), from the
// saved row statistics. Where x's producer asked (Note [gradient column partials] in
// model/autograd.h) and the kernel can, it also leaves the column partials of x's finished
// gradient on x.
void layernorm_backward_cuda(const Var& x, const Var& gamma, const Var& beta, const Tensor& mean,
                             const Tensor& rstd, const Tensor& dy, int64_t N, int64_t C, Stream& s);

// x: [..., C], gamma: [C]. y = x / sqrt(mean(x²) + eps) · gamma.
// Backward accumulates into dx, dgamma. `codes`: as layernorm's.
Var rmsnorm(const Var& x, const Var& gamma, double eps = kRMSNormEps,
            fp8::QuantizedRows* codes = nullptr);

namespace cpu {
// N rows of C. Also writes the row statistics the backward reuses: mean[N] and rstd[N]
// (1 / sqrt(var + eps)).
template <typename T>
void layernorm_forward(const T* x, const T* gamma, const T* beta, T* y, T* mean, T* rstd, int64_t N,
                       int64_t C, double eps);
// Any of dx, dgamma, dbeta may be null. Accumulates.
template <typename T>
void layernorm_backward(const T* x, const T* gamma, const T* mean, const T* rstd, const T* dy,
                        T* dx, T* dgamma, T* dbeta, int64_t N, int64_t C);
// Also writes rrms[N] = 1 / sqrt(mean(x²) + eps).
template <typename T>
void rmsnorm_forward(const T* x, const T* gamma, T* y, T* rrms, int64_t N, int64_t C, double eps);
// dx or dgamma may be null. Accumulates.
template <typename T>
void rmsnorm_backward(const T* x, const T* gamma, const T* rrms, const T* dy, T* dx, T* dgamma,
                      int64_t N, int64_t C);
}  // namespace cpu

namespace cuda {
// Whether the norm ops take their fast CUDA kernels (Note [register-resident norm forward],
// Note [staged norm backward]; the same bits as the reference kernels): on. set_norm_fast(false)
// selects the reference kernels for the process, for tests and benchmarks only (they run both
// paths); kernels already captured in a graph keep their choice.
bool norm_fast();
void set_norm_fast(bool on);
// N rows of C, one warp per row. x, y, dy, dx in `act` (f32 or bf16); gamma, beta in `param`
// (act, or f32 with bf16 activations); statistics and parameter gradients in f32. With `q` (act
// bf16): also y's FP8 codes q[N, C] and rows-layout scales qs (what fp8_quantize_rows makes of y;
// Note [fp8 fused producers] in model/ops/fp8.h), in the same pass where the layout allows.
void layernorm_forward(const void* x, const void* gamma, const void* beta, DType param, void* y,
                       float* mean, float* rstd, int64_t N, int64_t C, double eps, DType act,
                       void* stream, uint8_t* q = nullptr, float* qs = nullptr);
// Floats of scratch the backward of layernorm (and of rmsnorm) needs for parameter gradients.
int64_t layernorm_backward_scratch_floats(int64_t N, int64_t C);
int64_t rmsnorm_backward_scratch_floats(int64_t N, int64_t C);
// Accumulates dx (act), dgamma and dbeta (f32); any may be null. dgamma and dbeta are fixed-order
// column sums (model/cuda/column_sum.cuh) through `scratch`. dx_partials: where the one-pass
// staged kernel runs, also the column partials of dx as finished (Note [norm dx partials] in
// model/ops/norm_cuda.cu): layernorm_dx_partial_chunks(N) chunks of C floats at scratch +
// 2·chunks·C. Returns whether they were written.
bool layernorm_backward(const void* x, const void* gamma, DType param, const float* mean,
                        const float* rstd, const void* dy, void* dx, float* dgamma, float* dbeta,
                        float* scratch, int64_t N, int64_t C, DType act, void* stream,
                        bool dx_partials = false);
int64_t layernorm_dx_partial_chunks(int64_t N);
// `q`, `qs`: as layernorm_forward's.
void rmsnorm_forward(const void* x, const void* gamma, DType param, void* y, float* rrms, int64_t N,
                     int64_t C, double eps, DType act, void* stream, uint8_t* q = nullptr,
                     float* qs = nullptr);
// Accumulates dx (act) and dgamma (f32); either may be null.
void rmsnorm_backward(const void* x, const void* gamma, DType param, const float* rrms,
                      const void* dy, void* dx, float* dgamma, float* scratch, int64_t N, int64_t C,
                      DType act, void* stream);
}  // namespace cuda

}  // namespace gtron

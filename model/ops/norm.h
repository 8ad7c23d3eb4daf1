// layernorm (GPT-2, with bias) and rmsnorm (MTP input norms), over the last dim C.
// Statistics are kept in the tensor's own float type on CPU (f32 or f64) and fp32 on GPU.
#pragma once

#include "model/autograd.h"

namespace gtron {

constexpr double kLayerNormEps = 1e-5;
constexpr double kRMSNormEps = 1e-6;

// x: [..., C], gamma, beta: [C]. y = (x − mean) / sqrt(var + eps) · gamma + beta (biased var).
// Backward accumulates into dx, dgamma, dbeta.
Var layernorm(const Var& x, const Var& gamma, const Var& beta, double eps = kLayerNormEps);

// x: [..., C], gamma: [C]. y = x / sqrt(mean(x²) + eps) · gamma.
// Backward accumulates into dx, dgamma.
Var rmsnorm(const Var& x, const Var& gamma, double eps = kRMSNormEps);

}  // namespace gtron

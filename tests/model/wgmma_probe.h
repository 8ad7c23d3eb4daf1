// Test-only probe of model/cuda/wgmma.cuh (tests/model/wgmma_probe.cu).
#pragma once

namespace gtron::cuda {
// a, b: device [64, 64] bf16 row-major. Writes device fp32 [64, 64] row-major results:
// abt = a·bᵀ (both operands from shared memory, K-major), ab = a·b (a from registers, b MN-major),
// ab_alt = a·b with the descriptor's two byte offsets swapped (diagnostics). Synchronizes.
void wgmma_probe(const void* a, const void* b, float* abt, float* ab, float* ab_alt);
}  // namespace gtron::cuda

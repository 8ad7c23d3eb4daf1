// The most row groups one grouped GEMM takes on CUDA (grouped_linear.h), apart from the autograd
// headers so that the sm_90a kernel library (grouped_wgmma_cuda.cu) can include it alone.
#pragma once

namespace gtron::cuda {
constexpr int kMaxGroups = 512;
// Note [grouped launches of 128 groups]
// A launch's group pointers travel by value in its kernel arguments (8 bytes each). CUDA 12.1+
// accepts up to 32 KiB of arguments, but a graph of a Qwen3-MoE-shaped step, whose 72 grouped
// launches each carried a 4.2 KiB table of 512 slots, failed to instantiate ("invalid argument",
// 2026-12-07, H100) while smaller MoE graphs of the same kernels did not; so one launch takes at
// most 128 groups (about 1.1 KiB of arguments, inside the classic 4 KiB), and more groups take
// more launches (grouped_linear_cuda.cu).
constexpr int kGroupsPerLaunch = 128;
}  // namespace gtron::cuda

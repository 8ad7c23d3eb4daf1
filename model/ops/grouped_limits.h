// The most row groups one grouped GEMM takes on CUDA (grouped_linear.h), apart from the autograd
// headers so that the sm_90a kernel library (grouped_wgmma_cuda.cu) can include it alone.
#pragma once

namespace gtron::cuda {
// Their pointers travel by value in the kernel's arguments (8 bytes each; CUDA 12.1+ allows 32 KiB
// of arguments).
constexpr int kMaxGroups = 512;
}  // namespace gtron::cuda

// The sm_90a grouped GEMM (Note [grouped GEMM on wgmma] in grouped_wgmma_cuda.cu), called by
// grouped_linear_cuda.cu's launcher with the arguments it resolved.
#pragma once

namespace gtron::cuda {

namespace grouped {
struct GroupedArgs;
}

// Whether the current device runs the wgmma kernels (compute capability 9.0); asked once a device.
bool grouped_wgmma_usable();
// One launch of product `product` (grouped::Product as int) on the same grid as the mma.sync
// kernel's 128x128 tiles, with `stages` (3 or 4) shared-memory stages, on `stream` (a
// cudaStream_t). REQUIRES: grouped_wgmma_usable(); bf16 operands whose rows are whole, 16-byte
// aligned 16-byte chunks (the mma.sync kernel's condition).
void grouped_wgmma_launch(const grouped::GroupedArgs& a, int product, unsigned grid_x,
                          unsigned grid_y, int stages, void* stream);

}  // namespace gtron::cuda

// Host side of the one-launch column sums (Note [one-launch column finish] in
// model/cuda/column_sum.cuh): the arrival counters each stream's partials kernels share, the
// number of finishing blocks, and the A/B switch back to the two-launch path. No CUDA headers.
#pragma once

#include <cstdint>

namespace gtron::cuda {

// Whether the partials kernels finish their column sums themselves (default) or leave it to a
// second launch, column_tree_finish: the same bits either way. The default is read once from
// GTRON_COLUMN_FINISH ("0": two launches); set_column_finish_fused overrides it (tests, A/B runs).
// Work already captured into a CUDA graph keeps the path it was captured with.
bool column_finish_fused();
void set_column_finish_fused(bool fused);

// 2 · groups counters private to `stream` (a cudaStream_t) on the current device, zero between
// launches: made and zeroed once (the first call for a stream, or when more are needed), then
// reset by the kernel that used them. The buffer lives for the process (graphs keep its address).
unsigned* column_finish_counters(void* stream, int64_t groups);

// Finishing blocks per group for `groups` groups of `group_blocks` partial blocks, each group
// finishing `group_cols` output columns: enough for 32 columns (one pass) a block, at most half the
// device's SMs in all (every waiting finisher holds an SM slot; see the note), at least one.
int column_finishers(int64_t groups, int64_t group_cols, int64_t group_blocks);

}  // namespace gtron::cuda

// Document segments on CUDA (Note [document masking] in model/ops/segments.h): one block per row.
// Thread i takes a contiguous chunk of the row, counts the document starts in it and notes the
// last one; an exclusive scan over the threads (sum of the counts, max of the last starts, in
// shared memory) gives each chunk the segment and start it begins in; the chunk is then walked
// again to write seg and pos. Integer math: the result does not depend on the schedule.
#include "model/cuda/kernel_util.cuh"
#include "model/ops/segments.h"

namespace gtron::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void document_segments_kernel(const int32_t* __restrict__ tokens, int32_t start_id,
                                         int32_t* __restrict__ seg, int32_t* __restrict__ pos,
                                         int T) {
  __shared__ int count[kThreads];
  __shared__ int last[kThreads];
  const int64_t row = static_cast<int64_t>(blockIdx.x) * T;
  const int chunk = (T + kThreads - 1) / kThreads;
  const int c0 = min(T, threadIdx.x * chunk), c1 = min(T, c0 + chunk);
  int n = 0, first = 0;  // starts in the chunk, and the last of them (0: none)
  for (int t = c0; t < c1; ++t) {
    if (t > 0 && tokens[row + t] == start_id) {
      ++n;
      first = t;
    }
  }
  count[threadIdx.x] = n;
  last[threadIdx.x] = first;
  __syncthreads();
  // Inclusive scan (Hillis–Steele): sums of counts, maxima of the last starts.
  for (int off = 1; off < kThreads; off <<= 1) {
    const int i = threadIdx.x;
    const int add = i >= off ? count[i - off] : 0;
    const int mx = i >= off ? last[i - off] : 0;
    __syncthreads();
    count[i] += add;
    last[i] = max(last[i], mx);
    __syncthreads();
  }
  int s = threadIdx.x > 0 ? count[threadIdx.x - 1] : 0;
  first = threadIdx.x > 0 ? last[threadIdx.x - 1] : 0;
  for (int t = c0; t < c1; ++t) {
    if (t > 0 && tokens[row + t] == start_id) {
      ++s;
      first = t;
    }
    seg[row + t] = s;
    if (pos != nullptr) pos[row + t] = t - first;
  }
}

}  // namespace

void document_segments(const int32_t* tokens, int32_t start_id, int32_t* seg, int32_t* pos,
                       int64_t B, int64_t T, void* stream) {
  GTRON_CHECK(T < (int64_t{1} << 30) && B < (int64_t{1} << 31), "document_segments: [", B, ", ", T,
              "] too large");
  if (B * T == 0) return;
  document_segments_kernel<<<static_cast<unsigned>(B), kThreads, 0,
                             static_cast<cudaStream_t>(stream)>>>(tokens, start_id, seg, pos,
                                                                  static_cast<int>(T));
  CUDA_CHECK_LAUNCH();
}

}  // namespace gtron::cuda

// The CUDA graph calls graphs/graph.cc needs, behind plain pointers (no CUDA headers here).
#pragma once

#include <cstddef>

namespace gtron::graphs::cuda {

// Starts capturing `stream` (a cudaStream_t) in relaxed mode: the allocator may cudaMalloc a new
// segment of the graph's private pool during the capture.
void begin_capture(void* stream);
// Ends the capture and instantiates it: returns the cudaGraphExec_t and sets `nodes` (after the
// pass below) and `folded` (the memset nodes it replaced).
//
// Note [small memsets as kernels]
// cuBLASLt zeroes a 4-byte word of its workspace before most of its Hopper GEMM kernels, with a
// cudaMemsetAsync that a capture records as a memset node: about 110 of them in a GPT-2 124M
// step. Between kernel nodes a memset node is slow to enter and to leave: on the H200 a kernel,
// memset, kernel sequence spent about 5 µs around the 0.8 µs memset, against well under 1 µs
// between two kernels. So before instantiating, every memset node of at most 4 KiB is replaced
// by a one-block kernel node that stores the same bytes (value, element size, width, height and
// pitch), with the same incoming and outgoing edges: the same writes, ordered the same way.
// Larger memsets stay (the copy engines fill them at full bandwidth).
// GTRON_GRAPH_MEMSET_KERNELS=1 turns the pass on. It is off by default until its effect on the
// step has been measured: it was written in a session whose GPU machine was withdrawn before it
// could run (the timings above are from a kernel trace of the step without it).
void* end_capture(void* stream, size_t* nodes, size_t* folded);
// Ends a capture that failed (an exception left the captured region); discards what it holds.
void abort_capture(void* stream);
void launch(void* exec, void* stream);
void destroy(void* exec);

}  // namespace gtron::graphs::cuda

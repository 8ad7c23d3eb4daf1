// The CUDA graph calls graphs/graph.cc needs, behind plain pointers (no CUDA headers here).
#pragma once

#include <cstddef>

namespace gtron::graphs::cuda {

// Starts capturing `stream` (a cudaStream_t) in relaxed mode: the allocator may cudaMalloc a new
// segment of the graph's private pool during the capture.
void begin_capture(void* stream);
// Ends the capture and instantiates it: returns the graph's handle for launch() and destroy(),
// and sets `nodes` (after the passes below), `folded` (small memset nodes turned into kernel
// nodes) and `hoisted` (those moved to the start of the graph).
//
// Note [small memsets as kernels]
// cuBLASLt zeroes a 4-byte word of its workspace before most of its Hopper GEMM kernels, with a
// cudaMemsetAsync that a capture records as a memset node: about 110 of them in a GPT-2 124M
// step. Between kernel nodes a memset node is slow to enter and to leave: on the H200 a kernel,
// memset, kernel sequence spent about 5 µs around the 0.8 µs memset, against about 0.4 µs
// between two kernels. What the capture does with memset nodes of at most 4 KiB before it
// instantiates the graph is cuda::capture_memsets_mode() (model/cuda/gemm.h): kHoist, with kKeep
// and kKernels the references tests check it against (cuda::set_capture_memsets_for_testing):
// - kKeep: nothing;
// - kKernels: each becomes a one-block kernel node that stores the same bytes (value, element
//   size, width, height, pitch) with the same incoming and outgoing edges: the same writes,
//   ordered the same way;
// - kHoist: GEMMs issued into the capture get workspaces of their own (Note [private capture
//   workspaces] in model/cuda/gemm.h), so a memset that is the only one inside such a workspace
//   belongs to that GEMM alone: it leaves the graph (its predecessors joined to its successors)
//   and one kernel node ahead of every root writes all such bytes at the start of each replay;
//   the other small memsets become kernel nodes as under kKernels.
// Larger memsets stay (the copy engines fill them at full bandwidth). On the H200 (bench_gpu,
// GPT-2 124M, graphs full, two rounds in one command, ms a step, measured when the three were an
// A/B switch): keep 29.21 / 29.13, kernels 29.10 / 29.25, hoist 28.96 / 29.03 at D=0; keep
// 38.33 / 38.45, kernels 38.06 / 38.24, hoist 38.26 / 38.30 at D=1. Under hoist the step's trace
// shows 4 memsets left (of 113) and 0.04 ms idle (of 0.49): every small memset of the step hit
// one word, the shared workspace's first.
// GTRON_CAPTURE_MEMSETS=keep|kernels|all|hoist picks the mode for the process (a diagnostic: a
// failed instantiation's error suggests keep, to tell a fault of these passes from one of the
// capture); kAll makes every memset node a kernel, the large ones a grid-wide fill in 16-byte words
// where the rows allow (a diagnostic too: it tells a memset node's fault from its memory's).
// GTRON_GRAPH_MEMSET_REPORT=1 prints one `graph-memsets {...}` line to stderr per capture, before
// the passes: the memset nodes, the sizes of the small ones and the addresses they write (one
// address before every GEMM is a shared workspace word).
void* end_capture(void* stream, size_t* nodes, size_t* folded, size_t* hoisted);
// Ends a capture that failed (an exception left the captured region); discards what it holds.
void abort_capture(void* stream);
void launch(void* exec, void* stream);
void destroy(void* exec);

}  // namespace gtron::graphs::cuda

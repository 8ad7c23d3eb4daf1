// The CUDA graph calls graphs/graph.cc needs, behind plain pointers (no CUDA headers here).
#pragma once

#include <cstddef>

namespace gtron::graphs::cuda {

// Starts capturing `stream` (a cudaStream_t) in relaxed mode: the allocator may cudaMalloc a new
// segment of the graph's private pool during the capture.
void begin_capture(void* stream);
// Ends the capture and instantiates it: returns the cudaGraphExec_t and sets `nodes`.
void* end_capture(void* stream, size_t* nodes);
// Ends a capture that failed (an exception left the captured region); discards what it holds.
void abort_capture(void* stream);
void launch(void* exec, void* stream);
void destroy(void* exec);

}  // namespace gtron::graphs::cuda

#include "graphs/cuda_graph.h"
#include "model/cuda/check.h"

namespace gtron::graphs::cuda {

void begin_capture(void* stream) {
  CUDA_CHECK(
      cudaStreamBeginCapture(static_cast<cudaStream_t>(stream), cudaStreamCaptureModeRelaxed));
}

void* end_capture(void* stream, size_t* nodes) {
  cudaGraph_t graph = nullptr;
  CUDA_CHECK(cudaStreamEndCapture(static_cast<cudaStream_t>(stream), &graph));
  CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, nodes));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);  // the exec keeps what it needs
  CUDA_CHECK(err);
  return exec;
}

void abort_capture(void* stream) {
  cudaGraph_t graph = nullptr;
  if (cudaStreamEndCapture(static_cast<cudaStream_t>(stream), &graph) == cudaSuccess && graph) {
    cudaGraphDestroy(graph);
  }
  cudaGetLastError();  // the capture's error was reported by whoever threw
}

void launch(void* exec, void* stream) {
  CUDA_CHECK(
      cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec), static_cast<cudaStream_t>(stream)));
}

void destroy(void* exec) { cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec)); }

}  // namespace gtron::graphs::cuda

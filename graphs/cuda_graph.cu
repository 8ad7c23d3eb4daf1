#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "graphs/cuda_graph.h"
#include "model/cuda/check.h"

namespace gtron::graphs::cuda {

namespace {

// Writes what a memset node of at most kFoldBytes would (Note [small memsets as kernels]).
__global__ void small_fill_kernel(unsigned char* dst, size_t pitch, unsigned value, unsigned elem,
                                  size_t width, size_t height) {
  const size_t n = width * height;
  for (size_t i = threadIdx.x; i < n; i += blockDim.x) {
    unsigned char* p = dst + (i / width) * pitch + (i % width) * elem;
    if (elem == 4) {
      *reinterpret_cast<uint32_t*>(p) = value;
    } else if (elem == 2) {
      *reinterpret_cast<uint16_t*>(p) = static_cast<uint16_t>(value);
    } else {
      *p = static_cast<unsigned char>(value);
    }
  }
}

constexpr size_t kFoldBytes = 4096;

// Read at each capture (captures are rare): off unless GTRON_GRAPH_MEMSET_KERNELS=1.
bool fold_on() {
  const char* e = std::getenv("GTRON_GRAPH_MEMSET_KERNELS");
  return e != nullptr && std::strcmp(e, "1") == 0;
}

// One node's edges (peers and their edge data), in or out.
struct Edges {
  std::vector<cudaGraphNode_t> nodes;
  std::vector<cudaGraphEdgeData> data;
};

// A node's incoming (cudaGraphNodeGetDependencies) or outgoing (cudaGraphNodeGetDependentNodes)
// edges: the two queries take the same arguments.
using EdgeQuery = cudaError_t (*)(cudaGraphNode_t, cudaGraphNode_t*, cudaGraphEdgeData*, size_t*);

Edges edges(cudaGraphNode_t node, EdgeQuery query) {
  Edges e;
  size_t n = 0;
  CUDA_CHECK(query(node, nullptr, nullptr, &n));
  e.nodes.resize(n);
  e.data.resize(n);
  if (n > 0) CUDA_CHECK(query(node, e.nodes.data(), e.data.data(), &n));
  return e;
}

// Note [small memsets as kernels]: replaces each memset node of at most kFoldBytes with a
// one-block kernel node that writes the same bytes, with the same edges. Returns how many.
size_t fold_small_memsets(cudaGraph_t graph) {
  size_t n = 0;
  CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  if (n > 0) CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &n));
  size_t folded = 0;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type;
    CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    if (type != cudaGraphNodeTypeMemset) continue;
    cudaMemsetParams m;
    CUDA_CHECK(cudaGraphMemsetNodeGetParams(node, &m));
    if (m.width * m.height * m.elementSize > kFoldBytes) continue;
    const Edges in = edges(node, cudaGraphNodeGetDependencies);
    const Edges out = edges(node, cudaGraphNodeGetDependentNodes);
    unsigned char* dst = static_cast<unsigned char*>(m.dst);
    size_t pitch = m.height > 1 ? m.pitch : m.width * m.elementSize;
    void* args[] = {&dst, &pitch, &m.value, &m.elementSize, &m.width, &m.height};
    cudaKernelNodeParams k{};
    k.func = reinterpret_cast<void*>(&small_fill_kernel);
    k.gridDim = dim3(1);
    k.blockDim = dim3(128);
    k.kernelParams = args;
    cudaGraphNode_t fill = nullptr;
    CUDA_CHECK(cudaGraphAddKernelNode(&fill, graph, nullptr, 0, &k));
    for (size_t i = 0; i < in.nodes.size(); ++i) {
      CUDA_CHECK(cudaGraphAddDependencies(graph, &in.nodes[i], &fill, &in.data[i], 1));
    }
    for (size_t i = 0; i < out.nodes.size(); ++i) {
      CUDA_CHECK(cudaGraphAddDependencies(graph, &fill, &out.nodes[i], &out.data[i], 1));
    }
    CUDA_CHECK(cudaGraphDestroyNode(node));  // and its edges
    ++folded;
  }
  return folded;
}

}  // namespace

void begin_capture(void* stream) {
  CUDA_CHECK(
      cudaStreamBeginCapture(static_cast<cudaStream_t>(stream), cudaStreamCaptureModeRelaxed));
}

void* end_capture(void* stream, size_t* nodes, size_t* folded) {
  cudaGraph_t graph = nullptr;
  CUDA_CHECK(cudaStreamEndCapture(static_cast<cudaStream_t>(stream), &graph));
  try {
    *folded = fold_on() ? fold_small_memsets(graph) : 0;
    CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, nodes));
  } catch (...) {
    cudaGraphDestroy(graph);
    throw;
  }
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
